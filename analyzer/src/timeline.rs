//! A Chrome/Perfetto trace-event JSON timeline: where the trace names
//! Linux tasks, a Perfetto process per guest process and a thread per
//! guest thread, and a counter of runnable tasks; else one track (thread)
//! per address space. A complete event per routine call, instant events
//! for interrupts, system calls and marks. Timestamps are virtual time: steps times the
//! nanoseconds the trace's clock gave each step (1 ns when the clock was
//! not per-step, and the file says so). The peeper's samples are counter
//! tracks at the virtual time they were taken, since the guest booted:
//! the two agree where the trace covers the run from its start with a
//! per-step clock, until the guest first idles (idle time is skipped).

use std::io::Write;

use rustc_hash::FxHashMap;

use crate::error::Result;
use crate::input::{Progress, Trace};
use vtrace_storage::Event;

use crate::levels::SelectedTasks;
use crate::levels::{
    BigLevel, BigLevelCause, ExitKind, FrameView, LevelSink, SegmentPass, SegmentRecord,
};
use crate::naming::{routine_name, vector_name};
use crate::tasks::{Comm, TaskFilter, TaskId};
use crate::timeline_out::{Arg, Instant, JsonOut, Slice, TimelineOut};
use vtrace_image::symbols::Symbolizer;

/// What the timeline shows.
#[derive(Clone, Debug, Default)]
pub struct TimelineOptions {
    /// Routine calls shorter than this many steps are left out.
    pub min_steps: u64,
    /// Only these tasks' routines and levels.
    pub tasks: TaskFilter,
    /// The file's format.
    pub format: TimelineFormat,
}

/// A timeline's file format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimelineFormat {
    /// Chrome's trace-event JSON, which Perfetto and chrome://tracing
    /// read.
    #[default]
    Json,
    /// Perfetto's own protobuf trace: smaller, and read far faster by the
    /// Perfetto UI (what a trace of millions of calls needs).
    Perfetto,
}

/// The Perfetto process of steps no task is named for, in a trace that
/// names tasks (above any Linux pid, `PID_MAX_LIMIT` being 4,194,304).
const NO_TASK_PID: u32 = 5_000_000;
/// The Perfetto process holding the runnable-tasks counter.
const RUN_QUEUE_PID: u32 = 5_000_001;
/// The Perfetto process holding the peeper's counters.
const SAMPLES_PID: u32 = 5_000_002;
/// The Perfetto process holding the probes' fires, a thread per probe.
const PROBES_PID: u32 = 5_000_003;
/// The Perfetto process of CPU 0 in a trace of several CPUs (CPU n's is
/// this + n), each with a track per address space.
const CPU_PID: u32 = 5_000_100;

/// A Perfetto (process, thread) pair.
type Track = (u32, u32);

struct TimelineSink<'a, O: TimelineOut> {
    out: O,
    symbols: &'a Symbolizer,
    ns_per_step: u64,
    min_steps: u64,
    /// Whether the trace names tasks: tracks are then tasks.
    named: bool,
    /// Address-space tracks: page-table root to thread number.
    spaces: FxHashMap<u64, u32>,
    /// Names given to task tracks, to name them again when they change.
    names: FxHashMap<u32, Comm>,
    process_names: FxHashMap<u32, Comm>,
    /// The running task, for marks.
    running: Option<TaskId>,
    /// The process of the CPU whose records are read, in a trace of
    /// several CPUs given a process each.
    cpu_pid: Option<u32>,
    /// On that CPU, the task running since this step (a slice on the
    /// CPU's own track once another runs).
    on_cpu: Option<(TaskId, u64)>,
    /// The last step of a routine left so far: where the last task's
    /// slice on a CPU's track ends.
    last_step: u64,
    events: u64,
    error: Option<std::io::Error>,
}

