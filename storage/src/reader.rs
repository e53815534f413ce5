//! Reading a trace disk back: segments in order, each checked, classified
//! and decodable on its own.

use std::path::Path;

use crate::codec::{DecodeError, SegmentDecoder};
use crate::disk::{DiskError, DiskScan, FoundSegment, Superblock};
use crate::metadata::TraceMetadata;
use crate::record::Record;
use crate::segment::{unseal, PayloadError};

/// What became of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SegmentState {
    /// Read and checked.
    Good,
    /// Partly overwritten by newer segments (`--wrap`): expected, not damage.
    Overwritten,
    /// The newest segment, cut short: the VMM died while writing it.
    Torn(String),
    /// Damaged: a changed byte or a failed write.
    Corrupt(String),
}

/// Why a segment could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// No segment has that index.
    #[error("no segment {0}")]
    NoSuchSegment(usize),
    /// Its bytes could not be read from the disk.
    #[error("reading the segment: {0}")]
    Read(#[from] std::io::Error),
    /// Its payload is damaged or does not decompress.
    #[error(transparent)]
    Payload(#[from] PayloadError),
    /// Its records do not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// A segment and its state.
#[derive(Clone, Debug)]
pub struct SegmentEntry {
    /// Where it is and what its header says.
    pub found: FoundSegment,
    /// What became of it.
    pub state: SegmentState,
}

/// An open trace.
pub struct TraceReader {
    scan: DiskScan,
    segments: Vec<SegmentEntry>,
}

impl std::fmt::Debug for TraceReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceReader").finish_non_exhaustive()
    }
}

fn overlaps(a: &FoundSegment, b: &FoundSegment) -> bool {
    let (a0, a1) = (a.offset, a.offset + a.header.total_len());
    let (b0, b1) = (b.offset, b.offset + b.header.total_len());
    a0 < b1 && b0 < a1
}

impl TraceReader {
    /// Opens and checks every segment of the trace at `path`.
    pub fn open(path: &Path) -> Result<TraceReader, DiskError> {
        let scan = DiskScan::open(path)?;
        let newest = scan.segments.last().map(|s| s.header.seq);
        let mut segments = Vec::with_capacity(scan.segments.len());
        for found in &scan.segments {
            let problem = match scan.read_stored(found) {
                Ok(stored) => unseal(&found.header, &stored).err().map(|e| e.to_string()),
                Err(e) => Some(e.to_string()),
            };
            let state = match problem {
                None => SegmentState::Good,
                Some(_)
                    if scan
                        .segments
                        .iter()
                        .any(|o| o.header.seq > found.header.seq && overlaps(o, found)) =>
                {
                    SegmentState::Overwritten
                }
                Some(p) if Some(found.header.seq) == newest => SegmentState::Torn(p),
                Some(p) => SegmentState::Corrupt(p),
            };
            segments.push(SegmentEntry {
                found: *found,
                state,
            });
        }
        Ok(TraceReader { scan, segments })
    }

    /// Who is writing the trace as it is read, if a run is (see
    /// [`DiskScan::written_by`]).
    pub fn written_by(&self) -> Option<&str> {
        self.scan.written_by.as_deref()
    }

    /// The superblock, where one was found.
    pub fn superblock(&self) -> Option<&Superblock> {
        self.scan.superblock.as_ref()
    }

    /// The segments found, in trace order.
    pub fn segments(&self) -> &[SegmentEntry] {
        &self.segments
    }

    /// Size of the disk in bytes.
    pub fn disk_size(&self) -> u64 {
        self.scan.size
    }

    /// The trace disk's path.
    pub fn path(&self) -> &Path {
        &self.scan.path
    }

