//! The process table of a Linux trace: per task (thread), its process, its
//! name, the steps it ran in user and kernel mode, its system calls,
//! interrupts and switches in, from the task events `vtrace run` records
//! where the kernel switches and renames tasks. Steps before the trace names a task, or of a trace
//! that names none, go to a row without ids.

use std::fmt::Write as _;

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;
use vtrace_storage::{Event, Mapping, RecordRef, SegmentError};

use crate::error::Result;
use crate::input::{Progress, Records, SegmentInfo, Trace};
use crate::syscalls;
use vtrace_image::symbols::cr3_root;

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
    /// Its steps by CPU, on a trace of several CPUs (empty on one CPU).
    pub cpus: BTreeMap<u32, u64>,
    /// Times it ran on another CPU than the one it ran on before.
    pub migrations: u64,
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
    /// Steps by CPU.
    by_cpu: Vec<u64>,
    migrations: u64,
    spaces: FxHashSet<u64>,
    calls: FxHashMap<syscalls::SystemCall, u64>,
}

impl Acc {
    fn merge(&mut self, other: Acc) {
        self.user += other.user;
        self.kernel += other.kernel;
        self.syscalls += other.syscalls;
        self.interrupts += other.interrupts;
        self.switches_in += other.switches_in;
        if self.by_cpu.len() < other.by_cpu.len() {
            self.by_cpu.resize(other.by_cpu.len(), 0);
        }
        for (mine, theirs) in self.by_cpu.iter_mut().zip(other.by_cpu) {
            *mine += theirs;
        }
        self.migrations += other.migrations;
        self.spaces.extend(other.spaces);
        for (n, c) in other.calls {
            *self.calls.entry(n).or_default() += c;
        }
    }

    /// Its steps by CPU where the trace has `several` CPUs, else none.
    fn steps_by_cpu(&self, several: bool) -> BTreeMap<u32, u64> {
        match several {
            true => (0u32..)
                .zip(self.by_cpu.iter().copied())
                .filter(|&(_, steps)| steps > 0)
                .collect(),
            false => BTreeMap::new(),
        }
    }

    fn step(&mut self, s: &vtrace_storage::Step, cpu: usize) {
        if s.cpl == 0 {
            self.kernel += 1;
        } else {
            self.user += 1;
            if let Some(n) = syscalls::made_by(s) {
                self.syscalls += 1;
                *self.calls.entry(n).or_default() += 1;
            }
        }
        if self.by_cpu.len() <= cpu {
            self.by_cpu.resize(cpu + 1, 0);
        }
        self.by_cpu[cpu] += 1;
        self.spaces.insert(cr3_root(s.cr3));
    }
}

/// A name the trace gave, in order: (tid, pid where a switch told it, comm).
type Naming = (u32, Option<u32>, String);

/// One segment's counts. Steps of a CPU before the segment names its
/// task belong to whichever task that CPU ran when the segment began,
/// known only in order.
#[derive(Default)]
struct Part {
    /// By CPU.
    inherited: BTreeMap<u32, Acc>,
    tasks: FxHashMap<u32, Acc>,
    names: Vec<Naming>,
    /// Maps recorded, in order: (pid, map).
    maps: Vec<(u32, Vec<Mapping>)>,
    /// Exits, in order: (tid, code).
    exits: Vec<(u32, u32)>,
    /// Each CPU's task at the segment's end.
    last: BTreeMap<u32, u32>,
    /// Each task's first CPU in the segment, and its last.
    first_cpu: FxHashMap<u32, u32>,
    last_cpu: FxHashMap<u32, u32>,
    /// The CPUs whose last step in the segment was an `int 0x80`.
    ends_in_int_80: Vec<u32>,
    /// Interrupts of the `int 0x80` vector counted on a CPU before its
    /// first step in the segment, by CPU and the task counted in (`None`:
    /// the inherited): the system call's entry, not an interrupt, where
    /// the segment before ended in an `int 0x80` on that CPU.
    leading_deliveries: Vec<(u32, Option<u32>)>,
}

