//! A trace opened for analysis, and parallel ordered decoding of its
//! segments.

use std::path::Path;
use std::sync::{Arc, Mutex};

use vtrace_storage::SegmentError;
use vtrace_storage::SegmentState;
use vtrace_storage::TraceMetadata;
use vtrace_storage::{DecodeError, RecordRef, SegmentDecoder, TraceReader};

use crate::error::Result;

/// A segment that decodes, and where its steps sit in the trace.
#[derive(Clone, Copy, Debug)]
pub struct SegmentInfo {
    /// Index in the reader's segment list.
    pub index: usize,
    /// Global number of its first step.
    pub first_step: u64,
    /// Steps it holds.
    pub steps: u64,
}

/// Progress of a long analysis: called with (steps done, steps in all).
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// A progress callback that says nothing.
pub fn no_progress(_: u64, _: u64) {}

/// `progress` for pass `pass` (from 0) of `passes` over the whole trace:
/// the passes move it through once.
pub fn pass_progress(
    progress: Progress<'_>,
    pass: u64,
    passes: u64,
) -> impl Fn(u64, u64) + Sync + '_ {
    move |done: u64, total: u64| {
        let before = total.saturating_mul(pass);
        progress(before.saturating_add(done) / passes.max(1), total)
    }
}

/// One segment's records, decoded one at a time as they are read and lent
/// out, so a segment never sits in memory as records and no record is
/// copied. Reading ends at the first record that does not decode;
/// [`for_each_ordered`] then reports the segment as bad.
///
/// [`for_each_ordered`]: Trace::for_each_ordered
pub struct Records<'a> {
    decoder: SegmentDecoder<'a>,
    error: Option<DecodeError>,
}

impl<'a> std::fmt::Debug for Records<'a> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records").finish_non_exhaustive()
    }
}

impl<'a> Records<'a> {
    /// The records of a decompressed segment payload.
    pub fn new(payload: &'a [u8]) -> Self {
        Records {
            decoder: SegmentDecoder::new(payload),
            error: None,
        }
    }

    /// The next record, borrowed until the next call.
    pub fn next_record(&mut self) -> Option<RecordRef<'_>> {
        match self.decoder.next_ref()? {
            Ok(r) => Some(r),
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
    }

    /// Why reading ended early, if it did.
    pub fn error(&self) -> Option<&DecodeError> {
        self.error.as_ref()
    }
}

/// An open trace.
pub struct Trace {
    reader: TraceReader,
    /// What the trace says of its run.
    pub metadata: TraceMetadata,
    /// Good segments in trace order.
    pub segments: Vec<SegmentInfo>,
    /// Segments skipped (damaged, torn, missing), and a run that did not
    /// end cleanly, in words for the user: known once the trace is open.
    pub problems: Vec<String>,
    /// What the analyses found while reading (see [`Trace::damage_found`]).
    found: DamageLog,
    /// The one CPU whose records the analyses read (see
    /// [`Trace::select_cpu`]).
    cpu: Option<u32>,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace").finish_non_exhaustive()
    }
}

/// Damage an analysis passed over while it read a trace, in words for the
/// user; shared, so it can be read after the trace is gone.
pub type DamageLog = Arc<Mutex<Vec<String>>>;

/// Whether the trace's last readable segment ends with tracing stopping.
fn ends_with_a_stop(reader: &TraceReader, last: Option<&SegmentInfo>) -> bool {
    let Some(payload) = last.and_then(|l| reader.payload(l.index).ok()) else {
        return false;
    };
    let mut records = Records::new(&payload);
    let mut stopped = false;
    while let Some(r) = records.next_record() {
        stopped = matches!(r, RecordRef::Event(vtrace_storage::Event::TraceStop(_)));
    }
    stopped && records.error().is_none()
}

/// One segment's result, in trace order.
pub struct Chunk<T> {
    /// The segment.
    pub info: SegmentInfo,
    /// `Err` when the segment's header checked out but its records did
    /// not decode; the analysis goes on past it.
    pub result: Result<T, SegmentError>,
}

impl<T> std::fmt::Debug for Chunk<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunk").finish_non_exhaustive()
    }
}