    /// Runs of sequence numbers no header claims, as inclusive ranges:
    /// between the segments found, and before the first where the trace
    /// must start at segment 0 (not `--wrap`). A damaged header, or a
    /// write that never happened. Ranges, not numbers: a crafted header
    /// may claim any sequence number.
    pub fn missing_segments(&self) -> Vec<(u64, u64)> {
        let seqs = self.segments.iter().map(|s| s.found.header.seq);
        let mut missing = Vec::new();
        let mut expected = if self.wraps() { None } else { Some(0u64) };
        for seq in seqs {
            if let Some(want) = expected {
                if seq > want {
                    missing.push((want, seq - 1));
                }
            }
            expected = seq.checked_add(1);
        }
        missing
    }

    /// Whether the trace was written with `--wrap` (or may have been: the
    /// superblock that would say is lost).
    pub fn wraps(&self) -> bool {
        self.scan.superblock.as_ref().is_none_or(|s| s.wrap)
    }

    /// Steps the segment headers say are missing between consecutive segments
    /// (each segment starts where the one before ended).
    fn step_gaps(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let headers: Vec<_> = self.segments().iter().map(|e| e.found.header).collect();
        for pair in headers.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.seq == a.seq {
                problems.push(format!("two segments claim number {}", a.seq));
                continue;
            }
            if b.seq != a.seq.saturating_add(1) {
                continue; // Told as missing segments.
            }
            match a.first_step.checked_add(a.steps) {
                Some(end) if end == b.first_step => {}
                _ => problems.push(format!(
                    "segment {} starts at step {} but segment {} ends at step {}+{}: the trace is \
                     not contiguous there",
                    b.seq, b.first_step, a.seq, a.first_step, a.steps
                )),
            }
        }
        if let (Some(first), false) = (headers.first(), self.wraps()) {
            if first.seq == 0 && first.first_step != 0 {
                problems.push(format!(
                    "segment 0 starts at step {}, not 0: the trace's beginning is lost",
                    first.first_step
                ));
            }
        }
        problems
    }

    /// What is wrong with the trace's structure, in words for the user:
    /// missing segments, steps missing between segments, a lost or
    /// damaged superblock. Damaged segments are told by their state.
    pub fn structural_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (first, last) in self.missing_segments() {
            problems.push(if first == last {
                format!("segment {first} is missing (its header is damaged or was never written)")
            } else {
                format!(
                    "segments {first} to {last} are missing (their headers are damaged or were \
                     never written)"
                )
            });
        }
        problems.extend(self.step_gaps());
        if let Some(sb) = self.superblock().filter(|sb| sb.closed && !sb.wrap) {
            let found = self.segments.len() as u64;
            if found < sb.segments {
                problems.push(format!(
                    "{} of the {} segments written are not on the disk (damaged or \
                     overwritten): {} steps were written",
                    sb.segments - found,
                    sb.segments,
                    sb.steps
                ));
            }
        }
        match self.superblock() {
            Some(sb) => problems.extend(TraceMetadata::parse(&sb.metadata).cpus_problem()),
            None if self.superblock_damaged() => problems.push(
                "the superblock is damaged: the trace's metadata (guest, kernel, clock) is \
                 lost, so the analyzer finds no symbols by itself (give them with --symbols)"
                    .into(),
            ),
            None => {
                problems.push("the disk has no superblock: the trace's metadata is lost".into())
            }
        }
        problems
    }

    /// The disk starts with a superblock that does not check out.
    pub fn superblock_damaged(&self) -> bool {
        self.scan.superblock_damaged
    }

    /// One segment's payload, checked and decompressed. Read it with a
    /// [`SegmentDecoder`] to go through the records one at a time: decoded
    /// all at once, a segment's records take some forty times the
    /// payload's size.
    pub fn payload(&self, index: usize) -> Result<Vec<u8>, SegmentError> {
        let entry = self
            .segments
            .get(index)
            .ok_or(SegmentError::NoSuchSegment(index))?;
        let stored = self.scan.read_stored(&entry.found)?;
        Ok(unseal(&entry.found.header, &stored)?)
    }

    /// Decodes one segment on its own. Errors say what is wrong with it.
    pub fn decode(&self, index: usize) -> Result<Vec<Record>, SegmentError> {
        Ok(SegmentDecoder::new(&self.payload(index)?).collect::<Result<Vec<_>, _>>()?)
    }
}