impl Part {
    /// Takes back the interrupts counted at the segment's start that were
    /// the entries of system calls made at the end of the segment before:
    /// `ended_in_int_80` are the CPUs whose last step there was one.
    fn uncount_deliveries(&mut self, ended_in_int_80: &[u32]) {
        for (cpu, tid) in std::mem::take(&mut self.leading_deliveries) {
            if !ended_in_int_80.contains(&cpu) {
                continue;
            }
            let acc = match tid {
                Some(tid) => self.tasks.entry(tid).or_default(),
                None => self.inherited.entry(cpu).or_default(),
            };
            acc.interrupts = acc.interrupts.saturating_sub(1);
        }
    }

    /// The counts of what `cpu` runs now.
    fn running(&mut self, cpu: u32) -> &mut Acc {
        match self.last.get(&cpu) {
            Some(tid) => self.tasks.entry(*tid).or_default(),
            None => self.inherited.entry(cpu).or_default(),
        }
    }

    /// Task `tid` runs on `cpu` from here: a migration where it last ran
    /// on another.
    fn runs_on(&mut self, tid: u32, cpu: u32) {
        match self.last_cpu.insert(tid, cpu) {
            Some(before) if before != cpu => self.tasks.entry(tid).or_default().migrations += 1,
            Some(_) => {}
            None => {
                self.first_cpu.insert(tid, cpu);
            }
        }
        self.last.insert(cpu, tid);
    }
}

