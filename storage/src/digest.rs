//! A content digest of decoded records: equal digests mean equal traces,
//! however the records were cut into segments or compressed.

use crate::codec::SegmentEncoder;
use crate::record::{Event, RecordRef, REG_COUNT};

/// Bytes gathered before they are hashed (see [`TraceDigest`]).
const PENDING: usize = 256 << 10;

/// Accumulates records into a BLAKE3 digest.
///
/// A record's bytes are gathered into `pending` and hashed a few hundred
/// kilobytes at a time: BLAKE3 hashes a long input several times as fast
/// as the same bytes given in 170-byte updates (it spreads whole chunks
/// over SIMD lanes), and the digest of a stream does not depend on how it
/// was cut into updates.
pub struct TraceDigest {
    hasher: blake3::Hasher,
    pending: Vec<u8>,
    scratch: SegmentEncoder,
    /// The CPU of the records now (see [`TraceDigest::segment_start`]).
    cpu: u32,
}

impl std::fmt::Debug for TraceDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceDigest").finish_non_exhaustive()
    }
}

impl Default for TraceDigest {
    fn default() -> Self {
        Self::new()
    }
}

impl TraceDigest {
    /// A digest of no records.
    pub fn new() -> Self {
        TraceDigest {
            hasher: blake3::Hasher::new(),
            pending: Vec::with_capacity(PENDING + 1024),
            scratch: SegmentEncoder::new(),
            cpu: 0,
        }
    }

    /// A segment starts: its records are CPU 0's until an
    /// [`Event::Cpu`] says otherwise.
    pub fn segment_start(&mut self) {
        self.cpu = 0;
    }

    /// Adds a record. Where the CPUs' records interleave is in the digest,
    /// not where segments begin: the CPU events are not hashed, and each
    /// record of a CPU other than 0 is hashed with its CPU number (a trace
    /// of one CPU hashes as it always did).
    ///
    /// Recorded memory values ([`Event::MemoryValues`]) are not hashed
    /// either: they observe the run, they are not part of it, so a trace
    /// made with `--record-values` has the digest of one made without.
    pub fn update(&mut self, record: RecordRef<'_>) {
        match record {
            RecordRef::Event(Event::Cpu(cpu)) => {
                self.cpu = *cpu;
                return;
            }
            RecordRef::Event(Event::MemoryValues(_)) => return,
            _ => {}
        }
        if self.pending.len() >= PENDING {
            self.hasher.update(&self.pending);
            self.pending.clear();
        }
        if self.cpu != 0 {
            self.pending.push(0xff);
            self.pending.extend_from_slice(&self.cpu.to_le_bytes());
        }
        match record {
            RecordRef::Step(s) => {
                // Full state, not deltas: independent of segment boundaries.
                let mut b = [0u8; 8 + 1 + 15 + 8 + 2 + 8 * REG_COUNT];
                b[0..8].copy_from_slice(&s.pc.to_le_bytes());
                b[8] = s.bytes.len_byte();
                b[9..9 + s.bytes.len()].copy_from_slice(s.bytes.as_slice());
                b[24..32].copy_from_slice(&s.cr3.to_le_bytes());
                b[32] = s.mode as u8;
                b[33] = s.cpl;
                for i in 0..REG_COUNT {
                    b[34 + 8 * i..42 + 8 * i].copy_from_slice(&s.regs.get(i).to_le_bytes());
                }
                self.pending.push(0);
                self.pending.extend_from_slice(&b);
            }
            RecordRef::Event(e) => {
                // Event encodings carry no delta state: they are canonical.
                self.scratch.push_event(e);
                self.pending.extend_from_slice(&self.scratch.take());
            }
        }
    }

    /// Hex of the first 128 bits.
    pub fn hex(&self) -> String {
        let mut hasher = self.hasher.clone();
        hasher.update(&self.pending);
        hasher.finalize().to_hex()[..32].to_string()
    }
}
