//! `vtrace run --cpus N`: a machine of several CPUs, on the demo OS's SMP
//! mode (CPU 0 starts the others with INIT and STARTUP IPIs through its
//! local APIC, they share a queue of work items under a spinlock and
//! report each item with an IPI).

mod common;

use common::*;

/// The primes below each work item's n (200 + 40 i, i < 24), counted here
/// by a sieve, independently of the guest's trial division.
fn expected_primes() -> u64 {
    let limit = 200 + 40 * 23;
    let mut composite = vec![false; limit];
    for k in 2..limit {
        if !composite[k] {
            (k * k..limit).step_by(k).for_each(|m| composite[m] = true);
        }
    }
    let below = |n: usize| (2..n).filter(|&k| !composite[k]).count() as u64;
    (0..24).map(|i| below(200 + 40 * i)).sum()
}

/// The number after `label` on the console line that starts with `line`.
fn number_after(console: &str, line: &str, label: &str) -> Option<u64> {
    let l = console.lines().find(|l| l.starts_with(line))?;
    let rest = &l[l.find(label)? + label.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())?
        .parse()
        .ok()
}

fn smp_demo(cpus: u8) {
    let n = cpus.to_string();
    let out = run(&["run", "--no-input", "--cpus", &n]);
    let (console, log) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{console}\n{log}");
    assert!(log.contains("built-in demo OS (SMP)"), "{log}");
    let ids: Vec<String> = (0..cpus).map(|c| c.to_string()).collect();
    let up = format!("SMP: {cpus} CPUs up (APIC IDs {})", ids.join(" "));
    assert!(console.contains(&up), "every CPU started: {console}");
    assert!(
        console.contains(&format!(
            "SMP: 24 work items, {} primes counted",
            expected_primes()
        )),
        "{console}"
    );
    let mut items = 0;
    for cpu in 0..cpus {
        let line = format!("SMP: CPU {cpu}: ");
        items += number_after(&console, &line, &line).unwrap_or_else(|| panic!("{line} {console}"));
        if cpu > 0 {
            // Each other CPU sleeps until CPU 0's wake IPI.
            let ipis = number_after(&console, &line, "items, ").unwrap();
            assert!(ipis >= 1, "CPU {cpu} took the wake IPI: {console}");
        }
    }
    assert_eq!(items, 24, "every item done once: {console}");
    // The one-CPU demo's tasks ran on CPU 0 as they do alone.
    assert!(
        console.contains("sieve: primes below 10000: 1229 (pid 0)"),
        "{console}"
    );
    assert!(log.contains("demo OS done"), "the LOG hypercall: {log}");
}

#[test]
fn the_smp_demo_starts_two_cpus_and_shares_its_work() {
    if kvm_available() {
        smp_demo(2);
    }
}

#[test]
fn the_smp_demo_starts_four_cpus_and_shares_its_work() {
    if kvm_available() {
        smp_demo(4);
    }
}