impl<O: TimelineOut> TimelineSink<'_, O> {
    fn ns(&self, step: u64) -> u64 {
        step.saturating_mul(self.ns_per_step)
    }

    /// Hands an event to the output, keeping its first error.
    fn put(&mut self, write: impl FnOnce(&mut O) -> std::io::Result<()>) {
        if self.error.is_some() {
            return;
        }
        match write(&mut self.out) {
            Ok(()) => self.events += 1,
            Err(e) => self.error = Some(e),
        }
    }

    /// The track of a task, or of an address space where none is named.
    fn track(&mut self, task: Option<&TaskId>, cr3: u64) -> Track {
        match task {
            Some(t) => {
                self.name_task(t);
                (t.pid, t.tid)
            }
            None => {
                let pid = match (self.cpu_pid, self.named) {
                    (Some(pid), _) => pid,
                    (None, true) => NO_TASK_PID,
                    (None, false) => 1,
                };
                (pid, self.space_track(pid, cr3))
            }
        }
    }

    fn space_track(&mut self, pid: u32, cr3: u64) -> u32 {
        if let Some(t) = self.spaces.get(&cr3) {
            return *t;
        }
        let t = self.spaces.len() as u32 + 1;
        self.spaces.insert(cr3, t);
        let name = format!("address space {cr3:#x}");
        self.put(|o| o.thread(pid, t, &name));
        t
    }

    /// Names a task's thread, and its process after its first thread,
    /// where they were not yet so named.
    fn name_task(&mut self, t: &TaskId) {
        if self.names.get(&t.tid) != Some(&t.comm) {
            self.names.insert(t.tid, t.comm);
            self.put(|o| o.thread(t.pid, t.tid, t.comm.as_str()));
        }
        let leader = t.tid == t.pid;
        let unnamed = !self.process_names.contains_key(&t.pid);
        if unnamed || (leader && self.process_names.get(&t.pid) != Some(&t.comm)) {
            self.process_names.insert(t.pid, t.comm);
            self.put(|o| o.process(t.pid, t.comm.as_str()));
        }
    }
}

impl<O: TimelineOut> LevelSink for TimelineSink<'_, O> {
    fn stopped(&self) -> bool {
        self.error.is_some()
    }

    fn exit(&mut self, frame: &FrameView, how: ExitKind) {
        self.last_step = self.last_step.max(frame.last_step);
        let steps = frame.last_step + 1 - frame.entry_step;
        if steps < self.min_steps {
            return;
        }
        let (pid, tid) = self.track(frame.task.as_ref(), frame.cr3);
        let name = routine_name(self.symbols, frame.func, frame.entry_pc);
        let exit = format!("{how:?}");
        let slice = Slice {
            pid,
            tid,
            name: &name,
            cat: "routine",
            ts_ns: self.ns(frame.entry_step),
            dur_ns: self.ns(steps),
            args: &[
                ("first step", Arg::U64(frame.entry_step)),
                ("self steps", Arg::U64(frame.self_steps)),
                ("total steps", Arg::U64(frame.total_steps)),
                ("exit", Arg::Text(&exit)),
            ],
        };
        self.put(|o| o.slice(&slice));
    }

    fn big_level(&mut self, level: &BigLevel) {
        let name = match level.cause {
            BigLevelCause::Interrupt { vector } => vector_name(vector),
            BigLevelCause::SystemCall { call: Some(call) } => {
                format!("system call {}", call.name())
            }
            BigLevelCause::SystemCall { call: None } => "system call".into(),
            BigLevelCause::Break => "steps missing".into(),
            _ => return,
        };
        let (pid, tid) = self.track(level.task.as_ref(), level.cr3);
        let instant = Instant {
            pid,
            tid,
            name: &name,
            cat: "interrupt",
            ts_ns: self.ns(level.step),
            global: false,
            args: &[("step", Arg::U64(level.step))],
        };
        self.put(|o| o.instant(&instant));
    }

    fn mark(&mut self, step: u64, cr3: u64, id: u64, value: u64) {
        let running = self.running;
        let (pid, tid) = self.track(running.as_ref(), cr3);
        let name = format!("mark {id}");
        let instant = Instant {
            pid,
            tid,
            name: &name,
            cat: "mark",
            ts_ns: self.ns(step),
            global: true,
            args: &[("step", Arg::U64(step)), ("value", Arg::U64(value))],
        };
        self.put(|o| o.instant(&instant));
    }

    fn task(&mut self, step: u64, task: &TaskId) {
        self.running = Some(*task);
        if self.cpu_pid.is_some() {
            self.end_on_cpu(step);
            self.on_cpu = Some((*task, step));
        }
    }
}

