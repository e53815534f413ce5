//! gdb over a recorded trace (`vtrace analyze gdb`), driven as a user
//! drives it: Debian's gdb in batch mode on a demo OS trace, its answers
//! checked against the trace's own export (registers accumulated from the
//! changes each row records) and the demo's ELF.

mod common;

use std::path::Path;
use std::process::Command;

use common::gdb::{gdb, run_with_gdb, serve};
use common::*;

const REGISTERS: [&str; 17] = [
    "rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13",
    "r14", "r15", "rflags",
];

/// One export row: its step, pc, every register after it, and the
/// addresses and sizes of its stores.
struct Row {
    step: u64,
    pc: u64,
    after: [Option<u64>; 17],
    writes: Vec<(u64, u64)>,
}

/// The demo trace's export rows, made once per test binary.
fn demo_rows() -> &'static [Row] {
    static ROWS: std::sync::OnceLock<Vec<Row>> = std::sync::OnceLock::new();
    ROWS.get_or_init(|| rows(demo_trace()))
}

/// The export's rows, each with the registers after it, accumulated from
/// the changes rows record (a row after a break records all of them).
fn rows(trace: &Path) -> Vec<Row> {
    let mut regs = [None; 17];
    export_rows(trace)
        .into_iter()
        .map(|row| {
            for (i, name) in REGISTERS.iter().enumerate() {
                if let Some(v) = row[*name].as_u64() {
                    regs[i] = Some(v);
                }
            }
            Row {
                step: row["step"].as_u64().unwrap(),
                pc: row["pc"].as_u64().unwrap(),
                after: regs,
                writes: row_numbers(&row, "writes")
                    .into_iter()
                    .zip(row_numbers(&row, "write_sizes"))
                    .collect(),
            }
        })
        .collect()
}

/// The numbers `monitor when` printed, in order.
fn steps_said(text: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| l.strip_prefix("step ")?.trim().parse().ok())
        .collect()
}

/// The value gdb printed for `p/x $NAME` lines of the form `$N = 0x..`.
fn printed(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| Some(l.strip_prefix('$')?.split_once(" = ")?.1.to_string()))
        .collect()
}

