//! A segment on disk: a fixed 64-byte header, then the zstd-compressed
//! payload. The header has its own CRC (so a scan can tell a header from
//! stale bytes) and the payload's CRC (so a torn or flipped payload is
//! reported with its segment, not decoded into nonsense).

/// First bytes of every segment header.
pub const MAGIC: [u8; 4] = *b"VTSG";
/// Size of the header.
pub const HEADER_LEN: usize = 64;
const VERSION: u16 = 1;

/// How hard segments are compressed. The reader does not care: zstd
/// decompresses every level at the same speed (about 1.4 GB/s of records
/// here), so this trades the writer thread's time against disk only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// zstd level 3: about 500 MB/s of raw records on one x86-64 core;
    /// the demo OS's trace takes 1.38 bytes a step.
    Fast,
    /// zstd level 17: about 11 MB/s of raw records, some 60 times what
    /// stepping makes (about 6 bytes a step at 130 k steps/s); the demo
    /// OS's trace takes 1.16 bytes a step. Levels 18 to 22 gain 1 % more
    /// at a third less speed; 16 loses 4 %. Where the recorder makes more
    /// than the writer keeps up with at 17 (the engine, tens of times
    /// stepping's rate), the writer steps down to faster levels (13, 9, 6,
    /// 3) while it falls behind and back up while it keeps up: a trace's
    /// size then depends on the host's speed, its records never.
    Dense,
}

impl Compression {
    /// Dense where the writer thread has a CPU of its own (two or more for
    /// this process), else fast: on one CPU the writer's time is taken
    /// from stepping.
    pub fn for_this_host() -> Compression {
        Compression::beside_threads(1)
    }

    /// Dense where the host has a CPU left for the writer thread beside
    /// `stepping` threads that enter vCPUs at once (two where a traced
    /// machine of several CPUs runs two CPUs' steps together), else fast.
    pub fn beside_threads(stepping: usize) -> Compression {
        match std::thread::available_parallelism() {
            Ok(n) if n.get() > stepping => Compression::Dense,
            _ => Compression::Fast,
        }
    }

    /// The zstd levels the writer may use, densest first.
    pub(crate) fn levels(self) -> &'static [i32] {
        match self {
            Compression::Fast => &[3],
            Compression::Dense => &[17, 13, 9, 6, 3],
        }
    }

    /// Which of [`Compression::levels`] the writer takes for its next
    /// segment, after `rung` and with `waiting` segments queued behind
    /// the one it just wrote: one faster where two wait (it falls behind),
    /// the fastest where more do (the recorder is about to wait for it),
    /// one denser where none does (it keeps up).
    pub(crate) fn next_rung(self, rung: usize, waiting: u64) -> usize {
        let last = self.levels().len() - 1;
        match waiting {
            0 => rung.saturating_sub(1),
            1 => rung.min(last),
            2 => (rung + 1).min(last),
            _ => last,
        }
    }
}

/// What a segment header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Order of the segment in the trace (0, 1, 2, ...).
    pub seq: u64,
    /// Index of its first step in the whole trace.
    pub first_step: u64,
    /// Steps it holds.
    pub steps: u64,
    /// Events it holds.
    pub events: u64,
    /// Its payload before compression.
    pub raw_len: u32,
    /// Its payload after compression.
    pub stored_len: u32,
    /// CRC32C of the stored payload.
    pub payload_crc: u32,
}

impl SegmentHeader {
    /// Bytes the segment takes on disk.
    pub fn total_len(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.stored_len)
    }

    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC);
        h[4..6].copy_from_slice(&VERSION.to_le_bytes());
        h[8..16].copy_from_slice(&self.seq.to_le_bytes());
        h[16..24].copy_from_slice(&self.first_step.to_le_bytes());
        h[24..32].copy_from_slice(&self.steps.to_le_bytes());
        h[32..40].copy_from_slice(&self.events.to_le_bytes());
        h[40..44].copy_from_slice(&self.raw_len.to_le_bytes());
        h[44..48].copy_from_slice(&self.stored_len.to_le_bytes());
        h[48..52].copy_from_slice(&self.payload_crc.to_le_bytes());
        let crc = crc32c::crc32c(&h[..60]);
        h[60..64].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Parses a header; `None` if these bytes are not one (no magic, or its
    /// CRC does not match: an empty slot, stale data, or a torn write).
    pub fn decode(h: &[u8]) -> Option<SegmentHeader> {
        let h = h.get(..HEADER_LEN)?;
        let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap_or([0; 8]));
        if h[0..4] != MAGIC || crc32c::crc32c(&h[..60]) != u32_at(60) {
            return None;
        }
        if u16::from_le_bytes([h[4], h[5]]) != VERSION {
            return None;
        }
        // Bounds for readers: a crafted header must not make them allocate
        // more than a real segment could need.
        if u32_at(40) > MAX_SEGMENT_LEN || u32_at(44) > MAX_SEGMENT_LEN {
            return None;
        }
        Some(SegmentHeader {
            seq: u64_at(8),
            first_step: u64_at(16),
            steps: u64_at(24),
            events: u64_at(32),
            raw_len: u32_at(40),
            stored_len: u32_at(44),
            payload_crc: u32_at(48),
        })
    }
}