impl<O: TimelineOut> TimelineSink<'_, O> {
    /// Ends the slice of the task running on the CPU, on the CPU's
    /// track (thread 0 of its process, "tasks"), before `step`.
    fn end_on_cpu(&mut self, step: u64) {
        let (Some(pid), Some((task, from))) = (self.cpu_pid, self.on_cpu.take()) else {
            return;
        };
        if step <= from {
            return;
        }
        let name = task.to_string();
        let slice = Slice {
            pid,
            tid: 0,
            name: &name,
            cat: "task",
            ts_ns: self.ns(from),
            dur_ns: self.ns(step - from),
            args: &[
                ("pid", Arg::U64(u64::from(task.pid))),
                ("tid", Arg::U64(u64::from(task.tid))),
                ("first step", Arg::U64(from)),
            ],
        };
        self.put(|o| o.slice(&slice));
    }
}

/// Collects a segment's runnable-task counts with the step they hold from.
struct RunQueue {
    step: u64,
    counts: Vec<(u64, u32)>,
}

impl SegmentPass for RunQueue {
    type Output = Vec<(u64, u32)>;

    fn record(&mut self, record: SegmentRecord<'_>) {
        match record {
            SegmentRecord::Step(..) => self.step = self.step.saturating_add(1),
            SegmentRecord::Event(Event::Runnable { count }) => {
                self.counts.push((self.step, *count))
            }
            SegmentRecord::Event(_) => {}
        }
    }

    fn finish(self) -> Self::Output {
        self.counts
    }
}

impl<O: TimelineOut> TimelineSink<'_, O> {
    /// The runnable-tasks counter: (step, count) where it changed.
    fn emit_run_queue(&mut self, runnable: Vec<(u64, u32)>) {
        if !runnable.is_empty() {
            self.put(|o| o.process(RUN_QUEUE_PID, "run queue"));
        }
        for (step, count) in runnable {
            let ts = self.ns(step);
            self.put(|o| {
                o.counter(
                    RUN_QUEUE_PID,
                    "runnable tasks",
                    "runnable",
                    ts,
                    f64::from(count),
                )
            });
        }
    }

    /// The probes' fires (`run --probe`), an instant each on its
    /// probe's track, with its typed values (or its arguments).
    fn emit_probes(&mut self, trace: &Trace) -> Result<()> {
        let fires = crate::probes::fires(trace, &crate::input::no_progress)?;
        if !fires.is_empty() {
            self.put(|o| o.process(PROBES_PID, "probes"));
        }
        let mut tracks: FxHashMap<String, u32> = FxHashMap::default();
        for fire in &fires {
            let tid = match tracks.get(&fire.probe) {
                Some(t) => *t,
                None => {
                    let t = tracks.len() as u32 + 1;
                    tracks.insert(fire.probe.clone(), t);
                    self.put(|o| o.thread(PROBES_PID, t, &fire.probe));
                    t
                }
            };
            let numbered: Vec<(String, u64)> = fire
                .args
                .iter()
                .enumerate()
                .map(|(i, a)| (format!("arg{i}"), *a))
                .collect();
            let mut args: Vec<(&str, Arg<'_>)> = vec![("step", Arg::U64(fire.step))];
            match fire.values.is_empty() {
                true => args.extend(numbered.iter().map(|(n, a)| (n.as_str(), Arg::U64(*a)))),
                false => args.extend(
                    fire.values
                        .iter()
                        .map(|(n, v)| (n.as_str(), Arg::Text(v.as_str()))),
                ),
            }
            let instant = Instant {
                pid: PROBES_PID,
                tid,
                name: &fire.probe,
                cat: "probe",
                ts_ns: self.ns(fire.step),
                global: false,
                args: &args,
            };
            self.put(|o| o.instant(&instant));
        }
        Ok(())
    }

    /// The peeper's samples, a counter per variable.
    fn emit_samples(&mut self, trace: &Trace) -> Result<()> {
        let samples = crate::samples::samples(trace, &crate::input::no_progress)?;
        if !samples.samples.is_empty() {
            self.put(|o| o.process(SAMPLES_PID, "samples (guest virtual time since boot)"));
        }
        for (i, variable) in samples.variables.iter().enumerate() {
            for s in &samples.samples {
                let Some(&raw) = s.values.get(i) else {
                    continue;
                };
                // Counter values are doubles in the trace-event format.
                let value = variable.kind.number(raw) as f64;
                let name = &variable.name;
                self.put(|o| o.counter(SAMPLES_PID, name, name, s.virtual_ns, value));
            }
        }
        Ok(())
    }
}