/// Counts one segment; with `only`, the steps and interrupts of that CPU
/// alone.
fn count_segment(records: &mut Records<'_>, only: Option<u32>) -> Part {
    let mut part = Part::default();
    let mut cpu = 0u32;
    // Since tracing (re)started, the CPUs that ran a step: a task named on
    // another CPU is named where its tracing starts, not switched to.
    let mut started = false;
    let mut stepped: Vec<u32> = Vec::new();
    // The CPUs whose last step was an `int 0x80`: the interrupt recorded
    // next on one is that system call's entry, not an interrupt.
    let mut int_80: Vec<u32> = Vec::new();
    // The CPUs that ran a step in this segment.
    let mut ran: Vec<u32> = Vec::new();
    while let Some(r) = records.next_record() {
        if let RecordRef::Event(Event::Cpu(n)) = r {
            cpu = *n;
            continue;
        }
        let counted = only.is_none_or(|o| o == cpu);
        match r {
            RecordRef::Step(s) => {
                if started && !stepped.contains(&cpu) {
                    stepped.push(cpu);
                }
                int_80.retain(|c| *c != cpu);
                if syscalls::is_int_80(s) {
                    int_80.push(cpu);
                }
                if !ran.contains(&cpu) {
                    ran.push(cpu);
                }
                if counted {
                    // The decoder keeps CPU numbers below `MAX_CPUS`.
                    part.running(cpu).step(s, cpu as usize);
                }
            }
            RecordRef::Event(Event::Interrupt { vector, .. }) if counted => {
                let system_call = *vector == syscalls::INT_80_VECTOR && int_80.contains(&cpu);
                if *vector == syscalls::INT_80_VECTOR && !ran.contains(&cpu) {
                    // The step before is the segment before's.
                    let tid = part.last.get(&cpu).copied();
                    part.leading_deliveries.push((cpu, tid));
                }
                if !system_call {
                    part.running(cpu).interrupts += 1
                }
            }
            RecordRef::Event(Event::TraceStart(_)) => {
                started = true;
                stepped.clear();
            }
            RecordRef::Event(Event::Task { tid, pid, comm }) => {
                let next = part.tasks.entry(*tid).or_default();
                if !started || stepped.contains(&cpu) {
                    next.switches_in += 1;
                }
                part.names.push((*tid, Some(*pid), comm.clone()));
                part.runs_on(*tid, cpu);
            }
            RecordRef::Event(Event::Running { tid, pid, comm }) => {
                // The segment begins in this task: named, not switched to.
                part.tasks.entry(*tid).or_default();
                part.names.push((*tid, Some(*pid), comm.clone()));
                part.runs_on(*tid, cpu);
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
    part.ends_in_int_80 = int_80;
    part
}

/// The segments' parts, merged in trace order.
#[derive(Default)]
struct Merged {
    /// Steps before the first task event.
    unnamed: Acc,
    tasks: FxHashMap<u32, Acc>,
    names: FxHashMap<u32, (Option<u32>, String)>,
    /// Each CPU's running task, and each task's last CPU.
    current: BTreeMap<u32, u32>,
    last_cpu: FxHashMap<u32, u32>,
    maps: FxHashMap<u32, Vec<Mapping>>,
    exits: FxHashMap<u32, u32>,
    /// Where the last segment merged ended, and its CPUs whose last step
    /// was an `int 0x80`.
    ended: (u64, Vec<u32>),
}

impl Merged {
    /// Adds the next segment's part (`Err`: a segment that did not
    /// decode).
    fn take(&mut self, info: &SegmentInfo, part: Result<Part, SegmentError>) {
        let Ok(mut part) = part else {
            self.ended.1.clear();
            return;
        };
        // Only where no step is missing between the two segments.
        if self.ended.0 == info.first_step {
            part.uncount_deliveries(&self.ended.1);
        }
        self.ended = (
            info.first_step.saturating_add(info.steps),
            std::mem::take(&mut part.ends_in_int_80),
        );
        for (cpu, inherited) in part.inherited {
            match self.current.get(&cpu) {
                Some(tid) => self.tasks.entry(*tid).or_default().merge(inherited),
                None => self.unnamed.merge(inherited),
            }
        }
        for (tid, acc) in part.tasks {
            self.tasks.entry(tid).or_default().merge(acc);
        }
        for (tid, first) in part.first_cpu {
            if self
                .last_cpu
                .get(&tid)
                .is_some_and(|&before| before != first)
            {
                self.tasks.entry(tid).or_default().migrations += 1;
            }
        }
        self.last_cpu.extend(part.last_cpu);
        for (tid, pid, comm) in part.names {
            let entry = self.names.entry(tid).or_insert((None, String::new()));
            entry.0 = pid.or(entry.0);
            entry.1 = comm;
        }
        self.maps.extend(part.maps);
        self.exits.extend(part.exits);
        self.current.extend(part.last);
    }
}

/// Reads the trace and builds the table (of the CPU `--cpu` chose, or of
/// all).
pub fn collect(trace: &Trace, progress: Progress<'_>) -> Result<ProcessTable> {
    let only = trace.selected_cpu();
    let mut merged = Merged::default();
    trace.for_each_ordered(
        &trace.segments,
        |_: &SegmentInfo, records| count_segment(records, only),
        |chunk| {
            merged.take(&chunk.info, chunk.result);
            Ok::<(), crate::error::AnalyzeError>(())
        },
        progress,
    )?;
    let Merged {
        unnamed,
        tasks,
        mut names,
        maps,
        exits,
        ..
    } = merged;
    let several_cpus = trace.metadata.cpu_count() > 1;
    let tasks_named = !names.is_empty();
    let row = |pid: Option<u32>, tid, comm: String, a: Acc| {
        let cpus = a.steps_by_cpu(several_cpus);
        let mut spaces: Vec<u64> = a.spaces.into_iter().collect();
        spaces.sort_unstable();
        let system_calls = a
            .calls
            .into_iter()
            .map(|(call, c)| (call.name(), c))
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
            cpus,
            migrations: a.migrations,
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
            if !p.cpus.is_empty() {
                let cpus: Vec<String> = p
                    .cpus
                    .iter()
                    .map(|(cpu, steps)| format!("CPU {cpu} {steps} steps"))
                    .collect();
                let _ = writeln!(
                    out,
                    "{:17}on {}; {} migration{}",
                    "",
                    cpus.join(", "),
                    p.migrations,
                    if p.migrations == 1 { "" } else { "s" }
                );
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
    fn an_int_80_delivery_at_a_segments_start_is_the_system_call_before() {
        let delivery = Event::Interrupt {
            vector: 0x80,
            error_code: None,
            source: vtrace_storage::InterruptSource::Injected,
        };
        let segment = |last: &[u8]| {
            let mut enc = SegmentEncoder::new();
            enc.push_event(&task(1, "prog"));
            step(&mut enc, last, 3);
            enc.take()
        };
        let mut next = SegmentEncoder::new();
        next.push_event(&Event::Running {
            tid: 1,
            pid: 1,
            comm: "prog".into(),
        });
        next.push_event(&delivery);
        step(&mut next, &[0x90], 0);
        let next = next.take();
        for (last, interrupts) in [(&[0xcd, 0x80][..], 0), (&[0x90][..], 1)] {
            let before = count_segment(&mut Records::new(&segment(last)), None);
            let mut part = count_segment(&mut Records::new(&next), None);
            assert_eq!(part.tasks[&1].interrupts, 1, "counted alone");
            part.uncount_deliveries(&before.ends_in_int_80);
            assert_eq!(part.tasks[&1].interrupts, interrupts, "after {last:x?}");
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
        let part = count_segment(&mut Records::new(&payload), None);

        assert_eq!((part.inherited[&0].kernel, part.inherited[&0].user), (1, 1));
        let init = &part.tasks[&1];
        assert_eq!((init.user, init.kernel, init.syscalls), (1, 1, 1));
        // Named where tracing started, then switched to once.
        assert_eq!(init.switches_in, 1);
        let kthreadd = &part.tasks[&2];
        assert_eq!((kthreadd.kernel, kthreadd.interrupts), (1, 1));
        assert_eq!(kthreadd.switches_in, 1);
        assert_eq!(part.last.get(&0), Some(&1));
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
        let part = count_segment(&mut Records::new(&payload), None);
        assert!(part.inherited.is_empty());
        assert_eq!((part.tasks[&2].kernel, part.tasks[&2].switches_in), (1, 0));
        assert_eq!(part.exits, vec![(2, 0)]);
    }

    #[test]
    fn each_cpu_runs_its_own_task_and_a_move_is_a_migration() {
        let mut enc = SegmentEncoder::new();
        enc.push_event(&Event::TraceStart(TraceReason::Control));
        enc.push_event(&task(1, "a"));
        step(&mut enc, &[0x90], 3);
        enc.push_event(&Event::Cpu(1));
        // Named where CPU 1's tracing starts: not a switch.
        enc.push_event(&task(2, "b"));
        step(&mut enc, &[0x90], 3);
        step(&mut enc, &[0x90], 0);
        enc.push_event(&Event::Cpu(0));
        step(&mut enc, &[0x90], 3);
        enc.push_event(&task(3, "idle"));
        enc.push_event(&Event::Cpu(1));
        // Task 1 moves to CPU 1.
        enc.push_event(&task(1, "a"));
        step(&mut enc, &[0x90], 0);
        let payload = enc.take();
        let part = count_segment(&mut Records::new(&payload), None);
        let a = &part.tasks[&1];
        assert_eq!((a.user, a.kernel), (2, 1));
        assert_eq!(a.by_cpu, vec![2, 1]);
        assert_eq!((a.migrations, a.switches_in), (1, 1));
        let b = &part.tasks[&2];
        assert_eq!((b.user, b.kernel, b.switches_in), (1, 1, 0));
        assert_eq!(b.by_cpu, vec![0, 2]);
        assert_eq!(part.tasks[&3].switches_in, 1);
        assert_eq!(part.last.get(&0), Some(&3));
        assert_eq!(part.last.get(&1), Some(&1));
        assert_eq!((part.first_cpu[&1], part.last_cpu[&1]), (0, 1));

        // `--cpu 1`: only CPU 1's steps are counted.
        let part = count_segment(&mut Records::new(&payload), Some(1));
        assert_eq!(part.tasks[&1].user + part.tasks[&1].kernel, 1);
        assert_eq!(part.tasks[&2].by_cpu, vec![0, 2]);
    }

    #[test]
    fn an_int_80_delivery_is_its_system_call_not_an_interrupt() {
        let interrupt = |vector| Event::Interrupt {
            vector,
            error_code: None,
            source: vtrace_storage::InterruptSource::Injected,
        };
        let mut enc = SegmentEncoder::new();
        enc.push_event(&task(1, "prog"));
        // `int 0x80`, whose delivery the host recorded (AMD-V does).
        step(&mut enc, &[0xcd, 0x80], 3);
        enc.push_event(&interrupt(0x80));
        step(&mut enc, &[0x90], 0);
        // A vector 128 after anything else is an interrupt, and so is any
        // other vector after an `int 0x80`.
        enc.push_event(&interrupt(0x80));
        step(&mut enc, &[0x90], 0);
        step(&mut enc, &[0xcd, 0x80], 3);
        enc.push_event(&interrupt(32));
        step(&mut enc, &[0x90], 0);
        let payload = enc.take();
        let part = count_segment(&mut Records::new(&payload), None);
        let prog = &part.tasks[&1];
        assert_eq!((prog.syscalls, prog.interrupts), (2, 2));
    }
}
