//! What `vtrace info` reports about a trace.

use std::collections::BTreeMap;

use crate::digest::TraceDigest;
use crate::reader::{SegmentState, TraceReader};
use crate::record::{Event, Record, TraceReason};

/// Facts about a trace, from reading all of it.
#[derive(Clone, Debug, Default)]
pub struct TraceSummary {
    /// Steps read.
    pub steps: u64,
    /// Events read, by kind.
    pub events: BTreeMap<&'static str, u64>,
    /// Gap events among them.
    pub gaps: u64,
    /// pc of the first step.
    pub first_pc: Option<u64>,
    /// pc of the last step.
    pub last_pc: Option<u64>,
    /// Why each traced stretch started, in order.
    pub start_reasons: Vec<TraceReason>,
    /// Why each traced stretch stopped, in order.
    pub stop_reasons: Vec<TraceReason>,
    /// Bytes the disk holds (its size).
    pub disk_size: u64,
    /// Bytes of the disk holding segments (headers included).
    pub disk_used: u64,
    /// Segments read and checked.
    pub segments_good: u64,
    /// Segments partly overwritten by newer ones (`--wrap`).
    pub segments_overwritten: u64,
    /// Human-readable problems: corrupt or missing segments, torn tail.
    pub problems: Vec<String>,
    /// Whether every traced stretch ends with its stop record and the disk
    /// was closed (a clean shutdown).
    pub clean_end: bool,
    /// The records' digest (hex), the same however they were segmented.
    pub digest: String,
    /// The metadata text, as the superblock holds it.
    pub metadata: String,
}

impl TraceSummary {
    /// Disk bytes per recorded step.
    pub fn bytes_per_step(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.disk_used as f64 / self.steps as f64
        }
    }

    /// The reason tracing stopped last, if it was recorded.
    pub fn stop_reason(&self) -> Option<&TraceReason> {
        self.stop_reasons.last()
    }
}

/// Name of an event kind, as `vtrace info` counts them.
pub fn event_kind(e: &Event) -> &'static str {
    match e {
        Event::Interrupt { .. } => "interrupt",
        Event::Io { .. } => "io",
        Event::Mmio { .. } => "mmio",
        Event::Hypercall { .. } => "hypercall",
        Event::Mark { .. } => "mark",
        Event::Log(_) => "log",
        Event::Capture { .. } => "capture",
        Event::Probe { .. } => "probe",
        Event::Sample { .. } => "sample",
        Event::ControlRegister { .. } => "control_register",
        Event::Gap { .. } => "gap",
        Event::Halt => "halt",
        Event::TraceStart(_) => "trace_start",
        Event::TraceStop(_) => "trace_stop",
        Event::Task { .. } => "task",
        Event::TaskName { .. } => "task_name",
        Event::Running { .. } => "running",
        Event::Runnable { .. } => "runnable",
        Event::TaskExit { .. } => "task_exit",
        Event::Mappings { .. } => "mappings",
    }
}

/// Reads every good segment in order and sums the trace up. `progress` is
/// called after each segment with (done, total).
pub fn summarize(reader: &TraceReader, mut progress: impl FnMut(usize, usize)) -> TraceSummary {
    let mut s = TraceSummary {
        disk_size: reader.disk_size(),
        metadata: reader
            .superblock()
            .map(|sb| sb.metadata.clone())
            .unwrap_or_default(),
        ..Default::default()
    };
    let mut digest = TraceDigest::new();
    // Whether the last traced stretch is still open: records that come
    // while tracing is off (probes, captures, samples) may follow its stop.
    let mut stretch_open = false;
    // Whether the last record is tracing stopping: a run killed after that
    // (the guest ran on untraced) lost nothing, as the analyzer also holds.
    let mut ends_with_stop = false;
    let total = reader.segments().len();
    for (i, entry) in reader.segments().iter().enumerate() {
        let h = entry.found.header;
        match &entry.state {
            SegmentState::Good => {}
            SegmentState::Overwritten => {
                s.segments_overwritten += 1;
                continue;
            }
            SegmentState::Torn(why) => {
                s.problems.push(format!(
                    "torn tail: segment {} (steps from {}) was cut short: {why}",
                    h.seq, h.first_step
                ));
                continue;
            }
            SegmentState::Corrupt(why) => {
                s.problems.push(format!(
                    "segment {} at byte {} is damaged ({why}); its {} steps are skipped",
                    h.seq, entry.found.offset, h.steps
                ));
                continue;
            }
        }
        match reader.decode(i) {
            Ok(records) => {
                s.segments_good += 1;
                s.disk_used = s.disk_used.saturating_add(h.total_len());
                let steps = records
                    .iter()
                    .filter(|r| matches!(r, Record::Step(_)))
                    .count() as u64;
                if steps != h.steps {
                    s.problems.push(format!(
                        "segment {}'s header says {} steps but it holds {steps}",
                        h.seq, h.steps
                    ));
                }
                for r in &records {
                    // Where the recorder cut segments, not what the guest
                    // did: left out of the digest and the counts.
                    if matches!(r, Record::Event(Event::Running { .. })) {
                        continue;
                    }
                    digest.update(r);
                    ends_with_stop = matches!(r, Record::Event(Event::TraceStop(_)));
                    match r {
                        Record::Event(Event::TraceStart(_)) => stretch_open = true,
                        Record::Event(Event::TraceStop(_)) => stretch_open = false,
                        // A ring may have overwritten the stretch's start.
                        Record::Step(_) => stretch_open = true,
                        _ => {}
                    }
                    match r {
                        Record::Step(step) => {
                            s.steps += 1;
                            s.first_pc.get_or_insert(step.pc);
                            s.last_pc = Some(step.pc);
                        }
                        Record::Event(e) => {
                            *s.events.entry(event_kind(e)).or_default() += 1;
                            match e {
                                Event::Gap { .. } => s.gaps += 1,
                                Event::TraceStart(r) => s.start_reasons.push(r.clone()),
                                Event::TraceStop(r) => s.stop_reasons.push(r.clone()),
                                _ => {}
                            }
                        }
                    }
                }
            }
            Err(why) => s
                .problems
                .push(format!("segment {} does not decode: {why}", h.seq)),
        }
        progress(i + 1, total);
    }
    s.problems.extend(reader.structural_problems());
    let closed = reader.superblock().is_some_and(|sb| sb.closed);
    s.clean_end = !stretch_open && (closed || reader.superblock().is_none() || ends_with_stop);
    if let Some(writer) = reader.written_by() {
        s.problems.push(format!(
            "the trace is still being written ({writer}): what it holds so far is here, up to \
             the last complete segment"
        ));
    } else if !s.clean_end && (s.segments_good > 0 || !closed) {
        s.problems.push(
            "the VMM did not shut down cleanly (killed?): the trace has no stop record at its \
             end, or its disk was never closed; everything up to the last complete segment \
             is here"
                .into(),
        );
    }
    s.digest = digest.hex();
    s
}