#[test]
fn a_cpu_count_out_of_range_is_refused_before_anything_runs() {
    for bad in ["0", "255", "many"] {
        let out = run(&["run", "--no-input", "--cpus", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(stderr(&out).contains("--cpus"), "{}", stderr(&out));
    }
}

#[test]
fn several_cpus_refuse_what_cannot_use_them_yet() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = write_guest(dir.path(), "hello.bin", vtrace_demo::REAL_MODE_HELLO);
    let out = run(&[
        "run",
        "--no-input",
        "--cpus",
        "2",
        "--real-mode",
        image.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "arguments that go not together");
    let log = stderr(&out);
    assert!(
        log.contains("a real-mode image") && log.contains("--cpus 1"),
        "{log}"
    );
    // The demo OS starts 16 CPUs at most: more would never run.
    let too_many = (vtrace_demo::DEMO_OS_MAX_CPUS + 1).to_string();
    let out = run(&["run", "--no-input", "--cpus", &too_many]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let log = stderr(&out);
    assert!(
        log.contains(&format!("--cpus {too_many}")) && log.contains("at most 16 CPUs"),
        "{log}"
    );
}

/// `--trace-function` on two CPUs: each window is the call on the CPU
/// whose breakpoint fired, from the routine's first instruction to its
/// `ret`, and holds that CPU's steps only, though every CPU is stepped
/// while it is open. The IPI handler runs on both: CPU 1 takes the wake
/// IPI first, CPU 0 an IPI for each work item CPU 1 finishes.
#[test]
fn a_function_window_holds_the_calling_cpus_steps_only() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("w.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--cpus",
        "2",
        "--trace-function",
        "smp_interrupt",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{log}");
    let windows = run(&["analyze", "listing", disk.to_str().unwrap()]);
    assert_eq!(windows.status.code(), Some(0), "{}", stderr(&windows));
    // Each window's steps: (CPU, routine+offset, instruction) a line.
    let mut calls: Vec<Vec<(String, String, String)>> = Vec::new();
    for line in stdout(&windows).lines() {
        let text = line.trim_start();
        if text.starts_with("-- trace started by a call of smp_interrupt") {
            calls.push(Vec::new());
            continue;
        }
        let f: Vec<&str> = text.split_whitespace().collect();
        if f.len() > 6 && f[0].parse::<u64>().is_ok() {
            let call = calls.last_mut().expect("a step before any start");
            let instruction = f[6..].join(" ");
            call.push((f[1].into(), f[4].into(), instruction));
        }
    }
    let summary = format!(
        "--trace-function smp_interrupt: {} calls, {} returned",
        calls.len(),
        calls.len()
    );
    assert!(log.contains(&summary), "{summary}: {log}");
    let mut on = std::collections::BTreeSet::new();
    for call in &calls {
        let (cpu, first, _) = &call[0];
        assert_eq!(first, "smp_interrupt", "{call:?}");
        let (_, _, last) = call.last().unwrap();
        assert!(last.starts_with("ret"), "ends at its return: {call:?}");
        // The handler calls nothing: another CPU's step would show as
        // code outside it (or under another CPU number).
        assert!(
            call.iter()
                .all(|(c, at, _)| c == cpu && at.starts_with("smp_interrupt")),
            "only CPU {cpu}'s steps: {call:?}"
        );
        on.insert(cpu.clone());
    }
    assert_eq!(on.len(), 2, "calls on both CPUs: {calls:?}");
    assert_eq!(calls[0][0].0, "1", "the wake IPI's call comes first");

    // Four CPUs each call take_work once (the three woken by the IPI, CPU
    // 0 when its tasks are done): the calls made while another CPU's call
    // was traced are counted, not traced.
    let out = run(&[
        "run",
        "--no-input",
        "--cpus",
        "4",
        "--trace-function",
        "take_work",
        "--disk",
        dir.path().join("w4.vtd").to_str().unwrap(),
    ]);
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{log}");
    let summary = "vtrace: --trace-function take_work: ";
    let line = log
        .lines()
        .find(|l| l.starts_with(summary))
        .unwrap_or_else(|| panic!("no summary: {log}"));
    let count = |after: &str| number_after(&log, summary, after).unwrap_or(0);
    let (traced, returned, elsewhere) = (count(summary), count("calls, "), count("returned, "));
    assert_eq!(traced, returned, "{line}");
    assert!(elsewhere > 0, "{line}");
    assert!(
        line.contains("on other CPUs while a call was traced"),
        "{line}"
    );
    assert_eq!(traced + elsewhere, 4, "{line}");
}

/// The lines of a listing that are steps (they begin with its number).
fn step_lines(listing: &str) -> impl DoubleEndedIterator<Item = &str> {
    listing.lines().filter(|l| {
        l.split_whitespace()
            .next()
            .is_some_and(|n| n.parse::<u64>().is_ok())
    })
}

/// `vtrace info --json` of `disk`.
fn info(disk: &std::path::Path) -> serde_json::Value {
    let out = run(&["info", "--json", disk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Traces the SMP demo on `cpus` CPUs into `disk`, with `extra`
/// options; its `info`, how many times vtrace says two CPUs' steps ran
/// at once, and how many times pairing paused (a busy host).
fn trace_smp_demo(
    cpus: u8,
    disk: &std::path::Path,
    extra: &[&str],
) -> (serde_json::Value, u64, u64) {
    let n = cpus.to_string();
    let mut args = vec!["run", "--no-input", "--cpus", &n, "--trace"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--disk", disk.to_str().unwrap()]);
    let out = run(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let console = stdout(&out);
    assert!(
        console.contains(&format!("SMP: {cpus} CPUs up")),
        "{console}"
    );
    let said = stderr(&out);
    let paired = said
        .split(" step pairs run at once")
        .next()
        .filter(|before| before.len() < said.len())
        .and_then(|before| before.rsplit(' ').next())
        .map_or(0, |n| n.parse().unwrap());
    let paused = said
        .split("(paused ")
        .nth(1)
        .and_then(|after| after.split(' ').next())
        .map_or(0, |n| if n == "once:" { 1 } else { n.parse().unwrap() });
    (info(disk), paired, paused)
}

/// Whether this host runs two of `cpus` CPUs' steps at once: it has a
/// core for each CPU.
fn host_pairs(cpus: u8) -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() >= usize::from(cpus))
}

/// The SMP demo traced twice, two CPUs' steps at once where they may and
/// one CPU at a time (`--serial-steps`): the same trace, every CPU's steps
/// in it, no gap; each CPU's share as `analyze stats --cpu all` tells it.
fn traced_twice(cpus: u8) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.vtd"), dir.path().join("b.vtd"));
    let (first, pairs, paused) = trace_smp_demo(cpus, &a, &[]);
    let (second, serial, _) = trace_smp_demo(cpus, &b, &["--serial-steps"]);
    assert_eq!(first["gaps"], 0, "{first}");
    assert_eq!(
        first["digest"], second["digest"],
        "the step clock fixes the CPUs' order: the same trace twice, with \
         two CPUs' steps run at once ({pairs} times) or not"
    );
    assert_eq!(serial, 0, "--serial-steps steps one CPU at a time");
    if !host_pairs(cpus) {
        assert_eq!(pairs, 0, "fewer cores than CPUs: one CPU at a time");
    } else if paused == 0 {
        // The other CPUs' work loops are register arithmetic and loads:
        // most of their steps run at once with another CPU's.
        let others =
            first["steps"].as_u64().unwrap() - first["steps_by_cpu"]["0"].as_u64().unwrap();
        assert!(
            pairs * 2 > others / 2,
            "{pairs} pairs, {others} steps of CPUs 1.."
        );
    } else {
        // The suite runs two tests at once: pairing pauses where the
        // stepper had no core, judged on windows of 4,096 pairs.
        assert!(pairs >= 4096 * paused, "{pairs} pairs, {paused} pauses");
    }
    let by_cpu = first["steps_by_cpu"].as_object().unwrap();
    assert_eq!(by_cpu.len(), usize::from(cpus), "{first}");
    let mut sum = 0;
    for cpu in 0..cpus {
        let steps = by_cpu[&cpu.to_string()].as_u64().unwrap();
        // CPU 0 boots and runs the tasks; each other CPU at least starts
        // in real mode and takes its share of the work items.
        assert!(steps > 10_000, "CPU {cpu}: {steps} steps");
        sum += steps;
    }
    assert_eq!(sum, first["steps"].as_u64().unwrap());

    let out = run(&[
        "analyze",
        "stats",
        "--cpu",
        "all",
        "--json",
        a.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let shares = stats["cpus"].as_array().unwrap();
    assert_eq!(shares.len(), usize::from(cpus));
    for share in shares {
        let cpu = share["cpu"].as_u64().unwrap().to_string();
        assert_eq!(share["steps"], by_cpu[&cpu], "stats and info agree");
    }
    // CPU 0 waits for each other CPU to come up with PAUSE (smp_init).
    let spins = stats["spinning"].as_array().unwrap();
    assert!(
        spins
            .iter()
            .any(|s| s["cpu"] == 0 && s["routine"].as_str().unwrap().starts_with("smp_init")),
        "{stats}"
    );

    // The listing names each step's CPU; --cpu 1 lists CPU 1's steps only.
    let out = run(&[
        "analyze",
        "listing",
        "--cpu",
        "1",
        "--count",
        "400000",
        a.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listing = stdout(&out);
    let steps: Vec<&str> = listing
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim_start().starts_with("--"))
        .collect();
    assert!(!steps.is_empty(), "{listing}");
    for line in &steps {
        let cpu = line.split_whitespace().nth(1);
        assert_eq!(cpu, Some("1"), "{line}");
    }
    // CPU 1's first instruction is the STARTUP IPI's: real mode at 0x10000.
    assert!(steps[0].contains("0x10000"), "{}", steps[0]);
    // A window of CPU 0's steps alone holds none of CPU 1's, and says so
    // (the first steps are the bootstrap processor's).
    let out = run(&[
        "analyze",
        "listing",
        "--cpu",
        "1",
        "--count",
        "5",
        a.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("steps 0 to 5 of the trace hold no step of CPU 1"),
        "{}",
        stderr(&out)
    );

    // Its export: CPU 1's steps, each with its number in the trace (on
    // four CPUs, where CPU 1's share, as JSON, is the smaller).
    if cpus == 4 {
        export_of_cpu_1(&a, dir.path(), by_cpu, steps[0]);
    } else {
        export_of_every_cpu(&a, dir.path(), by_cpu);
        flame_of_every_cpu(&a, by_cpu);
    }

    // The timeline gives each CPU a Perfetto process of its own.
    let timeline = dir.path().join("t.json");
    let out = run(&[
        "analyze",
        "timeline",
        "-o",
        timeline.to_str().unwrap(),
        a.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&timeline).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let process = |cpu: u8| {
        events
            .iter()
            .find(|e| e["name"] == "process_name" && e["args"]["name"] == format!("CPU {cpu}"))
            .map(|e| e["pid"].clone())
    };
    for cpu in 0..cpus {
        let pid = process(cpu).unwrap_or_else(|| panic!("no process for CPU {cpu}"));
        assert!(
            events.iter().any(|e| e["ph"] == "X" && e["pid"] == pid),
            "CPU {cpu}'s routine calls are on its tracks"
        );
    }

    nest_and_stats_of_every_cpu(&a, cpus);
}

/// Without `--cpu`, the nest diagram of a trace of several CPUs is each
/// CPU's (`--cpu N`'s) in turn, after a `# CPU N` line, and the
/// statistics add up every CPU's: steps, calls, each routine's steps.
fn nest_and_stats_of_every_cpu(trace: &std::path::Path, cpus: u8) {
    let output = |args: &[&str]| {
        let mut all = vec!["analyze"];
        all.extend_from_slice(args);
        all.extend(["-q", trace.to_str().unwrap()]);
        let o = run(&all);
        assert_eq!(o.status.code(), Some(0), "{all:?}: {}", stderr(&o));
        stdout(&o)
    };
    let whole = output(&["nest"]);
    let mut expected = String::new();
    for cpu in 0..cpus {
        let one = output(&["nest", "--cpu", &cpu.to_string()]);
        let mut lines = one.lines();
        // The legend once, at the top.
        let legend: Vec<&str> = lines.by_ref().take(2).collect();
        if cpu == 0 {
            expected.extend(legend.iter().map(|l| format!("{l}\n")));
        }
        expected.push_str(&format!("# CPU {cpu}\n"));
        expected.extend(lines.map(|l| format!("{l}\n")));
    }
    assert_eq!(whole, expected, "each CPU's diagram in turn");
    assert!(whole.contains("ap_main"), "{whole}");
    // The report folds each CPU's part as a level of its own.
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("r.html");
    output(&["report", "-o", html.to_str().unwrap()]);
    let html = std::fs::read_to_string(&html).unwrap();
    let levels = html.matches("class=\"level\" data-kind=\"cpu\"").count();
    assert_eq!(levels, usize::from(cpus));
    for cpu in 0..cpus {
        let level = format!("<summary>CPU {cpu} ");
        assert!(html.contains(&level), "no level for CPU {cpu}");
    }

    let stats = |cpu: Option<u8>| {
        let cpu = cpu.map(|c| c.to_string());
        let mut args = vec!["stats", "--json"];
        args.extend(cpu.iter().flat_map(|c| ["--cpu", c.as_str()]));
        serde_json::from_str::<serde_json::Value>(&output(&args)).unwrap()
    };
    let all = stats(None);
    assert_eq!(all["cpus_added_up"], u64::from(cpus));
    let each: Vec<serde_json::Value> = (0..cpus).map(|c| stats(Some(c))).collect();
    for key in ["steps", "calls", "returns"] {
        let sum: u64 = each.iter().map(|s| s[key].as_u64().unwrap()).sum();
        assert_eq!(all[key], sum, "{key}: every CPU's added up");
    }
    let self_steps = |s: &serde_json::Value| {
        let mut by_name = std::collections::BTreeMap::<String, u64>::new();
        for r in s["routines"].as_array().unwrap() {
            let name = r["name"].as_str().unwrap().to_string();
            *by_name.entry(name).or_default() += r["self_steps"].as_u64().unwrap();
        }
        by_name
    };
    let mut summed = std::collections::BTreeMap::<String, u64>::new();
    for s in &each {
        for (name, steps) in self_steps(s) {
            *summed.entry(name).or_default() += steps;
        }
    }
    assert_eq!(
        self_steps(&all),
        summed,
        "each routine's steps on every CPU"
    );
}

#[test]
fn the_smp_demo_on_two_cpus_traces_the_same_twice() {
    if kvm_available() {
        traced_twice(2);
    }
}

#[test]
fn the_smp_demo_on_four_cpus_traces_the_same_twice() {
    if kvm_available() {
        traced_twice(4);
    }
}

/// A machine of one CPU is the machine every trace so far was taken on:
/// `--cpus 1` is no option at all.
#[test]
fn one_cpu_traces_as_without_the_option() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let digest = |extra: &[&str], name: &str| {
        let disk = dir.path().join(name);
        let mut args = vec!["run", "--no-input", "--quiet", "--max-steps", "300000"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--trace", "--disk", disk.to_str().unwrap()]);
        let out = run(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let i = info(&disk);
        assert!(
            i["metadata"].as_str().is_some_and(|m| !m.contains("cpus:")),
            "{i}"
        );
        assert_eq!(i["events"].get("cpu"), None, "no CPU events: {i}");
        i["digest"].clone()
    };
    assert_eq!(
        digest(&[], "plain.vtd"),
        digest(&["--cpus", "1"], "one.vtd")
    );
}

/// `vtrace ctl start` while every CPU halts, the CPUs running in parallel:
/// in the SMP demo's `smp_park` (the PIC masked, the other CPUs waiting
/// for an IPI) CPU 0's local APIC timer then wakes it once, 5 s after it
/// parked, and it wakes the others once; each runs its handler to its
/// HLT. Before, the turns went on from the CPU whose HLT was served last:
/// CPU 0 took its interrupt there but stayed "halted" for the turns, so
/// once it had sent the IPI it sat out every turn, its handler half done
/// (as Linux's idle CPU did on the VT-x machine). `ctl stop` then ends
/// the run (`--exit-after-trace`) though no CPU will wake again.
#[test]
fn a_trace_started_while_every_cpu_halts_gives_each_woken_cpu_its_turns() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("parked.vtd");
    let sock = dir.path().join("parked.sock");
    let console = dir.path().join("console.txt");
    let mut child = vtrace()
        .args(["run", "--no-input", "--cpus", "2", "--append", "smp_park"])
        .args(["--ignore-guest-tracing", "--exit-after-trace"])
        .args(["--disk-size", "8M", "--disk"])
        .arg(&disk)
        .arg("--control")
        .arg(&sock)
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&console).unwrap())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&console)
        .unwrap_or_default()
        .contains("SMP: parked")
    {
        if started.elapsed().as_secs() > 60 || child.try_wait().ok().flatten().is_some() {
            let _ = child.kill();
            let err = child
                .wait_with_output()
                .map(|o| stderr(&o))
                .unwrap_or_default();
            let console = std::fs::read_to_string(&console).unwrap_or_default();
            panic!("the demo did not park: {console}\n{err}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Time for CPU 0's last HLT to reach the loop (the others halted long
    // before), then a trace with nothing to run.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let ctl = |command: &str| {
        let out = run(&["ctl", "--control", sock.to_str().unwrap(), command]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "ctl {command}: {}",
            stderr(&out)
        );
        stdout(&out)
    };
    ctl("start");
    // The one-shot, then both CPUs' handlers: the steps stop growing.
    let (mut last, mut same) = (0, 0);
    while same < 5 {
        assert!(started.elapsed().as_secs() < 90, "the steps kept growing");
        std::thread::sleep(std::time::Duration::from_millis(200));
        let steps = ctl("status")
            .split(", ")
            .find_map(|s| s.strip_suffix(" steps recorded"))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0u64);
        same = if steps > 0 && steps == last {
            same + 1
        } else {
            0
        };
        last = steps;
    }
    ctl("stop");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let i = info(&disk);
    for cpu in ["0", "1"] {
        assert!(i["steps_by_cpu"][cpu].as_u64() > Some(0), "CPU {cpu}: {i}");
        // Its last step is the HLT it went back to, its handler done.
        let listing = run(&["analyze", "listing", "--cpu", cpu, disk.to_str().unwrap()]);
        let last = step_lines(&stdout(&listing))
            .next_back()
            .map(str::to_owned)
            .unwrap_or_default();
        assert!(last.contains(" hlt "), "CPU {cpu}'s last step: {last}");
    }
}

/// A trigger that fires on an application processor starts tracing on
/// every CPU at once, and the trace says which CPU it fired on.
#[test]
fn a_trigger_on_cpu_1_traces_every_cpu_and_names_where_it_fired() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("ap.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--quiet",
        "--cpus",
        "2",
        "--start-at",
        "ap_main",
        "--max-steps",
        "20000",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let i = info(&disk);
    // Only the APs run ap_main.
    assert_eq!(i["start_cpus"][0], 1, "{i}");
    assert!(
        i["start_reasons"][0]
            .as_str()
            .unwrap()
            .starts_with("address:"),
        "{i}"
    );
    for cpu in ["0", "1"] {
        assert!(i["steps_by_cpu"][cpu].as_u64() > Some(0), "CPU {cpu}: {i}");
    }
    let o = run(&["info", disk.to_str().unwrap()]);
    assert!(stdout(&o).contains("(on CPU 1)"), "{}", stdout(&o));
    // The first step is CPU 1's, at ap_main.
    let o = run(&["analyze", "listing", "--count", "1", disk.to_str().unwrap()]);
    let first = step_lines(&stdout(&o))
        .next()
        .map(str::to_owned)
        .unwrap_or_default();
    let fields: Vec<&str> = first.split_whitespace().collect();
    assert_eq!(fields.get(1), Some(&"1"), "{first}");
    assert!(first.contains("ap_main"), "{first}");
}

/// `analyze export --cpu 1` of `trace`: a row per step of CPU 1, numbered
/// as the listing numbers it (`first_listed`: the listing's first line).
fn export_of_cpu_1(
    trace: &std::path::Path,
    dir: &std::path::Path,
    by_cpu: &serde_json::Map<String, serde_json::Value>,
    first_listed: &str,
) {
    let out_dir = dir.join("export");
    let out = run(&[
        "analyze",
        "export",
        "--cpu",
        "1",
        "--format",
        "jsonl",
        "-o",
        out_dir.to_str().unwrap(),
        trace.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut rows = 0;
    let mut first_step = None;
    for file in std::fs::read_dir(&out_dir).unwrap() {
        let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
        for line in text.lines() {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(row["cpu"], 1, "{row}");
            first_step = first_step.or(row["step"].as_u64());
            rows += 1;
        }
    }
    assert_eq!(Some(rows), by_cpu["1"].as_u64(), "a row per CPU 1 step");
    let listed = first_listed.split_whitespace().next().unwrap().parse().ok();
    assert_eq!(first_step, listed, "the same step numbers as the listing's");
}

/// `analyze export` of a trace of several CPUs without `--cpu`: every
/// CPU's rows, each with its CPU, in one file or in files of one CPU each
/// (named with it), exactly the rows the per-CPU exports give.
fn export_of_every_cpu(
    trace: &std::path::Path,
    dir: &std::path::Path,
    by_cpu: &serde_json::Map<String, serde_json::Value>,
) {
    let export = |out: &std::path::Path, options: &[&str]| {
        let mut args = vec!["analyze", "export", "-q", "-o", out.to_str().unwrap()];
        args.extend(options);
        args.push(trace.to_str().unwrap());
        let o = run(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        format!("'{}'", out.display())
    };
    let all = export(&dir.join("all.parquet"), &[]);
    let files = dir.join("files");
    export(&files, &["--steps-per-file", "300000"]);
    let each = format!(
        "(SELECT * FROM {} UNION ALL SELECT * FROM {})",
        export(&dir.join("cpu0.parquet"), &["--cpu", "0"]),
        export(&dir.join("cpu1.parquet"), &["--cpu", "1"])
    );
    let counts = duckdb(&format!(
        "SELECT cpu, count(*), count(DISTINCT step) FROM {all} GROUP BY cpu ORDER BY cpu"
    ));
    for (cpu, row) in counts.iter().enumerate() {
        let steps = &by_cpu[&cpu.to_string()];
        assert_eq!(
            row,
            &[cpu.into(), steps.clone(), steps.clone()],
            "{counts:?}"
        );
    }
    assert_eq!(counts.len(), by_cpu.len(), "{counts:?}");
    let in_dir = format!("'{}/*.parquet'", files.display());
    // Equal as multisets: as many rows, and none of one missing from the
    // other.
    for (a, b) in [(&all, &each), (&in_dir, &all)] {
        let differ = duckdb(&format!(
            "SELECT (SELECT count(*) FROM {a}) - (SELECT count(*) FROM {b}), count(*) \
             FROM (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b})"
        ));
        assert_eq!(differ, [[0, 0]], "{a} against {b}");
    }
    let by_file = duckdb(&format!(
        "SELECT filename, min(cpu), max(cpu) FROM read_parquet({in_dir}, filename = true) \
         GROUP BY filename"
    ));
    assert!(by_file.len() > by_cpu.len(), "{by_file:?}");
    for row in &by_file {
        let name = row[0].as_str().unwrap();
        assert_eq!(row[1], row[2], "{name} holds one CPU's rows");
        let suffix = format!(".cpu{}.parquet", row[1]);
        assert!(name.ends_with(&suffix), "{name}");
    }
}

/// `analyze flame` of a trace of several CPUs without `--cpu`: every
/// CPU's call stacks added up, each path's steps the sum of its steps on
/// each CPU (`--cpu N`), every step once.
fn flame_of_every_cpu(
    trace: &std::path::Path,
    by_cpu: &serde_json::Map<String, serde_json::Value>,
) {
    let folded = |cpu: Option<&str>| {
        let mut args = vec!["analyze", "flame", "--folded", "-q", "-o", "-"];
        args.extend(cpu.map(|c| ["--cpu", c]).into_iter().flatten());
        args.push(trace.to_str().unwrap());
        let o = run(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        let mut paths = std::collections::BTreeMap::<String, u64>::new();
        for line in stdout(&o).lines() {
            let (path, steps) = line.rsplit_once(' ').expect("PATH STEPS");
            *paths.entry(path.to_string()).or_default() += steps.parse::<u64>().unwrap();
        }
        paths
    };
    let all = folded(None);
    let mut each = folded(Some("0"));
    for (path, steps) in folded(Some("1")) {
        *each.entry(path).or_default() += steps;
    }
    assert_eq!(all, each, "the flame graph of every CPU adds up each CPU's");
    let total: u64 = by_cpu.values().filter_map(|v| v.as_u64()).sum();
    assert_eq!(all.values().sum::<u64>(), total, "every step once");
}

/// `vtrace bench --cpus 2` measures what each traced CPU gets against one
/// CPU alone (a few thousand steps: the figures, not their values, are
/// tested), round after round with `--runs`, what two one-CPU traces at
/// once get against one alone (the host's limit), and how much faster two
/// CPUs do the SMP demo's work untraced.
#[test]
fn bench_compares_a_traced_cpu_of_two_with_one_cpu_alone() {
    if !kvm_available() {
        return;
    }
    let out = run(&[
        "bench",
        "--cpus",
        "2",
        "--max-steps",
        "300000",
        "--runs",
        "2",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["cpus"], 2, "{json}");
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{json}");
    for round in runs {
        let (one, all, each) = (
            round["one_cpu_steps_per_s"].as_f64().unwrap(),
            round["steps_per_s"].as_f64().unwrap(),
            round["per_cpu_steps_per_s"].as_f64().unwrap(),
        );
        assert!(one > 0.0 && all > 0.0, "{json}");
        assert!((each * 2.0 - all).abs() < 1.0, "{json}");
        let ratio = round["per_cpu_ratio"].as_f64().unwrap();
        assert!((ratio - each / one).abs() < 1e-9, "{json}");
        assert_eq!(round["traced_steps"], 300_000, "{json}");
        if host_pairs(2) {
            // Every CPU works from the start: their steps run beside each other.
            assert!(round["step_pairs"].as_u64().unwrap() > 0, "{json}");
        }
    }
    // The top level is the better round's; the median of two, their mean.
    let ratios: Vec<f64> = runs
        .iter()
        .map(|r| r["per_cpu_ratio"].as_f64().unwrap())
        .collect();
    let best = ratios[0].max(ratios[1]);
    assert_eq!(json["per_cpu_ratio"].as_f64(), Some(best), "{json}");
    let median = json["per_cpu_ratio_median"].as_f64().unwrap();
    assert!(
        (median - (ratios[0] + ratios[1]) / 2.0).abs() < 1e-9,
        "{json}"
    );
    // The host's limit: the same work, one CPU a process, two at once.
    let (alone, each) = (
        json["host_limit_alone_steps_per_s"].as_f64().unwrap(),
        json["host_limit_steps_per_s"].as_f64().unwrap(),
    );
    assert!(alone > 0.0 && each > 0.0, "{json}");
    let limit = json["host_limit_ratio"].as_f64().unwrap();
    assert!((limit - each / alone).abs() < 1e-9, "{json}");
    // Untraced, the same work on one CPU and on two, each CPU on a thread.
    let (alone, together) = (
        json["untraced_one_cpu_s"].as_f64().unwrap(),
        json["untraced_s"].as_f64().unwrap(),
    );
    assert!(alone > 0.0 && together > 0.0, "{json}");
    let speedup = json["untraced_speedup"].as_f64().unwrap();
    assert!((speedup - alone / together).abs() < 1e-9, "{json}");
}

/// A SIGINT while `bench --cpus` waits for its processes that measure the
/// host's limit (sent to the benchmark alone, which passes it on to them)
/// ends the benchmark with 128 + SIGINT and no figures past the ones it
/// had, and leaves no temporary files behind, its processes' included.
#[test]
fn bench_stopped_by_sigint_says_so_and_leaves_nothing() {
    use std::io::BufRead;
    if !kvm_available() {
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let mut child = vtrace()
        .args(["bench", "--cpus", "2", "--max-steps", "300000"])
        .env("TMPDIR", temp.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start vtrace");
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            lines.push(line);
        }
        lines
    });
    let reached = rx.iter().any(|line| line.contains("what the host allows"));
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let log = reader.join().unwrap().join("\n");
    assert!(reached, "{log}");
    assert_eq!(out.status.code(), Some(128 + libc::SIGINT), "{log}");
    assert!(
        log.contains("stopped by SIGINT before it was done"),
        "{log}"
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("per-CPU ratio:"),
        "the round's figures: {said}"
    );
    assert!(
        !said.contains("host's limit") && !said.contains("untraced:"),
        "{said}"
    );
    let left: Vec<_> = std::fs::read_dir(temp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
