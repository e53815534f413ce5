//! One segment's steps of one CPU, each with how the registers before it
//! are known: what a debugger needs to stand at a step.

use vtrace_storage::{CpuMode, Event, InsnBytes, RecordRef, Regs};

use crate::input::Records;

/// How the registers before a step are known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Before {
    /// They are the registers after the CPU's previous step.
    Follows,
    /// An interrupt or exception was delivered since that step: the CPU
    /// changed RSP and RFLAGS (and the stack) as it did, unseen.
    Interrupted,
    /// The trace broke since (tracing started, a gap), or the step is the
    /// first the trace has of its CPU.
    Unknown,
}

impl Before {
    /// What is known after `self`, then `then`: the worse of the two.
    pub fn then(self, then: Before) -> Before {
        self.max(then)
    }
}

/// One step of the CPU.
#[derive(Clone, Copy, Debug)]
pub struct Point {
    /// Its number in the trace.
    pub step: u64,
    /// Its address.
    pub pc: u64,
    /// Its bytes.
    pub bytes: InsnBytes,
    /// The address space it ran in.
    pub cr3: u64,
    /// Its mode.
    pub mode: CpuMode,
    /// Its privilege level.
    pub cpl: u8,
    /// The registers after it.
    pub after: Regs,
    /// How the registers before it are known, from what this segment
    /// holds (its first step's also depends on the segment before).
    pub before: Before,
}

/// A segment's steps of one CPU.
#[derive(Clone, Debug, Default)]
pub struct Points {
    /// In trace order.
    pub points: Vec<Point>,
    /// What came after the last of them: how the registers before the
    /// CPU's next step (in a later segment) relate to its last one here.
    pub tail: Option<Before>,
}

/// The steps of CPU `cpu` (the trace's only one: `None`) in a segment
/// whose first step is `first_step`.
pub fn points(records: &mut Records<'_>, first_step: u64, cpu: Option<u32>) -> Points {
    let mut out = Points::default();
    let mut current = 0u32;
    let mut step = first_step;
    // Events before the CPU's first step here are carried to it.
    let mut since = Before::Follows;
    while let Some(record) = records.next_record() {
        let ours = cpu.is_none_or(|c| c == current);
        match record {
            RecordRef::Event(event) => match event {
                Event::Cpu(n) => current = *n,
                Event::TraceStart(_) | Event::TraceStop(_) => since = Before::Unknown,
                Event::Gap { .. } if ours => since = Before::Unknown,
                Event::Interrupt { .. } if ours => since = since.then(Before::Interrupted),
                _ => {}
            },
            RecordRef::Step(s) => {
                if ours {
                    out.points.push(Point {
                        step,
                        pc: s.pc,
                        bytes: s.bytes,
                        cr3: s.cr3,
                        mode: s.mode,
                        cpl: s.cpl,
                        after: s.regs,
                        before: since,
                    });
                    since = Before::Follows;
                }
                step = step.saturating_add(1);
            }
        }
    }
    out.tail = Some(since);
    out
}
