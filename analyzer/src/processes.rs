//! The process table of a Linux trace: per task (thread), its process, its
//! name, the steps it ran in user and kernel mode, its system calls,
//! interrupts and switches in, from the task events `vtrace run` records
//! where the kernel switches and renames tasks. Steps before the trace names a task, or of a trace
//! that names none, go to a row without ids.

use std::fmt::Write as _;

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;
use vtrace_storage::{Event, Mapping, RecordRef};

use crate::error::Result;
use crate::input::{Progress, Records, SegmentInfo, Trace};
use crate::symbols::cr3_root;
use crate::syscalls;

/// One task (a thread) of the trace.
#[derive(Clone, Debug, Serialize)]
pub struct Process {
    /// The process (thread group) id; `None` on the row of unnamed steps.
    pub pid: Option<u32>,
    /// The thread id (the kernel's `pid`).
    pub tid: Option<u32>,
    /// The task's name when the trace last named it.
    pub comm: String,
    /// Steps in user mode.
    pub user_steps: u64,
    /// Steps in the kernel on its behalf.
    pub kernel_steps: u64,
    /// `syscall` instructions run in user mode.
    pub syscalls: u64,
    /// Interrupts and exceptions taken while it ran.
    pub interrupts: u64,
    /// Times the kernel switched to it.
    pub switches_in: u64,
    /// Page-table roots (CR3) it ran in.
    pub address_spaces: Vec<u64>,
    /// Its system calls by name (see [`crate::syscalls`]), with counts.
    pub system_calls: BTreeMap<String, u64>,
    /// The files its process mapped when the trace last read its map, one
    /// range per file (the process's load modules).
    pub mappings: Vec<Module>,
    /// How it ended, where the trace saw it exit.
    pub exit: Option<Exit>,
}

pub use crate::event_text::Exit;

/// A file a process mapped, over all its mappings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Module {
    /// The file.
    pub path: String,
    /// Lowest address of its mappings.
    pub start: u64,
    /// The address after its highest mapping.
    pub end: u64,
}

/// A process's map, one entry per file, in address order.
fn modules(maps: &[Mapping]) -> Vec<Module> {
    let mut out: Vec<Module> = Vec::new();
    for m in maps {
        match out.iter_mut().find(|x| x.path == m.path) {
            Some(x) => {
                x.start = x.start.min(m.start);
                x.end = x.end.max(m.end);
            }
            None => out.push(Module {
                path: m.path.clone(),
                start: m.start,
                end: m.end,
            }),
        }
    }
    out.sort_by_key(|m| m.start);
    out
}

/// The table, tasks in order of their ids.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessTable {
    /// Whether the trace names tasks at all (a Linux guest whose kernel
    /// vtrace could read).
    pub tasks_named: bool,
    /// One row per task, busiest first.
    pub processes: Vec<Process>,
}

#[derive(Default)]
struct Acc {
    user: u64,
    kernel: u64,
    syscalls: u64,
    interrupts: u64,
    switches_in: u64,
    spaces: FxHashSet<u64>,
    calls: FxHashMap<u64, u64>,
}

impl Acc {
    fn merge(&mut self, other: Acc) {
        self.user += other.user;
        self.kernel += other.kernel;
        self.syscalls += other.syscalls;
        self.interrupts += other.interrupts;
        self.switches_in += other.switches_in;
        self.spaces.extend(other.spaces);
        for (n, c) in other.calls {
            *self.calls.entry(n).or_default() += c;
        }
    }
}

/// A name the trace gave, in order: (tid, pid where a switch told it, comm).
type Naming = (u32, Option<u32>, String);

/// One segment's counts. Steps before its first task event belong to
/// whichever task ran when the segment began, known only in order.
#[derive(Default)]
struct Part {
    inherited: Acc,
    tasks: FxHashMap<u32, Acc>,
    names: Vec<Naming>,
    /// Maps recorded, in order: (pid, map).
    maps: Vec<(u32, Vec<Mapping>)>,
    /// Exits, in order: (tid, code).
    exits: Vec<(u32, u32)>,
    last: Option<u32>,
}

