//! `vtrace run --trace-function` on the demo OS under this host's KVM:
//! the windows are checked against the demo's own counts and against a
//! call graph read from its ELF, not against an earlier run.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::*;
use iced_x86::{Decoder, DecoderOptions, FlowControl, OpKind};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
use vtrace_storage::{Event, FunctionEdge, Record, TraceReason};

/// The demo's routines: start address → (name, end), each ending where
/// its size says or, for assembly labels without one, at the next symbol.
fn routines() -> BTreeMap<u64, (String, u64)> {
    let elf = object::File::parse(vtrace_demo::DEMO_OS_ELF).unwrap();
    let mut starts: Vec<(u64, u64, String)> = elf
        .symbols()
        .filter(|s| matches!(s.kind(), SymbolKind::Text | SymbolKind::Unknown) && s.address() > 0)
        .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_string())))
        .filter(|(_, _, n)| !n.is_empty() && !n.starts_with('.'))
        .collect();
    starts.sort();
    starts.dedup_by_key(|s| s.0);
    let text = elf.section_by_name(".text").unwrap();
    let text_end = text.address() + text.size();
    let mut map = BTreeMap::new();
    for (i, (start, size, name)) in starts.iter().enumerate() {
        let next = starts.get(i + 1).map_or(text_end, |s| s.0);
        let end = if *size > 0 { start + size } else { next };
        map.insert(*start, (name.clone(), end));
    }
    map
}

fn routine_of(routines: &BTreeMap<u64, (String, u64)>, pc: u64) -> Option<&str> {
    let (_, (name, end)) = routines.range(..=pc).next_back()?;
    (pc < *end).then_some(name.as_str())
}

/// Routines reachable from `roots` by direct calls and jumps out of a
/// routine (tail calls), and through the system-call table from
/// `syscall` (its one indirect call).
fn reachable(routines: &BTreeMap<u64, (String, u64)>, roots: &[&str]) -> BTreeSet<String> {
    let elf = object::File::parse(vtrace_demo::DEMO_OS_ELF).unwrap();
    let bytes_at = |addr: u64, len: u64| -> Vec<u8> {
        let s = elf
            .sections()
            .find(|s| (s.address()..s.address() + s.size()).contains(&addr))
            .unwrap();
        let data = s.data().unwrap();
        let at = (addr - s.address()) as usize;
        data[at..(at + len as usize).min(data.len())].to_vec()
    };
    let by_name: BTreeMap<&str, (u64, u64)> = routines
        .iter()
        .map(|(start, (name, end))| (name.as_str(), (*start, *end)))
        .collect();
    let table = demo_symbol("syscall_table");
    let mut seen = BTreeSet::new();
    let mut todo: Vec<String> = roots.iter().map(|r| r.to_string()).collect();
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let (start, end) = by_name[name.as_str()];
        let code = bytes_at(start, end - start);
        let mut targets = Vec::new();
        for insn in Decoder::with_ip(64, &code, start, DecoderOptions::NONE) {
            let direct = matches!(
                insn.flow_control(),
                FlowControl::Call
                    | FlowControl::UnconditionalBranch
                    | FlowControl::ConditionalBranch
            ) && insn.op0_kind() == OpKind::NearBranch64;
            if direct && !(start..end).contains(&insn.near_branch_target()) {
                targets.push(insn.near_branch_target());
            }
        }
        if name == "syscall" {
            let entries = bytes_at(table, 8 * 8);
            targets.extend(
                entries
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                    .filter(|a| *a != 0),
            );
        }
        for t in targets {
            if let Some(callee) = routine_of(routines, t) {
                todo.push(callee.to_string());
            }
        }
    }
    seen
}