/// Writes the timeline; returns how many events it holds.
pub fn write(
    trace: &Trace,
    symbols: &Symbolizer,
    options: &TimelineOptions,
    out: &mut impl Write,
    progress: Progress<'_>,
) -> Result<u64> {
    if options.format == TimelineFormat::Perfetto {
        return write_to(
            trace,
            symbols,
            options,
            crate::perfetto::ProtoOut::new(out),
            progress,
        );
    }
    let clock_note = match trace.metadata.ns_per_step() {
        Some(ns) => format!("virtual time: {ns} ns per step"),
        None => "the trace's clock was not per-step: times are step numbers as nanoseconds".into(),
    };
    let other =
        serde_json::json!({ "trace": trace.path().display().to_string(), "clock": clock_note });
    write!(
        out,
        "{{\"displayTimeUnit\":\"ns\",\"otherData\":{other},\"traceEvents\":["
    )?;
    write_to(
        trace,
        symbols,
        options,
        JsonOut { out, events: 0 },
        progress,
    )
}

/// The timeline's events into `out`.
fn write_to<O: TimelineOut>(
    trace: &Trace,
    symbols: &Symbolizer,
    options: &TimelineOptions,
    out: O,
    progress: Progress<'_>,
) -> Result<u64> {
    let per_step = trace.metadata.ns_per_step();
    let named = trace.metadata.names_tasks();
    let sink = TimelineSink {
        out,
        symbols,
        ns_per_step: per_step.unwrap_or(1),
        min_steps: options.min_steps.max(1),
        named,
        spaces: FxHashMap::default(),
        names: FxHashMap::default(),
        process_names: FxHashMap::default(),
        running: None,
        cpu_pid: None,
        on_cpu: None,
        last_step: 0,
        events: 0,
        error: None,
    };
    let mut sink = SelectedTasks::new(sink, &options.tasks);
    let no_task = if named {
        (NO_TASK_PID, "no task named (address spaces)")
    } else {
        (1, "guest")
    };
    let cpus = trace.metadata.cpu_count();
    let per_cpu = cpus > 1 && trace.selected_cpu().is_none();
    if !per_cpu {
        sink.inner.put(|o| o.process(no_task.0, no_task.1));
    }
    let mut runnable: Vec<(u64, u32)> = Vec::new();
    let run_queue = |info: &crate::input::SegmentInfo| RunQueue {
        step: info.first_step,
        counts: Vec::new(),
    };
    // A trace of several CPUs: a process per CPU, its address spaces as
    // threads, one pass each.
    let passes: Vec<Option<u32>> = match per_cpu {
        true => (0..cpus).map(Some).collect(),
        false => vec![trace.one_cpu()?],
    };
    for only in passes {
        if let Some(cpu) = only.filter(|_| per_cpu) {
            let pid = CPU_PID.saturating_add(cpu);
            sink.inner.cpu_pid = Some(pid);
            sink.inner.spaces.clear();
            sink.inner.put(|o| o.process(pid, &format!("CPU {cpu}")));
            if named {
                sink.inner.put(|o| o.thread(pid, 0, "tasks"));
            }
            sink.inner.last_step = 0;
        }
        crate::levels::LevelPass::new(trace, symbols)
            .cpu(only)
            .progress(progress)
            .run_with(&mut sink, run_queue, |counts| runnable.extend(counts))?;
        let end = sink.inner.last_step.saturating_add(1);
        sink.inner.end_on_cpu(end);
    }
    let mut sink = sink.inner;
    sink.emit_run_queue(runnable);
    sink.emit_samples(trace)?;
    sink.emit_probes(trace)?;
    if let Some(e) = sink.error.take() {
        return Err(e.into());
    }
    sink.out.finish()?;
    Ok(sink.events)
}