fn count_segment(records: &mut Records<'_>) -> Part {
    let mut part = Part::default();
    let mut current: Option<u32> = None;
    let mut just_started = false;
    while let Some(r) = records.next_record() {
        let acc = match current {
            Some(tid) => part.tasks.entry(tid).or_default(),
            None => &mut part.inherited,
        };
        match r {
            RecordRef::Step(s) => {
                just_started = false;
                if s.cpl == 0 {
                    acc.kernel += 1;
                } else {
                    acc.user += 1;
                    if let Some(n) = syscalls::number_of(s) {
                        acc.syscalls += 1;
                        *acc.calls.entry(n).or_default() += 1;
                    }
                }
                acc.spaces.insert(cr3_root(s.cr3));
            }
            RecordRef::Event(Event::Interrupt { .. }) => acc.interrupts += 1,
            RecordRef::Event(Event::TraceStart(_)) => just_started = true,
            RecordRef::Event(Event::Task { tid, pid, comm }) => {
                let next = part.tasks.entry(*tid).or_default();
                // Where tracing starts the task is named, not switched to.
                if !just_started {
                    next.switches_in += 1;
                }
                part.names.push((*tid, Some(*pid), comm.clone()));
                current = Some(*tid);
            }
            RecordRef::Event(Event::Running { tid, pid, comm }) => {
                // The segment begins in this task: named, not switched to.
                part.tasks.entry(*tid).or_default();
                part.names.push((*tid, Some(*pid), comm.clone()));
                current = Some(*tid);
            }
            RecordRef::Event(Event::TaskName { tid, comm }) => {
                part.names.push((*tid, None, comm.clone()));
            }
            RecordRef::Event(Event::Mappings { pid, maps }) => {
                part.maps.push((*pid, maps.clone()));
            }
            RecordRef::Event(Event::TaskExit { tid, code }) => part.exits.push((*tid, *code)),
            RecordRef::Event(_) => {}
        }
    }
    part.last = current;
    part
}

/// Reads the trace and builds the table.
pub fn collect(trace: &Trace, progress: Progress<'_>) -> Result<ProcessTable> {
    let mut unnamed = Acc::default();
    let mut tasks: FxHashMap<u32, Acc> = FxHashMap::default();
    let mut names: FxHashMap<u32, (Option<u32>, String)> = FxHashMap::default();
    let mut current: Option<u32> = None;
    let mut maps: FxHashMap<u32, Vec<Mapping>> = FxHashMap::default();
    let mut exits: FxHashMap<u32, u32> = FxHashMap::default();
    trace.for_each_ordered(
        &trace.segments,
        |_: &SegmentInfo, records| count_segment(records),
        |chunk| {
            let Ok(part) = chunk.result else {
                return Ok::<(), crate::error::AnalyzeError>(());
            };
            match current {
                Some(tid) => tasks.entry(tid).or_default().merge(part.inherited),
                None => unnamed.merge(part.inherited),
            }
            for (tid, acc) in part.tasks {
                tasks.entry(tid).or_default().merge(acc);
            }
            for (tid, pid, comm) in part.names {
                let entry = names.entry(tid).or_insert((None, String::new()));
                entry.0 = pid.or(entry.0);
                entry.1 = comm;
            }
            maps.extend(part.maps);
            exits.extend(part.exits);
            current = part.last.or(current);
            Ok(())
        },
        progress,
    )?;
    let tasks_named = !names.is_empty();
    let row = |pid: Option<u32>, tid, comm: String, a: Acc| {
        let mut spaces: Vec<u64> = a.spaces.into_iter().collect();
        spaces.sort_unstable();
        let system_calls = a
            .calls
            .into_iter()
            .map(|(n, c)| (syscalls::name(n), c))
            .collect();
        let mappings = pid
            .and_then(|p| maps.get(&p))
            .map(|m| modules(m))
            .unwrap_or_default();
        Process {
            pid,
            tid,
            comm,
            user_steps: a.user,
            kernel_steps: a.kernel,
            syscalls: a.syscalls,
            interrupts: a.interrupts,
            switches_in: a.switches_in,
            address_spaces: spaces,
            system_calls,
            mappings,
            exit: tid.and_then(|t| exits.get(&t)).map(|&c| Exit::from_code(c)),
        }
    };
    let mut processes: Vec<Process> = tasks
        .into_iter()
        .map(|(tid, a)| {
            let (pid, comm) = names.remove(&tid).unwrap_or_default();
            row(pid, Some(tid), comm, a)
        })
        .collect();
    processes.sort_by_key(|p| (p.pid, p.tid));
    if unnamed.user + unnamed.kernel > 0 {
        let comm = if tasks_named {
            "(before the first task event)"
        } else {
            "(tasks not recorded)"
        };
        processes.insert(0, row(None, None, comm.to_string(), unnamed));
    }
    Ok(ProcessTable {
        tasks_named,
        processes,
    })
}