impl Trace {
    /// Opens the trace at `path` and reads its superblock and segment headers.
    pub fn open(path: &Path) -> Result<Trace> {
        let reader = TraceReader::open(path)?;
        let metadata = TraceMetadata::parse(
            reader
                .superblock()
                .map(|s| s.metadata.as_str())
                .unwrap_or_default(),
        );
        let mut segments = Vec::new();
        let mut problems = Vec::new();
        for (index, entry) in reader.segments().iter().enumerate() {
            let h = entry.found.header;
            match &entry.state {
                SegmentState::Good => segments.push(SegmentInfo {
                    index,
                    first_step: h.first_step,
                    steps: h.steps,
                }),
                SegmentState::Overwritten => {}
                SegmentState::Torn(why) | SegmentState::Corrupt(why) => problems.push(format!(
                    "segment {} (steps {}..{}) is skipped: {why}",
                    h.seq,
                    h.first_step,
                    h.first_step.saturating_add(h.steps)
                )),
            }
        }
        problems.extend(reader.structural_problems());
        let closed = reader.superblock().map(|sb| sb.closed);
        if let Some(writer) = reader.written_by() {
            problems.push(format!(
                "the trace is still being written ({writer}): only what it holds so far, up \
                 to its last complete segment, is here"
            ));
        } else if closed == Some(false) && !ends_with_a_stop(&reader, segments.last()) {
            // Killed after tracing stopped (the guest ran on), a trace
            // has all it recorded: only one cut short is told.
            problems.push(
                "the run that wrote the trace did not end cleanly (killed?): its disk was never \
                 closed, and whatever it had not written out is not here"
                    .to_string(),
            );
        }
        Ok(Trace {
            reader,
            metadata,
            segments,
            problems,
            found: DamageLog::default(),
            cpu: None,
        })
    }

    /// Segments whose records stopped decoding part way, found by the
    /// analyses that read them so far (each once): their steps past the
    /// damage are left out of what those analyses show.
    pub fn damage_found(&self) -> DamageLog {
        Arc::clone(&self.found)
    }

    /// Reads only CPU `cpu`'s records from now on (the analyses that
    /// follow calls and returns, and the listing); an error where the
    /// trace has no such CPU.
    pub fn select_cpu(&mut self, cpu: u32) -> Result<()> {
        let cpus = self.metadata.cpu_count();
        if cpu >= cpus {
            return Err(crate::error::AnalyzeError::NoSuchCpu { asked: cpu, cpus });
        }
        self.cpu = Some(cpu);
        Ok(())
    }

    /// The CPU [`Trace::select_cpu`] chose.
    pub fn selected_cpu(&self) -> Option<u32> {
        self.cpu
    }

    /// For an analysis that follows one CPU's calls and returns: the CPU
    /// whose records to read (`None`: the trace has one CPU), or the error
    /// that asks the user to choose.
    pub fn one_cpu(&self) -> Result<Option<u32>> {
        match (self.cpu, self.metadata.cpu_count()) {
            (Some(cpu), _) => Ok(Some(cpu)),
            (None, 0 | 1) => Ok(None),
            (None, cpus) => Err(crate::error::AnalyzeError::ChooseCpu { cpus }),
        }
    }

    /// For an analysis that adds up passes of one CPU each (a flame
    /// graph, an export): the CPU each pass reads, in order. The selected
    /// CPU alone; else every CPU of a trace of several; else one pass of
    /// every record (`None`).
    pub fn each_cpu(&self) -> Vec<Option<u32>> {
        match (self.cpu, self.metadata.cpu_count()) {
            (Some(cpu), _) => vec![Some(cpu)],
            (None, 0 | 1) => vec![None],
            (None, cpus) => (0..cpus).map(Some).collect(),
        }
    }

    /// The trace's path.
    pub fn path(&self) -> &Path {
        self.reader.path()
    }

    /// Steps in the readable segments.
    pub fn steps(&self) -> u64 {
        self.segments
            .iter()
            .fold(0u64, |sum, s| sum.saturating_add(s.steps))
    }