/// The largest raw or stored payload a segment header may claim: far
/// above the largest segment size (64 MiB) plus a record.
pub const MAX_SEGMENT_LEN: u32 = 1 << 27;

/// Why a segment's payload could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// The stored bytes do not match their checksum.
    #[error("payload checksum mismatch (a torn write or a changed byte)")]
    Checksum,
    /// zstd refused the stored bytes (its message).
    #[error("payload does not decompress: {0}")]
    Decompress(String),
    /// The payload decompressed to another length than its header says.
    #[error("payload decompresses to {got} bytes, header says {want}")]
    Length {
        /// Bytes it decompressed to.
        got: usize,
        /// Bytes the header says.
        want: usize,
    },
}

/// Compresses `raw` (fast) and frames it as segment `seq`.
pub fn seal(raw: &[u8], seq: u64, first_step: u64, steps: u64, events: u64) -> Vec<u8> {
    seal_with(Compression::Fast, raw, seq, first_step, steps, events)
}

/// Compresses `raw` as `compression` says and frames it as segment `seq`.
pub fn seal_with(
    compression: Compression,
    raw: &[u8],
    seq: u64,
    first_step: u64,
    steps: u64,
    events: u64,
) -> Vec<u8> {
    seal_at_level(compression.levels()[0], raw, seq, first_step, steps, events)
}

/// [`seal_with`] at zstd level `level`.
pub(crate) fn seal_at_level(
    level: i32,
    raw: &[u8],
    seq: u64,
    first_step: u64,
    steps: u64,
    events: u64,
) -> Vec<u8> {
    // zstd on an in-memory buffer only fails on allocation failure.
    let stored = zstd::bulk::compress(raw, level).unwrap_or_else(|_| raw.to_vec());
    let header = SegmentHeader {
        seq,
        first_step,
        steps,
        events,
        // A segment is cut at a u32 size: these fit (and a header that
        // lied would be caught by the reader, not cut short here).
        raw_len: u32::try_from(raw.len()).unwrap_or(u32::MAX),
        stored_len: u32::try_from(stored.len()).unwrap_or(u32::MAX),
        payload_crc: crc32c::crc32c(&stored),
    };
    let mut out = Vec::with_capacity(HEADER_LEN + stored.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(&stored);
    out
}

/// Checks and decompresses a payload read after `header`.
pub fn unseal(header: &SegmentHeader, stored: &[u8]) -> Result<Vec<u8>, PayloadError> {
    if crc32c::crc32c(stored) != header.payload_crc {
        return Err(PayloadError::Checksum);
    }
    let want = header.raw_len as usize;
    let raw = zstd::bulk::decompress(stored, want)
        .map_err(|e| PayloadError::Decompress(e.to_string()))?;
    if raw.len() != want {
        return Err(PayloadError::Length {
            got: raw.len(),
            want,
        });
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_steps_down_while_it_falls_behind_and_back_while_it_keeps_up() {
        let dense = Compression::Dense;
        let last = dense.levels().len() - 1;
        assert_eq!(dense.levels()[0], 17, "densest first");
        assert_eq!(dense.next_rung(0, 0), 0, "keeping up at the densest");
        assert_eq!(dense.next_rung(0, 1), 0, "one waiting: it holds");
        assert_eq!(dense.next_rung(0, 2), 1, "two waiting: faster");
        assert_eq!(dense.next_rung(0, 3), last, "more: the fastest at once");
        assert_eq!(dense.next_rung(last, 4), last, "no faster than the fastest");
        assert_eq!(dense.next_rung(3, 0), 2, "none waiting: denser again");
        assert_eq!(Compression::Fast.next_rung(0, 4), 0, "fast has one level");
        let levels = dense.levels();
        assert!(levels.windows(2).all(|w| w[0] > w[1]), "{levels:?}");
    }

    #[test]
    fn seal_then_unseal() {
        let raw: Vec<u8> = (0..10_000u32).map(|i| (i % 7) as u8).collect();
        let sealed = seal(&raw, 3, 1000, 50, 2);
        let header = SegmentHeader::decode(&sealed).unwrap();
        assert_eq!(
            (header.seq, header.first_step, header.steps, header.events),
            (3, 1000, 50, 2)
        );
        assert!(header.stored_len < 1000, "compressed");
        assert_eq!(unseal(&header, &sealed[HEADER_LEN..]).unwrap(), raw);
    }

    #[test]
    fn damage_is_detected() {
        let raw = vec![1u8; 4096];
        let sealed = seal(&raw, 0, 0, 1, 0);
        let mut bad_header = sealed.clone();
        bad_header[20] ^= 1;
        assert_eq!(SegmentHeader::decode(&bad_header), None);
        let header = SegmentHeader::decode(&sealed).unwrap();
        let mut bad_payload = sealed[HEADER_LEN..].to_vec();
        bad_payload[3] ^= 0x10;
        assert_eq!(unseal(&header, &bad_payload), Err(PayloadError::Checksum));
        assert_eq!(SegmentHeader::decode(&[0u8; 64]), None, "an empty slot");
    }
}
