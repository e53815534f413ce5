//! Typed `fn:` probes: parameters by name and type from the kernel's BTF,
//! strings and structure fields through pointers, checked against what
//! the kernel is known to pass, against a capture of the same memory, and
//! on the demo OS (no BTF) with numbered arguments.

mod common;

use std::path::Path;

use common::*;

/// One fire: its step, probe, and typed values (name, value as text).
type Fire = (u64, String, Vec<(String, String)>);

/// `vtrace analyze probes --fires --json` of `disk`.
fn fires(disk: &Path) -> Vec<Fire> {
    probe_fires(disk)
        .iter()
        .map(|f| {
            let values = f["values"]
                .as_array()
                .map(|vs| {
                    vs.iter()
                        .map(|p| {
                            (
                                p[0].as_str().unwrap().to_string(),
                                p[1].as_str().unwrap().to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            (
                f["step"].as_u64().unwrap(),
                f["probe"].as_str().unwrap().to_string(),
                values,
            )
        })
        .collect()
}

/// Text as a probe value shows it: quoted, with C's escapes.
fn quoted(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            c => out.push_str(&format!("\\x{:02x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// The texts of `disk`'s captures, as probe values show text.
fn capture_texts(disk: &Path) -> Vec<String> {
    let caps = run(&["analyze", "captures", "--json", disk.to_str().unwrap()]);
    assert!(caps.status.success(), "{}", stderr(&caps));
    let caps: serde_json::Value = serde_json::from_slice(&caps.stdout).unwrap();
    caps["captures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| quoted(c["text"].as_str().unwrap()))
        .collect()
}

fn value<'a>(values: &'a [(String, String)], name: &str) -> &'a str {
    values
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} in {values:?}"))
}

/// The first steps of Linux's `start_kernel`: its first statement is
/// `set_task_stack_end_magic(&init_task)` (the boot task: pid 0, named
/// "swapper", INIT_TASK_COMM), then it prints the banner
/// (`pr_notice("%s", linux_banner)`) and, in setup_arch, `Command line:
/// %s` with the command line the run gave. Names and types come from the
/// kernel's BTF; a capture of the same register reads the same text.
#[test]
fn typed_probes_read_what_linux_passes_by_name_type_and_field() {
    if !kvm_available() {
        return;
    }
    let kernel = test_kernel();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("typed.vtd");
    let out = vtrace()
        .args([
            "run",
            "--no-input",
            "--memory",
            "128M",
            "--exit-after-trace",
        ])
        .args(["--start-at", "start_kernel", "--max-steps", "20000"])
        .args([
            "--probe",
            "fn:set_task_stack_end_magic(tsk->comm, tsk->pid, tsk->parent->comm)",
        ])
        .args(["--probe", "fn:_printk(fmt:string, arg2:string)"])
        .args(["--capture", "_printk:rsi:255:arg2"])
        .arg("--disk")
        .arg(&disk)
        .arg("--kernel")
        .arg(&kernel)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let all = fires(&disk);
    let magic: Vec<_> = all
        .iter()
        .filter(|f| f.1 == "fn:set_task_stack_end_magic")
        .collect();
    assert_eq!(magic.len(), 1, "{all:?}");
    assert_eq!(value(&magic[0].2, "tsk->comm"), "\"swapper\"");
    assert_eq!(value(&magic[0].2, "tsk->pid"), "0");
    // The boot task is its own parent.
    assert_eq!(value(&magic[0].2, "tsk->parent->comm"), "\"swapper\"");

    let printk: Vec<_> = all.iter().filter(|f| f.1 == "fn:_printk").collect();
    let banner = printk
        .iter()
        .find(|f| value(&f.2, "fmt").ends_with("%s\""))
        .unwrap_or_else(|| panic!("no banner: {printk:?}"));
    let info = stdout(&run(&["info", disk.to_str().unwrap()]));
    // The version the bzImage's header gives (`guest: ...: Linux 6.1.0-...`).
    let version = info
        .split("Linux ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or_else(|| panic!("{info}"));
    assert!(
        value(&banner.2, "arg2").starts_with(&format!("\"Linux version {version} ")),
        "{banner:?}"
    );
    let cmdline = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("cmdline: "))
        .unwrap_or_else(|| panic!("{info}"));
    let command_line = printk
        .iter()
        .find(|f| value(&f.2, "fmt").contains("Command line: %s"))
        .unwrap_or_else(|| panic!("no command line: {printk:?}"));
    assert_eq!(value(&command_line.2, "arg2"), format!("\"{cmdline}\""));

    // The capture of rsi at the same place reads the same bytes.
    let texts = capture_texts(&disk);
    let typed: Vec<&str> = printk.iter().map(|f| value(&f.2, "arg2")).collect();
    assert_eq!(texts.len(), typed.len(), "{texts:?} {typed:?}");
    for (t, c) in typed.iter().zip(&texts) {
        // The capture stops at 255 bytes; the typed text at its NUL.
        assert!(
            c.trim_end_matches('"').starts_with(t.trim_end_matches('"')),
            "{t} vs {c}"
        );
    }

    // Per-value counts, and the listing's note beside the fire.
    let table = stdout(&run(&["analyze", "probes", disk.to_str().unwrap()]));
    assert!(table.contains("  tsk->comm: \"swapper\" (1)"), "{table}");
    let listing = stdout(&run(&[
        "analyze",
        "listing",
        disk.to_str().unwrap(),
        "--count",
        "20",
    ]));
    assert!(
        listing.contains("-- values: tsk->comm=\"swapper\" tsk->pid=0"),
        "{listing}"
    );
}

/// Numbered arguments with a type work on the demo OS (no BTF), and a
/// parameter name its DWARF does not know is refused with the names it
/// does; the text equals what a capture of the same register reads.
#[test]
fn numbered_arguments_work_where_the_kernel_has_no_types() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("demo.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--probe",
        "fn:kprintf(arg1:string, arg2:u32)",
        "--capture",
        "kprintf:rdi:64:fmt",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let all = fires(&disk);
    assert!(all.len() >= 5, "{all:?}");
    assert!(
        all.iter()
            .any(|f| value(&f.2, "arg1") == "\"vtrace demo OS\\n\""),
        "the banner kprintf prints first: {all:?}"
    );
    let texts = capture_texts(&disk);
    let typed: Vec<&str> = all.iter().map(|f| value(&f.2, "arg1")).collect();
    assert_eq!(typed, texts);
    // A typed value's histogram, by its name: every fire in a bucket.
    let q = run(&[
        "analyze",
        "probes",
        disk.to_str().unwrap(),
        "--quantize",
        "arg2",
        "--json",
    ]);
    let q: serde_json::Value = serde_json::from_slice(&q.stdout).unwrap();
    let q = &q["probes"][0]["quantize"];
    assert_eq!(q["field"], "arg2");
    let counted: u64 = q["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["count"].as_u64().unwrap())
        .sum();
    assert_eq!(
        (counted, q["without"].as_u64()),
        (all.len() as u64, Some(0)),
        "{q}"
    );

    let named = run(&[
        "run",
        "--no-input",
        "--probe",
        "fn:kprintf(fmt:string)",
        "--disk",
        dir.path().join("no.vtd").to_str().unwrap(),
    ]);
    assert_eq!(named.status.code(), Some(2), "{}", stderr(&named));
    // kernel.h: `void kprintf(const char *f, ...)`.
    assert!(
        stderr(&named).contains("kprintf has no parameter fmt (it has: f)"),
        "{}",
        stderr(&named)
    );
    assert!(
        !dir.path().join("no.vtd").exists(),
        "a refused run leaves no disk"
    );
    let bad = run(&["run", "--no-input", "--probe", "fn:kprintf(arg1:float)"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("no type `float`"), "{}", stderr(&bad));
}

/// The demo OS has no BTF but DWARF (it is built with -g): parameters by
/// name and structure fields through pointers plan from it. tasks.c
/// creates "sieve", "crc32" and "matrix" in that order; every schedule()
/// is entered from an interrupt frame whose vector is the timer's (32) or
/// the yield's (0x80, kernel.h), and `f->rip` is where the interrupted
/// code resumes, an address of the demo's code.
#[test]
fn dwarf_names_parameters_and_fields_where_there_is_no_btf() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("dwarf.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--probe",
        "fn:task_create(name:string, entry)",
        "--probe",
        "fn:schedule(f->vector, f->rip, f->cs)",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let all = fires(&disk);
    let names: Vec<&str> = all
        .iter()
        .filter(|f| f.1 == "fn:task_create")
        .map(|f| value(&f.2, "name"))
        .collect();
    assert_eq!(names, ["\"sieve\"", "\"crc32\"", "\"matrix\""]);
    let schedules: Vec<_> = all.iter().filter(|f| f.1 == "fn:schedule").collect();
    assert!(!schedules.is_empty(), "{all:?}");
    for f in schedules {
        assert!(matches!(value(&f.2, "f->vector"), "32" | "128"), "{f:?}");
        // The kernel's or a task's code segment selector, ring 0 or 3.
        let cs: u64 = value(&f.2, "f->cs").parse().unwrap();
        assert!(cs > 0 && cs < 0x100, "{f:?}");
        let rip: u64 = value(&f.2, "f->rip").parse().unwrap();
        assert!((0x10_0000..0x20_0000).contains(&rip), "{f:?}");
    }
    let bad = run(&[
        "run",
        "--no-input",
        "--probe",
        "fn:schedule(f->nothing)",
        "--disk",
        dir.path().join("no.vtd").to_str().unwrap(),
    ]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("the structure has no field nothing"),
        "{}",
        stderr(&bad)
    );
}

/// `fnret:` fires where a call returns: its return value is RAX after the
/// matching `ret` (as the nest diagram reads it from the recorded
/// registers), and its steps are the distance from the routine's first
/// instruction to that `ret` (the nest diagram's total for the call, and
/// the listing's own step numbers).
#[test]
fn fnret_gives_the_return_value_and_the_steps_of_each_call() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("ret.vtd");
    let d = disk.to_str().unwrap();
    let out = run(&[
        "run",
        "--no-input",
        "--trace",
        "--probe",
        "fnret:kprintf",
        "--probe",
        "fnret:frame_alloc",
        "--disk",
        d,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("fnret: probes fire at each return"));
    let all = fires(&disk);
    assert!(all.len() >= 15, "{all:?}");
    let nest = stdout(&run(&["analyze", "nest", d, "--retval"]));
    let listing = |from: u64| {
        let text = stdout(&run(&[
            "analyze",
            "listing",
            d,
            "--from",
            &from.to_string(),
            "--count",
            "1",
        ]));
        text.lines()
            .find(|l| !l.starts_with('#'))
            .unwrap_or("")
            .to_string()
    };
    for (step, probe, values) in all.iter().take(12) {
        let routine = probe.strip_prefix("fnret:").unwrap();
        let retval: i64 = value(values, "retval").parse().unwrap();
        let steps: u64 = value(values, "steps").parse().unwrap();
        // The step before the fire is the `ret`; `steps` before that
        // ret's step + 1 is the routine's first instruction.
        let ret = listing(step - 1);
        assert!(ret.contains(" ret"), "{ret}");
        let first = listing(step - steps);
        assert!(first.contains(&format!(" {routine} ")), "{first}");
        // The nest diagram's line of that call: its total and return value.
        let line = nest
            .lines()
            .find(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.first()
                    .and_then(|s| s.parse::<u64>().ok())
                    .is_some_and(|s| {
                        (s == step - steps && l.contains(&format!("{routine}();")))
                            || (s == step - 1 && l.contains(&format!("}} /* {routine} =")))
                    })
            })
            .unwrap_or_else(|| {
                panic!("no nest line for the call of {routine} returning at {step}")
            });
        let total: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert_eq!(total, steps, "{line}");
        let shown = line.rsplit("= ").next().unwrap().trim_end_matches(" */");
        let shown = match shown.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).unwrap() as i64,
            None => shown.parse().unwrap(),
        };
        assert_eq!(shown, retval, "{line}");
    }
    let bad = run(&[
        "run",
        "--no-input",
        "--trace",
        "--probe",
        "fnret:kprintf(arg1)",
    ]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("takes no values to fetch"),
        "{}",
        stderr(&bad)
    );
}

/// `fnret:` with tracing off: breakpoints at the routine's entry and at
/// each call's return address. The demo OS runs the same calls either
/// way, so the untraced fires give the traced fires' return values, in
/// the same order, each with the host's time it took instead of steps,
/// and no call's return goes unseen.
#[test]
fn fnret_fires_untraced_through_breakpoints_as_traced() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let probes = ["--probe", "fnret:kprintf", "--probe", "fnret:frame_alloc"];
    let fired = |name: &str, how: &str| {
        let disk = dir.path().join(name);
        let out = run(&[
            &["run", "--no-input", how, "--disk", disk.to_str().unwrap()],
            &probes[..],
        ]
        .concat());
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            !stderr(&out).contains("returned unseen"),
            "{}",
            stderr(&out)
        );
        fires(&disk)
    };
    let traced = fired("traced.vtd", "--trace");
    let untraced = fired("untraced.vtd", "--ignore-guest-tracing");
    assert!(traced.len() >= 15, "{traced:?}");
    let returns = |fires: &[Fire]| -> Vec<(String, String)> {
        fires
            .iter()
            .map(|(_, probe, values)| (probe.clone(), value(values, "retval").to_string()))
            .collect()
    };
    assert_eq!(returns(&untraced), returns(&traced));
    for (_, _, values) in &untraced {
        assert!(
            value(values, "ns").parse::<u64>().unwrap() > 0,
            "{values:?}"
        );
        assert!(!values.iter().any(|(n, _)| n == "steps"), "{values:?}");
    }
}