#[test]
fn gdb_steps_and_continues_both_ways_through_a_demo_trace() {
    if !kvm_available() {
        return;
    }
    let trace = demo_trace();
    let rows = demo_rows();
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.step, i as u64, "the demo trace numbers its rows from 0");
    }
    let n = 500_000usize;
    let schedule = demo_symbol("schedule");
    let isr_common = demo_symbol("isr_common");

    // gdb's names in the export's register order, as gdb prints them.
    let gdb_names: Vec<&str> = REGISTERS
        .iter()
        .map(|r| if *r == "rflags" { "eflags" } else { r })
        .collect();
    let mut commands = vec!["monitor when".to_string(), "p/x $pc".to_string()];
    commands.push("reverse-stepi".into());
    commands.push("monitor when".into());
    commands.push("p/x $pc".into());
    commands.extend(gdb_names.iter().map(|r| format!("p/x ${r}")));
    commands.push(format!("break *{schedule:#x}"));
    commands.push("reverse-continue".into());
    commands.push("monitor when".into());
    commands.push("p/x *(unsigned long *)$rsp".into());
    commands.push("bt".into());
    commands.push("continue".into());
    commands.push("monitor when".into());
    commands.push("delete".into());
    commands.push("stepi".into());
    commands.push("monitor when".into());
    commands.push("p/x *(unsigned long *)0x7ff0000".into());
    let commands: Vec<&str> = commands.iter().map(String::as_str).collect();

    let (mut server, address, _) = serve(trace, &["--at", &n.to_string()]);
    // No `file`: gdb loads the symbols vtrace offers (the demo's ELF).
    let said = gdb(&address, None, &commands);
    let status = server.wait().unwrap();
    assert!(
        status.success(),
        "the server ends when gdb detaches\n{said}"
    );

    let steps = steps_said(&said);
    let values = printed(&said);
    // Standing at step N: its pc.
    assert_eq!(steps[0], n as u64, "{said}");
    assert_eq!(values[0], format!("{:#x}", rows[n].pc), "{said}");
    // reverse-stepi: step N-1, its pc, and every register as the steps
    // before it left them.
    assert_eq!(steps[1], n as u64 - 1, "{said}");
    assert_eq!(values[1], format!("{:#x}", rows[n - 1].pc), "{said}");
    for (i, name) in gdb_names.iter().enumerate() {
        let mut want = rows[n - 2].after[i].expect("every register known by then");
        if *name == "eflags" {
            want &= 0xffff_ffff;
        }
        assert_eq!(
            values[2 + i],
            format!("{want:#x}"),
            "${name} at step {}\n{said}",
            n - 1
        );
    }
    // reverse-continue to `schedule`: its last execution before step N-1.
    let last = rows[..n - 1]
        .iter()
        .rposition(|r| r.pc == schedule)
        .expect("schedule runs before step N");
    assert_eq!(steps[2], last as u64, "{said}");
    assert!(said.contains("Breakpoint 1, schedule"), "{said}");
    // There the stack's top is the return address the call pushed: into
    // the interrupt entry that calls schedule.
    let ret = u64::from_str_radix(values[2 + 17].trim_start_matches("0x"), 16).unwrap();
    assert!(
        (isr_common..isr_common + 0x100).contains(&ret),
        "return address {ret:#x} is not in isr_common ({isr_common:#x})\n{said}"
    );
    assert!(
        said.contains("in isr_common"),
        "bt names the caller\n{said}"
    );
    // continue: the next execution after it.
    let next = rows[last + 1..]
        .iter()
        .position(|r| r.pc == schedule)
        .map(|p| p + last + 1)
        .expect("schedule runs again");
    assert_eq!(steps[3], next as u64, "{said}");
    assert_eq!(steps[4], next as u64 + 1, "stepi goes one step\n{said}");
    // Memory no step touched is not invented.
    assert!(
        said.contains("Cannot access memory at address 0x7ff0000"),
        "{said}"
    );
}

#[test]
fn the_ends_of_the_trace_and_what_it_does_not_know() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let elf = write_guest(dir.path(), "demo-os.elf", vtrace_demo::DEMO_OS_ELF);
    let trace = demo_trace();
    let (mut server, address, _) = serve(trace, &[]);
    let said = gdb(
        &address,
        Some(&elf),
        &[
            "monitor when",
            // Before the first step no register is known but RIP.
            "p $rax",
            "reverse-stepi",
            "monitor when",
            "continue",
            "monitor when",
            "monitor goto 1000",
            "maintenance flush register-cache",
            "monitor when",
            "p $rax",
        ],
    );
    assert!(server.wait().unwrap().success(), "{said}");
    let steps = steps_said(&said);
    let last = info_json(trace)["steps"].as_u64().unwrap() - 1;
    assert_eq!(steps, vec![0, 0, last, 1000], "{said}");
    assert!(said.contains("$1 = <unavailable>"), "{said}");
    assert_eq!(
        said.matches("No more reverse-execution history.").count(),
        2,
        "both ends say so\n{said}"
    );
    assert!(said.contains("$2 = "), "{said}");
    assert!(!said.contains("$2 = <unavailable>"), "{said}");
}

