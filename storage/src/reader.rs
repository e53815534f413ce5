//! Reading a trace disk back: segments in order, each checked, classified
//! and decodable on its own.

use std::path::Path;

use crate::codec::SegmentDecoder;
use crate::disk::{DiskError, DiskScan, FoundSegment, Superblock};
use crate::record::Record;
use crate::segment::unseal;

/// What became of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SegmentState {
    Good,
    /// Partly overwritten by newer segments (`--wrap`): expected, not damage.
    Overwritten,
    /// The newest segment, cut short: the VMM died while writing it.
    Torn(String),
    /// Damaged: a changed byte or a failed write.
    Corrupt(String),
}

/// A segment and its state.
#[derive(Clone, Debug)]
pub struct SegmentEntry {
    pub found: FoundSegment,
    pub state: SegmentState,
}

/// An open trace.
pub struct TraceReader {
    scan: DiskScan,
    segments: Vec<SegmentEntry>,
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

    pub fn superblock(&self) -> Option<&Superblock> {
        self.scan.superblock.as_ref()
    }

    pub fn segments(&self) -> &[SegmentEntry] {
        &self.segments
    }

    /// Size of the disk in bytes.
    pub fn disk_size(&self) -> u64 {
        self.scan.size
    }

    pub fn path(&self) -> &Path {
        &self.scan.path
    }

    /// Sequence numbers between the first and last segment found that no
    /// header claims (a damaged header, or a write that never happened).
    pub fn missing_segments(&self) -> Vec<u64> {
        let seqs: Vec<u64> = self.segments.iter().map(|s| s.found.header.seq).collect();
        seqs.windows(2).flat_map(|w| w[0] + 1..w[1]).collect()
    }

    /// One segment's payload, checked and decompressed. Read it with a
    /// [`SegmentDecoder`] to go through the records one at a time: decoded
    /// all at once, a segment's records take some forty times the
    /// payload's size.
    pub fn payload(&self, index: usize) -> Result<Vec<u8>, String> {
        let entry = self.segments.get(index).ok_or("no such segment")?;
        let stored = self
            .scan
            .read_stored(&entry.found)
            .map_err(|e| e.to_string())?;
        unseal(&entry.found.header, &stored).map_err(|e| e.to_string())
    }

    /// Decodes one segment on its own. Errors say what is wrong with it.
    pub fn decode(&self, index: usize) -> Result<Vec<Record>, String> {
        SegmentDecoder::new(&self.payload(index)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())
    }
}
