//! A Chrome/Perfetto trace-event JSON timeline: one track (thread) per
//! address space, a complete event per routine call, instant events for
//! interrupts and marks. Timestamps are virtual time: steps times the
//! nanoseconds the trace's clock gave each step (1 ns when the clock was
//! not per-step, and the file says so).

use std::io::Write;

use rustc_hash::FxHashMap;

use crate::error::Result;
use crate::input::{Progress, Trace};
use crate::levels::{run, BigLevel, BigLevelCause, ExitKind, FrameView, LevelSink};
use crate::nest::{routine_name, vector_name};
use crate::symbols::Symbolizer;

struct TimelineSink<'a, W: Write> {
    out: W,
    symbols: &'a Symbolizer,
    ns_per_step: u64,
    min_steps: u64,
    tracks: FxHashMap<u64, u32>,
    events: u64,
    error: Option<std::io::Error>,
}

impl<W: Write> TimelineSink<'_, W> {
    fn us(&self, step: u64) -> f64 {
        (step * self.ns_per_step) as f64 / 1000.0
    }

    fn track(&mut self, cr3: u64) -> u32 {
        if let Some(t) = self.tracks.get(&cr3) {
            return *t;
        }
        let t = self.tracks.len() as u32 + 1;
        self.tracks.insert(cr3, t);
        let meta = serde_json::json!({
            "ph": "M", "name": "thread_name", "pid": 1, "tid": t,
            "args": { "name": format!("address space {cr3:#x}") }
        });
        self.emit(&meta);
        t
    }

    fn emit(&mut self, event: &serde_json::Value) {
        if self.error.is_some() {
            return;
        }
        let sep: &[u8] = if self.events == 0 { b"\n" } else { b",\n" };
        let r = self.out.write_all(sep).and_then(|_| {
            serde_json::to_writer(&mut self.out, event).map_err(std::io::Error::from)
        });
        match r {
            Ok(()) => self.events += 1,
            Err(e) => self.error = Some(e),
        }
    }
}

impl<W: Write> LevelSink for TimelineSink<'_, W> {
    fn exit(&mut self, frame: &FrameView, how: ExitKind) {
        let steps = frame.last_step + 1 - frame.entry_step;
        if steps < self.min_steps {
            return;
        }
        let tid = self.track(frame.cr3);
        let event = serde_json::json!({
            "name": routine_name(self.symbols, frame),
            "cat": "routine",
            "ph": "X",
            "ts": self.us(frame.entry_step),
            "dur": (steps * self.ns_per_step) as f64 / 1000.0,
            "pid": 1,
            "tid": tid,
            "args": {
                "first step": frame.entry_step,
                "self steps": frame.self_steps,
                "total steps": frame.total_steps,
                "exit": format!("{how:?}"),
            }
        });
        self.emit(&event);
    }

    fn big_level(&mut self, level: &BigLevel) {
        let name = match level.cause {
            BigLevelCause::Interrupt { vector } => vector_name(vector),
            BigLevelCause::SystemCall { number: Some(n) } => {
                format!("system call {}", crate::syscalls::name(n))
            }
            BigLevelCause::SystemCall { number: None } => "system call".into(),
            BigLevelCause::Break => "steps missing".into(),
            _ => return,
        };
        let tid = self.track(level.cr3);
        let event = serde_json::json!({
            "name": name, "cat": "interrupt", "ph": "i", "s": "t",
            "ts": self.us(level.step), "pid": 1, "tid": tid,
            "args": { "step": level.step }
        });
        self.emit(&event);
    }

    fn mark(&mut self, step: u64, cr3: u64, id: u64, value: u64) {
        let tid = self.track(cr3);
        let event = serde_json::json!({
            "name": format!("mark {id}"), "cat": "mark", "ph": "i", "s": "g",
            "ts": self.us(step), "pid": 1, "tid": tid,
            "args": { "step": step, "value": value }
        });
        self.emit(&event);
    }
}

/// Writes the timeline; returns how many events it holds.
pub fn write(
    trace: &Trace,
    symbols: &Symbolizer,
    min_steps: u64,
    out: &mut impl Write,
    progress: Progress<'_>,
) -> Result<u64> {
    let per_step = trace.metadata.ns_per_step();
    let clock_note = match per_step {
        Some(ns) => format!("virtual time: {ns} ns per step"),
        None => "the trace's clock was not per-step: times are step numbers as nanoseconds".into(),
    };
    let other =
        serde_json::json!({ "trace": trace.path().display().to_string(), "clock": clock_note });
    write!(
        out,
        "{{\"displayTimeUnit\":\"ns\",\"otherData\":{other},\"traceEvents\":["
    )?;
    let mut sink = TimelineSink {
        out: &mut *out,
        symbols,
        ns_per_step: per_step.unwrap_or(1),
        min_steps: min_steps.max(1),
        tracks: FxHashMap::default(),
        events: 0,
        error: None,
    };
    sink.emit(&serde_json::json!({
        "ph": "M", "name": "process_name", "pid": 1, "args": { "name": "guest" }
    }));
    run(trace, symbols, &mut sink, progress)?;
    if let Some(e) = sink.error.take() {
        return Err(e.into());
    }
    let events = sink.events;
    writeln!(out, "\n]}}")?;
    Ok(events)
}