#[test]
fn bad_addresses_and_steps_are_refused_with_what_to_do() {
    let trace = demo_trace();
    let out = run(&[
        "analyze",
        "gdb",
        trace.to_str().unwrap(),
        "--listen",
        "nowhere",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("give a port"), "{}", stderr(&out));
    let out = run(&[
        "analyze",
        "gdb",
        trace.to_str().unwrap(),
        "--listen",
        "0",
        "--at",
        "99999999999",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("outside the trace"),
        "{}",
        stderr(&out)
    );
}

/// What gdb says over a live demo OS ([`demo_gdb_commands`]).
fn debug_the_demo(address: &str, elf: Option<&Path>, traced: bool) -> String {
    gdb(address, elf, &demo_gdb_commands(traced))
}

#[test]
fn gdb_debugs_a_running_demo_os_to_its_end() {
    if !kvm_available() {
        return;
    }
    // No `file`: gdb loads the symbols vtrace offers (the demo's ELF).
    let (mut run, address, said_by_run) = run_with_gdb(&["--gdb-wait"]);
    let said = debug_the_demo(&address, None, false);
    assert!(
        said.contains("pvh_start"),
        "it waited at its first instruction\n{said}"
    );
    assert_gdb_debugged_the_demo(&said);
    assert!(run.wait().unwrap().success(), "{said}");
    // Untraced, a watchpoint is refused (nothing steps the guest to
    // compare its accesses), saying why; the session goes on.
    assert!(
        said.contains("Could not insert hardware watchpoint 2"),
        "{said}"
    );
    let said_by_run = said_by_run.join().unwrap();
    assert!(
        said_by_run.contains("watchpoints need the run traced (--trace"),
        "{said_by_run}"
    );
}

#[test]
fn gdb_on_a_traced_run_leaves_its_trace_as_it_was() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let elf = write_guest(dir.path(), "demo-os.elf", vtrace_demo::DEMO_OS_ELF);
    let disk = dir.path().join("held.vtd");
    let (mut run, address, _) = run_with_gdb(&[
        "--gdb-wait",
        "--trace",
        "--disk",
        disk.to_str().unwrap(),
        "--disk-size",
        "64M",
    ]);
    let said = debug_the_demo(&address, Some(&elf), true);
    assert_gdb_debugged_the_demo(&said);
    assert!(run.wait().unwrap().success(), "{said}");
    // The watchpoint stopped the guest right after each of the first two
    // stores to context_switches after the first call of schedule: at the
    // pc of the trace's next step.
    assert_gdb_watched_the_demo(&said);
    // Stopped, stepped, watched and read under gdb, the guest ran as it
    // runs alone: the same steps, the same digest.
    let held = info_json(&disk);
    let alone = info_json(demo_trace());
    assert_eq!(held["steps"], alone["steps"]);
    assert_eq!(held["digest"], alone["digest"]);
    assert_eq!(held["gaps"], 0);

    // Attached part way through a traced run (no --gdb-wait): gdb stops
    // the guest where it is, and the trace is still the same.
    let disk = dir.path().join("attached.vtd");
    let (mut run, address, _) = run_with_gdb(&[
        "--trace",
        "--disk",
        disk.to_str().unwrap(),
        "--disk-size",
        "64M",
    ]);
    let said = gdb(&address, Some(&elf), &["p/x $pc", "continue"]);
    assert!(said.contains("$1 = 0x"), "{said}");
    assert!(said.contains("exited normally"), "{said}");
    assert!(run.wait().unwrap().success(), "{said}");
    assert_eq!(info_json(&disk)["digest"], alone["digest"]);
}

/// Tracing ends (here by --max-steps) while gdb watches memory: the
/// guest stops for gdb there, saying why, instead of running on unwatched.
#[test]
fn gdb_is_told_when_tracing_stops_under_its_watchpoints() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("w.vtd");
    let (mut run, address, said_by_run) = run_with_gdb(&[
        "--gdb-wait",
        "--trace",
        "--max-steps",
        "200000",
        "--disk",
        disk.to_str().unwrap(),
        "--disk-size",
        "16M",
    ]);
    let said = gdb(
        &address,
        None,
        &[
            "break schedule",
            "continue",
            "delete",
            "watch context_switches",
            "continue",
            "continue",
            "delete",
            "continue",
        ],
    );
    assert!(run.wait().unwrap().success(), "{said}");
    // The first store (step 115,557) is caught; the next is past the
    // traced steps: gdb gets the guest back where tracing stopped.
    assert_eq!(said.matches("New value = ").count(), 1, "{said}");
    assert!(said.contains("received signal SIGINT"), "{said}");
    assert!(said.contains("exited normally"), "{said}");
    let said_by_run = said_by_run.join().unwrap();
    assert!(
        said_by_run.contains("tracing stopped, so gdb's watchpoints cannot fire"),
        "{said_by_run}"
    );
    assert_eq!(info_json(&disk)["steps"], 200_000);
}

