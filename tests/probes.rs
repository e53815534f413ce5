//! Probes on the demo OS under this host's KVM: static probes compiled in
//! with guest-kit/include/vtrace-sdt.h (checked against binutils' own
//! reading of their notes and code), enabled at boot and at run time, and
//! fn: probes at a routine's entry; their counts checked against what the
//! demo prints and what its source says.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use vtrace_storage::{Event, Record};

/// One note as `readelf -n` prints it.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Note {
    probe: String,
    location: u64,
    semaphore: u64,
    arguments: String,
}

fn hex(text: &str) -> u64 {
    u64::from_str_radix(text.trim().trim_start_matches("0x"), 16).unwrap()
}

/// The demo's ELF in `dir`, for binutils.
fn demo_elf(dir: &Path) -> std::path::PathBuf {
    write_guest(dir, "demo-os.elf", vtrace_demo::DEMO_OS_ELF)
}

/// The stapsdt notes of `elf` as binutils reads them.
fn readelf_notes(elf: &Path) -> Vec<Note> {
    let out = Command::new("readelf").arg("-n").arg(elf).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut notes = Vec::new();
    for block in text
        .split("NT_STAPSDT (SystemTap probe descriptors)")
        .skip(1)
    {
        let field = |name: &str| {
            let at = block.find(name).unwrap() + name.len();
            block[at..]
                .split([',', '\n'])
                .next()
                .unwrap()
                .trim()
                .to_string()
        };
        notes.push(Note {
            probe: format!("{}:{}", field("Provider:"), field("Name:")),
            location: hex(&field("Location:")),
            semaphore: hex(&field("Semaphore:")),
            arguments: field("Arguments:"),
        });
    }
    notes.sort();
    notes
}

/// Each semaphore's checks as objdump disassembles them: (the check's
/// address, the next instruction's, the one after that), for every
/// instruction that reads a semaphore.
fn semaphore_checks(elf: &Path, semaphores: &[u64]) -> Vec<(u64, u64, u64)> {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(elf)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let address = |line: &str| line.trim().split(':').next().map(hex);
    let mut checks = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let reads = semaphores
            .iter()
            .any(|s| line.contains(&format!("# {s:x} <")));
        if reads {
            checks.push((
                address(line).unwrap(),
                address(lines[i + 1]).unwrap(),
                address(lines[i + 2]).unwrap(),
            ));
            assert!(
                lines[i + 1].contains("jne"),
                "a check is a compare and a branch: {line} / {}",
                lines[i + 1]
            );
        }
    }
    checks
}

