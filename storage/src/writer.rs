//! The writer thread and the recorder that feeds it.
//!
//! The vCPU thread encodes records into a raw chunk ([`Recorder`]); full
//! chunks go through a bounded queue to a writer thread that compresses and
//! writes them. The vCPU thread never does disk I/O; when the writer falls
//! behind, the queue fills and the vCPU waits (back-pressure). Nothing is
//! dropped: without `--wrap`, the recorder reports "nearly full" early enough
//! that every queued chunk and a final one still fit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::codec::SegmentEncoder;
use crate::disk::{Appended, DiskError, DiskWriter};
use crate::record::{Event, Record, Step};
use crate::segment::{seal, HEADER_LEN};

/// Chunks that may wait for the writer before the vCPU blocks.
const QUEUE_DEPTH: usize = 4;

struct Chunk {
    raw: Vec<u8>,
    seq: u64,
    first_step: u64,
    steps: u64,
    events: u64,
}

#[derive(Default)]
struct Shared {
    /// Chunks handed to the writer and chunks it has finished with.
    sent: AtomicU64,
    done: AtomicU64,
    slots_free: AtomicU64,
    slots_used: AtomicU64,
    segments: AtomicU64,
    stored_bytes: AtomicU64,
    dropped_chunks: AtomicU64,
}

/// What the writer did, when it is done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterReport {
    pub segments: u64,
    /// Compressed bytes written, headers included.
    pub stored_bytes: u64,
    pub slots_used: u64,
    /// Chunks that did not fit (only if the recorder was ignored when it
    /// said the disk is nearly full; reported, never silent).
    pub dropped_chunks: u64,
}

/// Encodes records on the vCPU thread and hands chunks to the writer.
pub struct Recorder {
    encoder: SegmentEncoder,
    chunk_target: usize,
    tx: Option<SyncSender<Chunk>>,
    writer: Option<JoinHandle<Result<(), DiskError>>>,
    shared: Arc<Shared>,
    wrap: bool,
    slot_size: u64,
    seq: u64,
    next_step: u64,
    chunk_first_step: u64,
}

impl Recorder {
    /// Starts the writer thread on `disk`.
    pub fn start(disk: DiskWriter) -> Recorder {
        let sb = disk.superblock().clone();
        // A raw chunk of one slot (less the header) compresses into at most
        // a little more than a slot: worst case two slots.
        let chunk_target = sb.slot_size as usize - HEADER_LEN - 256;
        let shared = Arc::new(Shared::default());
        shared.slots_free.store(sb.slot_count, Ordering::Relaxed);
        let (tx, rx) = sync_channel(QUEUE_DEPTH);
        let worker = shared.clone();
        let writer = std::thread::Builder::new()
            .name("vtrace-writer".into())
            .spawn(move || write_loop(disk, rx, &worker))
            .ok();
        Recorder {
            encoder: SegmentEncoder::new(),
            chunk_target,
            tx: Some(tx),
            writer,
            shared,
            wrap: sb.wrap,
            slot_size: u64::from(sb.slot_size),
            seq: 0,
            next_step: 0,
            chunk_first_step: 0,
        }
    }

    pub fn step(&mut self, step: &Step) {
        self.encoder.push_step(step);
        self.next_step += 1;
        if self.encoder.len() >= self.chunk_target {
            self.flush();
        }
    }

    pub fn event(&mut self, event: &Event) {
        self.encoder.push_event(event);
        if self.encoder.len() >= self.chunk_target {
            self.flush();
        }
    }

    pub fn record(&mut self, record: &Record) {
        match record {
            Record::Step(s) => self.step(s),
            Record::Event(e) => self.event(e),
        }
    }

    /// Steps recorded so far.
    pub fn steps(&self) -> u64 {
        self.next_step
    }

    /// True when, without wrap, the disk can only take the chunks in flight,
    /// the one being filled and one more (where the stop record may land):
    /// time to stop tracing (and record why).
    pub fn nearly_full(&self) -> bool {
        if self.wrap {
            return false;
        }
        // A chunk of one slot's raw bytes never compresses into more than
        // two slots.
        let per_chunk = 2u64.max((self.chunk_target as u64 + 1024).div_ceil(self.slot_size));
        let s = &self.shared;
        let in_flight = s.sent.load(Ordering::Acquire) - s.done.load(Ordering::Acquire);
        s.slots_free.load(Ordering::Acquire) < per_chunk * (in_flight + 2)
    }

    /// Sends the current chunk to the writer (blocks if the queue is full).
    pub fn flush(&mut self) {
        if self.encoder.is_empty() {
            return;
        }
        let (steps, events) = (self.encoder.steps(), self.encoder.events());
        let chunk = Chunk {
            raw: self.encoder.take(),
            seq: self.seq,
            first_step: self.chunk_first_step,
            steps,
            events,
        };
        self.seq += 1;
        self.chunk_first_step = self.next_step;
        self.shared.sent.fetch_add(1, Ordering::AcqRel);
        let sent = self
            .tx
            .as_ref()
            .map(|tx| tx.send(chunk).is_ok())
            .unwrap_or(false);
        if !sent {
            self.shared.dropped_chunks.fetch_add(1, Ordering::Relaxed);
            self.shared.done.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Flushes and waits until the writer has written everything handed
    /// to it (into the host's page cache: it survives the process being
    /// killed). For a stop after which the guest may run on for long.
    pub fn flush_and_wait(&mut self) {
        self.flush();
        let s = &self.shared;
        while s.done.load(Ordering::Acquire) < s.sent.load(Ordering::Acquire) {
            // A writer that died never catches up.
            if self.writer.as_ref().is_none_or(|w| w.is_finished()) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Flushes, waits for the writer and syncs the disk.
    pub fn finish(mut self) -> Result<WriterReport, DiskError> {
        self.flush();
        drop(self.tx.take());
        if let Some(w) = self.writer.take() {
            match w.join() {
                Ok(result) => result?,
                Err(_) => {
                    return Err(DiskError::Io {
                        path: Default::default(),
                        source: std::io::Error::other("the trace writer thread panicked"),
                    })
                }
            }
        }
        let s = &self.shared;
        Ok(WriterReport {
            segments: s.segments.load(Ordering::Relaxed),
            stored_bytes: s.stored_bytes.load(Ordering::Relaxed),
            slots_used: s.slots_used.load(Ordering::Relaxed),
            dropped_chunks: s.dropped_chunks.load(Ordering::Relaxed),
        })
    }
}

fn write_loop(mut disk: DiskWriter, rx: Receiver<Chunk>, shared: &Shared) -> Result<(), DiskError> {
    let mut result = Ok(());
    for chunk in rx {
        let sealed = seal(
            &chunk.raw,
            chunk.seq,
            chunk.first_step,
            chunk.steps,
            chunk.events,
        );
        match disk.append(&sealed) {
            Ok(Appended::At { .. }) => {
                shared.segments.fetch_add(1, Ordering::Relaxed);
                shared
                    .stored_bytes
                    .fetch_add(sealed.len() as u64, Ordering::Relaxed);
            }
            Ok(Appended::Full) => {
                shared.dropped_chunks.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                // Keep draining so the vCPU never blocks on a dead writer.
                shared.dropped_chunks.fetch_add(1, Ordering::Relaxed);
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        shared
            .slots_free
            .store(disk.slots_free(), Ordering::Release);
        shared
            .slots_used
            .store(disk.slots_used(), Ordering::Relaxed);
        shared.done.fetch_add(1, Ordering::AcqRel);
    }
    disk.sync()?;
    result
}