#[test]
fn gdb_requests_that_cannot_be_served_say_why() {
    if !kvm_available() {
        return;
    }
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = run(&["run", "--no-input", "--gdb", &port]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("listening for gdb on 127.0.0.1:"),
        "{}",
        stderr(&out)
    );
    let out = run(&["run", "--no-input", "--gdb", "1234", "--cpus", "2"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--cpus 1"), "{}", stderr(&out));
    let out = run(&["run", "--no-input", "--gdb-wait"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// The routines open at step `n`, outermost first, from a nest diagram:
/// the calls entered at or before it and not yet left. (A routine that
/// jumped away is left; the one it jumped to, `[jmp]`, holds its frame.)
fn open_calls(nest: &str, n: u64) -> Vec<String> {
    let mut stack: Vec<String> = Vec::new();
    for line in nest.lines() {
        let mut words = line.split_whitespace();
        let Some(step) = words.next().and_then(|w| w.parse::<u64>().ok()) else {
            continue;
        };
        if step > n {
            break;
        }
        let text = line.trim_end();
        if let Some(closed) = text.split("} /* ").nth(1) {
            let name = closed.split([' ', ',']).next().unwrap();
            if let Some(at) = stack.iter().rposition(|s| s == name) {
                stack.truncate(at);
            }
            continue;
        }
        let Some(total) = words.next().and_then(|w| w.parse::<u64>().ok()) else {
            continue;
        };
        let Some(name) = text.split_whitespace().find(|w| w.contains("()")) else {
            continue;
        };
        let name = name.split('(').next().unwrap().to_string();
        if text.trim_end_matches("[jmp]").trim_end().ends_with('{') || step + total > n {
            stack.push(name);
        }
    }
    stack
}

#[test]
fn gdb_gives_a_backtrace_at_a_step_of_a_linux_trace() {
    if !kvm_available() {
        return;
    }
    let kernel = test_kernel();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("linux.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "-q",
        "--kernel",
        kernel.to_str().unwrap(),
        "--memory",
        "256M",
        "--start-at",
        "start_kernel",
        "--max-steps",
        "400000",
        "--exit-after-trace",
        "--disk",
        disk.to_str().unwrap(),
        "--disk-size",
        "64M",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let nest = run(&["analyze", "nest", "-q", disk.to_str().unwrap()]);
    assert!(nest.status.success(), "{}", stderr(&nest));
    let nest = stdout(&nest);
    // A step deep in a routine the nest diagram shows whole, five calls
    // down or more, where the listing names the same routine (the nest
    // diagram counts a retpoline's thunk as part of the call it makes).
    let (n, expected) = nest
        .lines()
        .filter_map(|l| {
            let step: u64 = l.split_whitespace().next()?.parse().ok()?;
            let total: u64 = l.split_whitespace().nth(1)?.parse().ok()?;
            (step > 200_000 && total > 10 && l.trim_end().ends_with(");"))
                .then_some(step + total / 2)
        })
        .map(|n| (n, open_calls(&nest, n)))
        .filter(|(_, stack)| stack.len() >= 5)
        .take(20)
        .find(|(n, stack)| {
            let listing = run(&[
                "analyze",
                "listing",
                "-q",
                "--from",
                &n.to_string(),
                "--count",
                "1",
                disk.to_str().unwrap(),
            ]);
            let innermost = format!(" {} ", stack.last().unwrap());
            let plus = format!(" {}+", stack.last().unwrap());
            stdout(&listing)
                .lines()
                .any(|l| l.contains(&innermost) || l.contains(&plus))
        })
        .expect("a step five calls deep");
    let (mut server, address, _) = serve(&disk, &["--at", &n.to_string()]);
    // gdb gets the kernel's symbols from vtrace (kallsyms and ORC): no
    // `file` command.
    let mut gdb = Command::new("timeout");
    gdb.args(["300", "gdb", "-batch", "-nx", "-ex", "set pagination off"]);
    gdb.args(["-ex", &format!("target remote {address}"), "-ex", "bt"]);
    let out = gdb.output().expect("gdb");
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(server.wait().unwrap().success(), "{said}");
    assert!(said.contains("Reading symbols from"), "{said}");
    let frames: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with('#'))
        .filter_map(|l| l.split(" in ").nth(1)?.split_whitespace().next())
        .collect();
    let innermost_first: Vec<&str> = expected.iter().rev().map(String::as_str).collect();
    assert!(
        frames.len() >= innermost_first.len(),
        "step {n}: gdb's frames {frames:?}, the nest diagram's {innermost_first:?}\n{said}"
    );
    assert_eq!(
        &frames[..innermost_first.len()],
        &innermost_first[..],
        "step {n}: gdb's backtrace and the nest diagram's open calls\n{said}"
    );
}

#[test]
fn gdb_unwinds_a_running_linux_kernel_and_kill_ends_the_run() {
    if !kvm_available() {
        return;
    }
    let kernel = test_kernel();
    let (run, address, _) = run_with_gdb(&[
        "--gdb-wait",
        "--kernel",
        kernel.to_str().unwrap(),
        "--memory",
        "256M",
    ]);
    // The symbols gdb loads are the ones vtrace made from the kernel's
    // kallsyms and ORC tables: a distribution kernel has no DWARF.
    let said = gdb(
        &address,
        None,
        &["break sort_r", "continue", "bt", "delete", "kill"],
    );
    assert!(said.contains("Breakpoint 1, "), "{said}");
    let frames: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with('#'))
        .filter_map(|l| l.split(" in ").nth(1)?.split_whitespace().next())
        .collect();
    // sort_r is first called by sort, well inside start_kernel; live, the
    // whole stack is there to read, down to the boot code's first frame.
    assert_eq!(frames.first(), Some(&"sort_r"), "{said}");
    assert_eq!(frames.get(1), Some(&"sort"), "{said}");
    assert!(frames.contains(&"start_kernel"), "{said}");
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{said}");
}

#[test]
fn a_watchpoint_finds_the_stores_to_a_stack_slot_both_ways() {
    if !kvm_available() {
        return;
    }
    let trace = demo_trace();
    let rows = demo_rows();
    let schedule = demo_symbol("schedule");
    // At a call of schedule, late in the run: the stack slot its stack
    // pointer names.
    let n = rows
        .iter()
        .rposition(|r| r.pc == schedule)
        .expect("schedule runs");
    let rsp = rows[n - 1].after[4].unwrap();
    let stores = |r: &Row| r.writes.iter().any(|&(a, s)| a < rsp + 8 && a + s > rsp);
    let last = rows[..n].iter().rposition(stores).expect("a store before");
    let next = rows[n..].iter().position(stores).map(|p| p + n);

    let (mut server, address, _) = serve(trace, &["--at", &n.to_string()]);
    let said = gdb(
        &address,
        None,
        &[
            "watch -l *(long *)$rsp",
            "reverse-continue",
            "monitor when",
            "continue",
            "monitor when",
            "continue",
            "monitor when",
        ],
    );
    assert!(server.wait().unwrap().success(), "{said}");
    let steps = steps_said(&said);
    // Back: gdb stands at the step that stored there, before it ran.
    assert_eq!(steps.first(), Some(&(last as u64)), "{said}");
    // On: just after that store, then just after the next one (none comes
    // between it and step N), or at the trace's end.
    assert_eq!(steps.get(1), Some(&(last as u64 + 1)), "{said}");
    let end = rows.len() as u64 - 1;
    assert_eq!(
        steps.get(2),
        Some(&next.map_or(end, |s| s as u64 + 1)),
        "{said}"
    );
    assert!(said.contains("Hardware watchpoint 1"), "{said}");
}