/// Runs the demo onto `disk` with `args`; it must succeed. Returns
/// (console, stderr).
fn run_demo(disk: &Path, args: &[&str]) -> (String, String) {
    let mut all = vec!["run", "--no-input", "--disk", disk.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = run(&all);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    (stdout(&out), stderr(&out))
}

/// `vtrace analyze probes --json` as probe → count.
fn probe_counts(disk: &Path) -> BTreeMap<String, u64> {
    let out = run(&["analyze", "probes", "--json", disk.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["problems"], serde_json::json!([]), "{json}");
    json["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["probe"].as_str().unwrap().to_string(),
                p["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The probe fires of a trace: (name, args).
fn fires(disk: &Path) -> Vec<(String, Vec<u64>)> {
    records(disk)
        .into_iter()
        .filter_map(|r| match r {
            Record::Event(Event::Probe { name, args, .. }) => Some((name, args)),
            _ => None,
        })
        .collect()
}

/// `readelf -n` shows the demo's probes in systemtap's format, and `vtrace
/// probes list` lists the same sites, semaphores' probes and argument
/// counts.
#[test]
fn the_demo_elf_carries_stapsdt_notes_that_probes_list_reads() {
    let dir = tempfile::tempdir().unwrap();
    let notes = readelf_notes(&demo_elf(dir.path()));
    let names: Vec<&str> = notes.iter().map(|n| n.probe.as_str()).collect();
    assert_eq!(
        names,
        [
            "fault:page",
            "sched:switch",
            "syscall:entry",
            "syscall:exit",
            "timer:tick"
        ]
    );
    // vtrace-sdt.h: the arguments in the hypercall's registers.
    let switch = &notes[1];
    assert_eq!(switch.arguments, "-8@%rbx -8@%rcx");
    assert!(notes.iter().all(|n| n.semaphore != 0));

    let out = run(&["probes", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed: Vec<(String, u64, Vec<u64>)> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let sites = p["sites"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| hex(s.as_str().unwrap()))
                .collect();
            (
                p["probe"].as_str().unwrap().to_string(),
                p["arguments"].as_u64().unwrap(),
                sites,
            )
        })
        .collect();
    let expected: Vec<(String, u64, Vec<u64>)> = notes
        .iter()
        .map(|n| {
            (
                n.probe.clone(),
                n.arguments.split_whitespace().count() as u64,
                vec![n.location],
            )
        })
        .collect();
    assert_eq!(listed, expected);

    let text = stdout(&run(&["probes", "list"]));
    assert!(text.contains("sched:switch"), "{text}");
    // A pattern that names a probe; one that names none is a value that
    // means nothing for this kernel (status 2), with and without --json.
    let out = run(&["probes", "list", "sched:*"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("sched:switch"), "{}", stdout(&out));
    for json in [&[][..], &["--json"]] {
        let out = run(&[&["probes", "list", "tp:nosuch:x"][..], json].concat());
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("matches tp:nosuch:x"),
            "{}",
            stderr(&out)
        );
    }
}

/// `--probe 'sched:*'` counts every context switch the demo counts, and
/// `--probe fn:schedule` every call of schedule(): by the source, the
/// timer's trap calls it once a tick and a yield trap once a trap. The
/// system-call probes fire once per call (entry) and once per call that
/// returns (exit: the demo's three tasks end with an exit that does not).
/// Untraced: the static probes fire their hypercall, the fn: probe its
/// breakpoint.
#[test]
fn probe_counts_match_what_the_demo_counts() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("p.vtd");
    let (console, log) = run_demo(
        &disk,
        &[
            "--disk-size",
            "8M",
            "--probe",
            "sched:*",
            "--probe",
            "syscall:*",
            "--probe",
            "fn:schedule",
        ],
    );
    let switches = number_after(&console, "context switches:").unwrap();
    let ticks = number_after(&console, "timer ticks:").unwrap();
    let yields = number_after(&console, "yield traps:").unwrap();
    let syscalls = number_after(&console, "system calls:").unwrap();
    assert!(switches > 10 && yields > 0, "{console}");
    let counts = probe_counts(&disk);
    assert_eq!(counts["sched:switch"], switches, "{counts:?}\n{console}");
    assert_eq!(
        counts["fn:schedule"],
        ticks + yields,
        "{counts:?}\n{console}"
    );
    assert_eq!(counts["syscall:entry"], syscalls, "{counts:?}");
    assert_eq!(counts["syscall:exit"], syscalls - 3, "{counts:?}");
    assert!(
        !counts.contains_key("timer:tick"),
        "not enabled: {counts:?}"
    );
    // The summary says the same.
    assert!(
        log.contains(&format!("sched:switch {switches}"))
            && log.contains(&format!("fn:schedule {}", ticks + yields)),
        "{log}"
    );
    // A switch's arguments: the task before and after, which differ, and
    // each switch leaves from the task the one before entered.
    let switches: Vec<Vec<u64>> = fires(&disk)
        .into_iter()
        .filter(|(n, _)| n == "sched:switch")
        .map(|(_, a)| a)
        .collect();
    for pair in switches.windows(2) {
        assert_eq!(pair[0].len(), 2);
        assert_ne!(pair[0][0], pair[0][1]);
        assert_eq!(pair[1][0], pair[0][1], "{switches:?}");
    }
    // fn: probes take the six argument registers: schedule(frame).
    let frames = fires(&disk)
        .into_iter()
        .filter(|(n, _)| n == "fn:schedule")
        .all(|(_, a)| a.len() == 6 && a[0] > 0x100000);
    assert!(frames);
    // quantize: the switches' arg1 (next task: -1 idle, 0, 1, 2).
    let out = run(&[
        "analyze",
        "probes",
        disk.to_str().unwrap(),
        "--quantize",
        "1",
    ]);
    let text = stdout(&out);
    assert!(
        text.contains("------------- Distribution ------------- count"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("-1 |")),
        "{text}"
    );
}

/// Traced from the start with every static probe off, each site the demo
/// runs costs two instructions: the semaphore's compare and a branch not
/// taken, then the code after the site (objdump finds the checks). No probe
/// fires; a fn: probe fires at every step that reaches its routine.
#[test]
fn a_disabled_site_costs_two_instructions() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let elf = demo_elf(dir.path());
    let semaphores: Vec<u64> = readelf_notes(&elf).iter().map(|n| n.semaphore).collect();
    let checks = semaphore_checks(&elf, &semaphores);
    assert!(checks.len() >= semaphores.len(), "{checks:?}");
    let disk = dir.path().join("off.vtd");
    let (console, _) = run_demo(
        &disk,
        &["--trace", "--disk-size", "64M", "--probe", "fn:schedule"],
    );
    let steps: Vec<(usize, u64)> = records(&disk)
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r {
            Record::Step(s) => Some((i, s.pc)),
            _ => None,
        })
        .collect();
    let (mut passed, mut interrupted) = (0, 0);
    for (k, &(_, pc)) in steps.iter().enumerate() {
        let Some(&(_, branch, after)) = checks.iter().find(|c| c.0 == pc) else {
            continue;
        };
        let (Some(&(i1, pc1)), Some(&(i2, pc2))) = (steps.get(k + 1), steps.get(k + 2)) else {
            continue;
        };
        if i1 != steps[k].0 + 1 || i2 != i1 + 1 {
            // An event between: an interrupt came; where it went is not
            // the site's cost.
            interrupted += 1;
            continue;
        }
        assert_eq!((pc1, pc2), (branch, after), "the site at {pc:#x}");
        passed += 1;
    }
    // By the source: a site a tick, one a context switch, one a page
    // fault handled, one a system call's entry and one its return (the
    // three tasks' exits do not return).
    let number = |label: &str| number_after(&console, label).unwrap();
    let ticks = number("timer ticks:");
    let calls = number("system calls:");
    let expected = ticks + number("context switches:") + number("page faults:") + 2 * calls - 3;
    assert_eq!(passed + interrupted, expected, "{console}");
    assert!(interrupted * 10 < passed, "{interrupted} of {passed}");
    let fired = fires(&disk);
    assert!(fired.iter().all(|(n, _)| n == "fn:schedule"), "{fired:?}");
    assert_eq!(
        fired.len() as u64,
        ticks + number("yield traps:"),
        "{console}"
    );
    eprintln!("{passed} disabled sites passed at 2 instructions each");
}

/// `vtrace ctl probe enable` sets a probe's semaphores while the guest
/// runs: from then on every timer tick fires, numbered as the demo counts
/// them, until `vtrace ctl probe disable`; `ctl status` counts them. A
/// pattern that matches nothing is an error.
#[test]
fn probes_are_enabled_and_disabled_at_run_time() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("ctl.vtd");
    let control = dir.path().join("c.sock");
    // Traced, with 100 virtual ns a step: about 25 ticks over seconds.
    let child = vtrace()
        .args(["run", "--no-input", "-q", "--trace", "--clock", "steps:100"])
        .args(["--disk-size", "64M", "--disk"])
        .arg(&disk)
        .arg("--control")
        .arg(&control)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !control.exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "no socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ctl = |args: &[&str]| {
        let mut all = vec!["ctl", "--control", control.to_str().unwrap()];
        all.extend_from_slice(args);
        run(&all)
    };
    let on = ctl(&["probe", "enable", "timer:tick"]);
    assert_eq!(stdout(&on).trim(), "enabled timer:tick", "{}", stderr(&on));
    let none = ctl(&["probe", "enable", "nosuch:*"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(stdout(&none).contains("error: no probe matches 'nosuch:*'"));
    // Wait for three ticks to fire, then disable.
    let count = |status: &str| number_after(status, "timer:tick");
    loop {
        let status = stdout(&ctl(&["status"]));
        if count(&status).is_some_and(|n| n >= 3) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "{status}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let off = ctl(&["probe", "disable", "timer:tick"]);
    assert_eq!(stdout(&off).trim(), "disabled timer:tick");
    let out = child.wait_with_output().unwrap();
    let console = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ticks = number_after(&console, "timer ticks:").unwrap();
    let numbers: Vec<u64> = fires(&disk).into_iter().map(|(_, a)| a[0]).collect();
    assert!(numbers.len() >= 3, "{numbers:?}");
    for pair in numbers.windows(2) {
        assert_eq!(
            pair[1],
            pair[0] + 1,
            "a tick lost while enabled: {numbers:?}"
        );
    }
    assert!(numbers[0] >= 1);
    assert!(
        *numbers.last().unwrap() < ticks,
        "ticks fired after the disable: {numbers:?} of {ticks}"
    );
}

/// Bad probe patterns are refused before the guest boots, saying why.
#[test]
fn bad_probes_are_refused() {
    let cases: &[(&[&str], &str)] = &[
        (&["--probe", "nosuch:*"], "matches no static probe"),
        (&["--probe", "fn:sched*"], "names one routine"),
        (
            &[
                "--probe",
                "fn:schedule",
                "--probe",
                "fn:kmain",
                "--probe",
                "fn:trap",
                "--probe",
                "fn:kprintf",
                "--probe",
                "fn:page_fault",
            ],
            "breakpoints watch 4 more",
        ),
        // The routine named once, after the probe's kind.
        (
            &["--probe", "fn:nosuch"],
            "--probe fn:nosuch: no routine of that name",
        ),
        // Empty places in an argument list are a slip, not "no values".
        (&["--probe", "fn:kprintf(,,,)"], "an empty value"),
        (&["--probe", "fn:kprintf(arg1,)"], "an empty value"),
        // An offset that wraps, an address no instruction can be at.
        (
            &["--trace", "--start-at", "kmain+0xffffffffffffffff"],
            "the offset runs past the end of the address space",
        ),
        (
            &["--trace", "--start-at", "0x8000000000000000"],
            "0x8000000000000000: not a canonical x86-64 address",
        ),
        (&["--probe", "fn:0x800000000000000a"], "not a canonical"),
    ];
    for (args, why) in cases {
        let mut all = vec!["run", "--no-input", "--disk", "/nonexistent/x.vtd"];
        all.extend_from_slice(args);
        let out = run(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(why), "{args:?}: {}", stderr(&out));
    }
}