    /// Number of the first readable step and one past the last.
    pub fn step_range(&self) -> Option<(u64, u64)> {
        let first = self.segments.first()?;
        let last = self.segments.last()?;
        Some((first.first_step, last.first_step.saturating_add(last.steps)))
    }

    fn note_damage(&self, info: &SegmentInfo, e: &SegmentError) {
        let said = format!(
            "the segment of steps {}..{} could not be read whole ({e}): what it holds past \
             the damage is left out",
            info.first_step,
            info.first_step.saturating_add(info.steps)
        );
        let mut found = self.found.lock().unwrap_or_else(|p| p.into_inner());
        if !found.contains(&said) {
            found.push(said);
        }
    }

    /// Runs `work` on the records of one segment: a look-up that decodes
    /// only the segment it needs. `Err` where they do not decode whole.
    pub fn read_segment<T>(
        &self,
        info: &SegmentInfo,
        work: impl FnOnce(&mut Records<'_>) -> T,
    ) -> Result<T, SegmentError> {
        let payload = self.reader.payload(info.index)?;
        let mut records = Records::new(&payload);
        let out = work(&mut records);
        match records.error() {
            None => Ok(out),
            Some(e) => {
                let e = SegmentError::Decode(e.clone());
                self.note_damage(info, &e);
                Err(e)
            }
        }
    }

    /// Runs `work` on the records of each of `segments` in parallel and
    /// hands the results to `consume` in trace order. At most a few
    /// segments are in flight, as payloads and results, so memory does not
    /// grow with the trace. A segment whose records stop decoding part way
    /// gives an `Err` chunk, and `work`'s result for it is dropped.
    pub fn for_each_ordered<T, W, C, E>(
        &self,
        segments: &[SegmentInfo],
        work: W,
        mut consume: C,
        progress: Progress<'_>,
    ) -> Result<(), E>
    where
        T: Send,
        W: Fn(&SegmentInfo, &mut Records<'_>) -> T + Sync,
        C: FnMut(Chunk<T>) -> Result<(), E>,
    {
        let workers = rayon::current_num_threads().max(2);
        let total = segments
            .iter()
            .fold(0u64, |sum, s| sum.saturating_add(s.steps));
        let mut done = 0;
        // None begins more than a worker's count past the segment
        // consumed: a listing's result is about 25 MB of text a segment,
        // an export's rows about as much. One more (measured on a 50.7
        // M-step trace, 2 cores) was no faster and cost the export 15-25
        // MiB of peak RSS.
        crate::ordered::map_in_order(
            segments,
            workers,
            workers,
            |info| Chunk {
                info: *info,
                result: self.reader.payload(info.index).and_then(|payload| {
                    let mut records = Records::new(&payload);
                    let out = work(info, &mut records);
                    match records.error() {
                        None => Ok(out),
                        Some(e) => Err(SegmentError::Decode(e.clone())),
                    }
                }),
            },
            |chunk| {
                if let Err(e) = &chunk.result {
                    self.note_damage(&chunk.info, e);
                }
                done += chunk.info.steps;
                consume(chunk)?;
                progress(done, total);
                Ok(())
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtrace_storage::{CpuMode, InsnBytes, Regs, SegmentEncoder, Step};

    #[test]
    fn records_stop_at_damage_and_say_why() {
        let mut enc = SegmentEncoder::new();
        for i in 0..50 {
            enc.push_step(&Step {
                pc: 0x1000 + i,
                bytes: InsnBytes::new(&[0x90]).expect("one byte"),
                cr3: 0x1000,
                mode: CpuMode::Long64,
                cpl: 0,
                regs: Regs::default(),
            });
        }
        let payload = enc.take();
        let count = |records: &mut Records| {
            let mut n = 0;
            while records.next_record().is_some() {
                n += 1;
            }
            n
        };
        let mut whole = Records::new(&payload);
        assert_eq!(count(&mut whole), 50);
        assert!(whole.error().is_none());

        let cut = &payload[..payload.len() - 1];
        let mut damaged = Records::new(cut);
        let read = count(&mut damaged);
        assert!(read < 50, "{read} records from a cut payload");
        assert!(damaged.error().is_some());
    }
}