fn run_windows(disk: &Path, routine: &str) -> std::process::Output {
    let out = run(&[
        "run",
        "--no-input",
        "--disk-size",
        "64M",
        "--trace-function",
        routine,
        "--disk",
        disk.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    out
}

fn function_reason(event: &Event) -> Option<(bool, &str, FunctionEdge)> {
    match event {
        Event::TraceStart(TraceReason::Function { name, edge }) => Some((true, name, *edge)),
        Event::TraceStop(TraceReason::Function { name, edge }) => Some((false, name, *edge)),
        _ => None,
    }
}

/// `page_fault` returns each time: one window per call, each from its
/// first instruction to its `ret`, as many as the faults the demo counts
/// itself; nothing is recorded between windows.
#[test]
fn each_call_of_a_routine_is_one_window_from_entry_to_return() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("pf.vtd");
    let out = run_windows(&disk, "page_fault");
    let console = stdout(&out);
    let faults: u64 = console
        .lines()
        .find_map(|l| l.strip_prefix("page faults: "))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or_else(|| panic!("the demo prints its page faults: {console}"));
    let entry = demo_symbol("page_fault");
    let routines = routines();
    let mut windows = Vec::new();
    let mut current: Option<Vec<vtrace_storage::Step>> = None;
    for record in records(&disk) {
        match record {
            Record::Event(e) => match function_reason(&e) {
                Some((true, "page_fault", FunctionEdge::Entry)) => {
                    assert!(current.is_none(), "windows do not overlap");
                    current = Some(Vec::new());
                }
                Some((false, "page_fault", FunctionEdge::Return)) => {
                    windows.push(current.take().expect("a return closes an open window"));
                }
                Some(other) => panic!("unexpected window edge {other:?}"),
                None => {}
            },
            Record::Step(s) => current.as_mut().expect("steps only inside windows").push(s),
        }
    }
    assert!(current.is_none(), "every window returned");
    assert!(faults >= 2, "{console}");
    assert_eq!(windows.len() as u64, faults, "one window per fault");
    let callees = reachable(&routines, &["page_fault"]);
    for w in &windows {
        assert_eq!(w[0].pc, entry, "a window starts at the entry");
        let last = w.last().unwrap();
        assert_eq!(last.bytes.as_slice(), [0xc3], "and ends with its ret");
        assert_eq!(routine_of(&routines, last.pc), Some("page_fault"));
        for s in w {
            let r = routine_of(&routines, s.pc).unwrap_or("?");
            assert!(callees.contains(r), "{r} at {:#x} is no callee", s.pc);
        }
    }
    let log = stderr(&out);
    assert!(
        log.contains(&format!(
            "--trace-function page_fault: {faults} calls, {faults} returned"
        )),
        "{log}"
    );
}

/// `task_sieve` is a task's entry: it never returns, and the scheduler
/// takes the CPU from it. Its one window holds only its own address
/// space's steps, in it or its callees or the interrupt handlers; where
/// the other tasks ran, the trace stops and starts again, and the summary
/// says the window never closed.
#[test]
fn a_task_entry_keeps_one_window_and_leaves_other_tasks_out() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("sieve.vtd");
    let out = run_windows(&disk, "task_sieve");
    let routines = routines();
    // Interrupt and exception entries are the isrN stubs.
    let mut roots: Vec<&str> = routines
        .values()
        .map(|(n, _)| n.as_str())
        .filter(|n| {
            n.strip_prefix("isr")
                .is_some_and(|v| v.parse::<u8>().is_ok())
        })
        .collect();
    assert!(roots.len() >= 17, "{roots:?}");
    roots.push("task_sieve");
    let allowed = reachable(&routines, &roots);
    let records = records(&disk);
    let edges: Vec<(bool, FunctionEdge)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Event(e) => function_reason(e).map(|(start, name, edge)| {
                assert_eq!(name, "task_sieve");
                (start, edge)
            }),
            _ => None,
        })
        .collect();
    assert_eq!(edges[0], (true, FunctionEdge::Entry), "{edges:?}");
    assert!(!edges.contains(&(false, FunctionEdge::Return)), "{edges:?}");
    // Out and in again alternate after the entry; sieve yields halfway, so
    // it is switched out at least once.
    let switches = &edges[1..];
    assert!(!switches.is_empty(), "{edges:?}");
    for (i, e) in switches.iter().enumerate() {
        let want = if i % 2 == 0 {
            (false, FunctionEdge::SwitchedOut)
        } else {
            (true, FunctionEdge::SwitchedIn)
        };
        assert_eq!(*e, want, "{edges:?}");
    }
    let steps: Vec<&vtrace_storage::Step> = records
        .iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some(s),
            _ => None,
        })
        .collect();
    let space = steps[0].cr3;
    assert!(steps.iter().all(|s| s.cr3 == space), "one address space");
    let mut in_sieve = 0;
    for s in &steps {
        let r = routine_of(&routines, s.pc).unwrap_or("?");
        assert!(allowed.contains(r), "{r} at {:#x}", s.pc);
        in_sieve += usize::from(r == "task_sieve");
    }
    assert!(in_sieve > 10_000, "the sieve's loop: {in_sieve} steps");
    let log = stderr(&out);
    assert!(
        log.contains("--trace-function task_sieve: 1 call, 0 returned, 1 still running"),
        "{log}"
    );
    // Other tasks' work is not there: crc32's loop is not reachable from
    // the sieve or the handlers.
    assert!(!allowed.contains("task_crc"));
}

#[test]
fn bad_trace_functions_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("never.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--trace",
        "--trace-function",
        "kprintf",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot be used with"),
        "{}",
        stderr(&out)
    );
    let five: Vec<String> = ["kprintf", "page_fault", "schedule", "trap", "memset"]
        .iter()
        .map(|r| format!("--trace-function={r}"))
        .collect();
    let mut args = vec!["run", "--no-input", "--disk", disk.to_str().unwrap()];
    args.extend(five.iter().map(String::as_str));
    let out = run(&args);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("at most 4"), "{}", stderr(&out));
    let out = run(&[
        "run",
        "--no-input",
        "--trace-function",
        "no_such_routine",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no routine of that name"),
        "{}",
        stderr(&out)
    );
    assert!(!disk.exists(), "no disk made");
}