impl ProcessTable {
    /// The table as text, one row per task.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        if !self.tasks_named {
            out.push_str(
                "the trace names no task: it is not of a Linux guest, or vtrace could not \
                 read the kernel's task layout (`vtrace run` said why)\n",
            );
        }
        let _ = writeln!(
            out,
            "{:>7} {:>7}  {:<16} {:>12} {:>12} {:>9} {:>10} {:>9}  address spaces",
            "pid",
            "tid",
            "comm",
            "user steps",
            "kernel steps",
            "syscalls",
            "interrupts",
            "switches"
        );
        let id = |v: Option<u32>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        for p in &self.processes {
            let spaces: Vec<String> = p.address_spaces.iter().map(|c| format!("{c:#x}")).collect();
            let _ = writeln!(
                out,
                "{:>7} {:>7}  {:<16} {:>12} {:>12} {:>9} {:>10} {:>9}  {}",
                id(p.pid),
                id(p.tid),
                format!("{:?}", p.comm).trim_matches('"'),
                p.user_steps,
                p.kernel_steps,
                p.syscalls,
                p.interrupts,
                p.switches_in,
                spaces.join(" ")
            );
            if !p.system_calls.is_empty() {
                let calls: Vec<String> = p
                    .system_calls
                    .iter()
                    .map(|(name, count)| format!("{name} {count}"))
                    .collect();
                let _ = writeln!(out, "{:17}system calls: {}", "", calls.join(", "));
            }
            for m in &p.mappings {
                let _ = writeln!(out, "{:17}maps {} {:#x}-{:#x}", "", m.path, m.start, m.end);
            }
            if let Some(exit) = &p.exit {
                let _ = writeln!(out, "{:17}{exit}", "");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtrace_storage::{CpuMode, InsnBytes, Regs, SegmentEncoder, Step, TraceReason};

    fn step(enc: &mut SegmentEncoder, bytes: &[u8], cpl: u8) {
        enc.push_step(&Step {
            pc: 0x1000,
            bytes: InsnBytes::new(bytes).expect("short"),
            cr3: 0x5000,
            mode: CpuMode::Long64,
            cpl,
            regs: Regs::default(),
        });
    }

    fn task(tid: u32, comm: &str) -> Event {
        Event::Task {
            tid,
            pid: tid,
            comm: comm.into(),
        }
    }

    #[test]
    fn exit_codes_read_as_wait_reads_them() {
        // wait(2): WIFEXITED when the low 7 bits are 0, WEXITSTATUS the
        // next byte; else WTERMSIG the low 7 bits, WCOREDUMP bit 7.
        let exited = Exit::from_code(3 << 8);
        assert_eq!((exited.status, exited.signal), (Some(3), None));
        assert_eq!(exited.to_string(), "exited with status 3");
        let killed = Exit::from_code(9);
        assert_eq!((killed.status, killed.signal), (None, Some(9)));
        assert_eq!(killed.to_string(), "killed by signal 9");
        let dumped = Exit::from_code(0x80 | 11);
        assert!(dumped.core_dumped);
        assert_eq!(dumped.to_string(), "killed by signal 11 (core dumped)");
    }

    #[test]
    fn steps_go_to_the_task_named_before_them() {
        let mut enc = SegmentEncoder::new();
        // Two steps of whatever ran when the segment began.
        step(&mut enc, &[0x90], 0);
        step(&mut enc, &[0x90], 3);
        enc.push_event(&Event::TraceStart(TraceReason::Control));
        enc.push_event(&task(1, "init"));
        step(&mut enc, &[0x0f, 0x05], 3);
        step(&mut enc, &[0x0f, 0x05], 0);
        enc.push_event(&task(2, "kthreadd"));
        enc.push_event(&Event::Interrupt {
            vector: 32,
            error_code: None,
            source: vtrace_storage::InterruptSource::Injected,
        });
        step(&mut enc, &[0x90], 0);
        enc.push_event(&task(1, "init"));
        enc.push_event(&Event::TaskName {
            tid: 1,
            comm: "sh".into(),
        });
        let payload = enc.take();
        let part = count_segment(&mut Records::new(&payload));

        assert_eq!((part.inherited.kernel, part.inherited.user), (1, 1));
        let init = &part.tasks[&1];
        assert_eq!((init.user, init.kernel, init.syscalls), (1, 1, 1));
        // Named where tracing started, then switched to once.
        assert_eq!(init.switches_in, 1);
        let kthreadd = &part.tasks[&2];
        assert_eq!((kthreadd.kernel, kthreadd.interrupts), (1, 1));
        assert_eq!(kthreadd.switches_in, 1);
        assert_eq!(part.last, Some(1));
        assert_eq!(part.names.last(), Some(&(1, None, "sh".to_string())));

        // A segment that opens with the running task: its steps are that
        // task's, and it was not switched to.
        let mut enc = SegmentEncoder::new();
        enc.push_event(&Event::Running {
            tid: 2,
            pid: 2,
            comm: "kthreadd".into(),
        });
        step(&mut enc, &[0x90], 0);
        enc.push_event(&Event::TaskExit { tid: 2, code: 0 });
        let payload = enc.take();
        let part = count_segment(&mut Records::new(&payload));
        assert_eq!(part.inherited.kernel, 0);
        assert_eq!((part.tasks[&2].kernel, part.tasks[&2].switches_in), (1, 0));
        assert_eq!(part.exits, vec![(2, 0)]);
    }
}
