//! What `vtrace info` reports about a trace.

use std::collections::BTreeMap;

use crate::codec::SegmentDecoder;
use crate::digest::TraceDigest;
use crate::reader::{SegmentEntry, SegmentError, SegmentState, TraceReader};
use crate::record::{Event, RecordRef, TraceReason};
use crate::segment::SegmentHeader;

/// Facts about a trace, from reading all of it.
#[derive(Clone, Debug, Default)]
pub struct TraceSummary {
    /// Steps read.
    pub steps: u64,
    /// Steps read, by CPU (one entry, CPU 0, for a trace of one CPU).
    pub steps_by_cpu: BTreeMap<u32, u64>,
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
    /// The CPU each traced stretch started on (where its trigger fired),
    /// in order.
    pub start_cpus: Vec<u32>,
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
        Event::ProbeValues(_) => "probe values",
        Event::MemoryValues(_) => "memory values",
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
        Event::Cpu(_) => "cpu",
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
    let mut ends = Ends::default();
    let total = reader.segments().len();
    for (i, entry) in reader.segments().iter().enumerate() {
        if !s.is_good(entry) {
            continue;
        }
        let h = entry.found.header;
        // Decoded twice, borrowed each time: once to know the whole
        // segment decodes (one that does not is left out whole, as every
        // reader leaves it), then counted. Collecting its records instead
        // moved some 180 bytes a record, most of `info`'s time.
        match reader
            .payload(i)
            .and_then(|payload| decodes(&payload).map(|()| payload))
        {
            Ok(payload) => s.add_segment(&h, &payload, &mut ends),
            Err(why) => s
                .problems
                .push(format!("segment {} does not decode: {why}", h.seq)),
        }
        progress(i + 1, total);
    }
    s.problems.extend(reader.structural_problems());
    s.finish(reader, ends);
    s
}

/// Whether every record of `payload` decodes.
fn decodes(payload: &[u8]) -> Result<(), SegmentError> {
    let mut decoder = SegmentDecoder::new(payload);
    while let Some(r) = decoder.next_ref() {
        r?;
    }
    Ok(())
}

/// What the records say of how the trace ended, and its digest.
#[derive(Default)]
struct Ends {
    digest: TraceDigest,
    /// The last traced stretch is still open: records that come while
    /// tracing is off (probes, captures, samples) may follow its stop.
    stretch_open: bool,
    /// The last record is tracing stopping: a run killed after that (the
    /// guest ran on untraced) lost nothing, as the analyzer also holds.
    ends_with_stop: bool,
}

impl TraceSummary {
    /// Whether the segment is good; a bad one is counted or said.
    fn is_good(&mut self, entry: &SegmentEntry) -> bool {
        let h = entry.found.header;
        match &entry.state {
            SegmentState::Good => return true,
            SegmentState::Overwritten => self.segments_overwritten += 1,
            SegmentState::Torn(why) => self.problems.push(format!(
                "torn tail: segment {} (steps from {}) was cut short: {why}",
                h.seq, h.first_step
            )),
            SegmentState::Corrupt(why) => self.problems.push(format!(
                "segment {} at byte {} is damaged ({why}); its {} steps are skipped",
                h.seq, entry.found.offset, h.steps
            )),
        }
        false
    }

    /// Counts a good segment's records (its `payload`, which decodes) into
    /// the summary and the digest.
    fn add_segment(&mut self, h: &SegmentHeader, payload: &[u8], ends: &mut Ends) {
        self.segments_good += 1;
        self.disk_used = self.disk_used.saturating_add(h.total_len());
        ends.digest.segment_start();
        let mut cpu = 0;
        let mut steps = 0u64;
        let mut decoder = SegmentDecoder::new(payload);
        while let Some(Ok(r)) = decoder.next_ref() {
            // Where the recorder cut segments, not what the guest did:
            // left out of the digest and the counts.
            match r {
                RecordRef::Event(Event::Running { .. }) => continue,
                RecordRef::Event(Event::Cpu(c)) => {
                    ends.digest.update(r);
                    if *c != cpu {
                        cpu = *c;
                        *self.events.entry("cpu").or_default() += 1;
                    }
                    continue;
                }
                RecordRef::Step(_) => {
                    steps += 1;
                    *self.steps_by_cpu.entry(cpu).or_default() += 1;
                }
                RecordRef::Event(_) => {}
            }
            ends.digest.update(r);
            ends.ends_with_stop = matches!(r, RecordRef::Event(Event::TraceStop(_)));
            match r {
                RecordRef::Event(Event::TraceStart(_)) => {
                    ends.stretch_open = true;
                    self.start_cpus.push(cpu);
                }
                RecordRef::Event(Event::TraceStop(_)) => ends.stretch_open = false,
                // A ring may have overwritten the stretch's start.
                RecordRef::Step(_) => ends.stretch_open = true,
                _ => {}
            }
            self.count(r);
        }
        if steps != h.steps {
            self.problems.push(format!(
                "segment {}'s header says {} steps but it holds {steps}",
                h.seq, h.steps
            ));
        }
    }

    /// Counts one record.
    fn count(&mut self, r: RecordRef<'_>) {
        match r {
            RecordRef::Step(step) => {
                self.steps += 1;
                self.first_pc.get_or_insert(step.pc);
                self.last_pc = Some(step.pc);
            }
            RecordRef::Event(e) => {
                *self.events.entry(event_kind(e)).or_default() += 1;
                match e {
                    Event::Gap { .. } => self.gaps += 1,
                    Event::TraceStart(r) => self.start_reasons.push(r.clone()),
                    Event::TraceStop(r) => self.stop_reasons.push(r.clone()),
                    _ => {}
                }
            }
        }
    }

    /// Whether the trace ended cleanly, said where it did not, and the
    /// digest.
    fn finish(&mut self, reader: &TraceReader, ends: Ends) {
        let closed = reader.superblock().is_some_and(|sb| sb.closed);
        self.clean_end =
            !ends.stretch_open && (closed || reader.superblock().is_none() || ends.ends_with_stop);
        if let Some(writer) = reader.written_by() {
            self.problems.push(format!(
                "the trace is still being written ({writer}): what it holds so far is here, up \
                 to the last complete segment"
            ));
        } else if !self.clean_end && (self.segments_good > 0 || !closed) {
            self.problems.push(
                "the VMM did not shut down cleanly (killed?): the trace has no stop record at \
                 its end, or its disk was never closed; everything up to the last complete \
                 segment is here"
                    .into(),
            );
        }
        self.digest = ends.digest.hex();
    }
}
