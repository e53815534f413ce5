//! The writer thread and the recorder that feeds it.
//!
//! The vCPU thread encodes records into a raw chunk ([`Recorder`]); full
//! chunks go through a bounded queue to a writer thread that compresses and
//! writes them. The vCPU thread never does disk I/O; when the writer falls
//! behind, the queue fills and the vCPU waits (back-pressure). Nothing is
//! dropped: without `--wrap`, the recorder reports "nearly full" early enough
//! that every queued chunk and a final one still fit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::codec::SegmentEncoder;
use crate::disk::{Appended, DiskError, DiskWriter, BLOCK};
use crate::record::{Event, Record, Step};
use crate::segment::{seal_at_level, Compression, HEADER_LEN};

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
    blocks_free: AtomicU64,
    blocks_used: AtomicU64,
    segments: AtomicU64,
    stored_bytes: AtomicU64,
    dropped_chunks: AtomicU64,
    /// Set by [`Recorder::finish`]: the writer closes the disk (see
    /// [`DiskWriter::close`]) only when everything was handed to it.
    finishing: AtomicBool,
}

/// What the writer did, when it is done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterReport {
    /// Segments written.
    pub segments: u64,
    /// Compressed bytes written, headers included.
    pub stored_bytes: u64,
    /// Blocks of the disk that hold segments.
    pub blocks_used: u64,
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
    /// Blocks a sealed chunk can take at most (for `nearly_full`).
    blocks_per_chunk: u64,
    /// Blocks of the disk, for [`Recorder::disk_fill`].
    blocks_total: u64,
    seq: u64,
    next_step: u64,
    chunk_first_step: u64,
    /// Each CPU's running task as the events so far name it, by CPU, to
    /// open every chunk with ([`Event::Running`]).
    running: Vec<Option<Event>>,
    /// The CPU of the records (see [`Event::Cpu`]), to open every chunk
    /// with where it is not 0.
    cpu: u32,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").finish_non_exhaustive()
    }
}

impl Recorder {
    /// Starts the writer thread on `disk`, compressing as
    /// [`Compression::for_this_host`] says.
    pub fn start(disk: DiskWriter) -> Recorder {
        Recorder::start_with(disk, Compression::for_this_host())
    }

    /// Starts the writer thread on `disk`, compressing as `compression`
    /// says.
    pub fn start_with(disk: DiskWriter, compression: Compression) -> Recorder {
        let sb = disk.superblock().clone();
        let chunk_target = sb.segment_size as usize - HEADER_LEN - 256;
        // A chunk is cut once it reaches the target; the record that
        // crossed it adds at most a few KiB (a LOG), and zstd grows
        // incompressible data by less than 1 %.
        let worst = (chunk_target as u64 + 8192) * 101 / 100 + HEADER_LEN as u64;
        let shared = Arc::new(Shared::default());
        shared.blocks_free.store(sb.block_count, Ordering::Relaxed);
        let (tx, rx) = sync_channel(QUEUE_DEPTH);
        let worker = shared.clone();
        let writer = std::thread::Builder::new()
            .name("vtrace-writer".into())
            .spawn(move || write_loop(disk, rx, &worker, compression))
            .ok();
        Recorder {
            encoder: SegmentEncoder::new(),
            chunk_target,
            tx: Some(tx),
            writer,
            shared,
            wrap: sb.wrap,
            blocks_per_chunk: worst.div_ceil(BLOCK),
            blocks_total: sb.block_count,
            seq: 0,
            next_step: 0,
            chunk_first_step: 0,
            running: Vec::new(),
            cpu: 0,
        }
    }

    /// Records a step.
    pub fn step(&mut self, step: &Step) {
        if self.encoder.is_empty() {
            self.open_chunk();
        }
        self.encoder.push_step(step);
        self.next_step += 1;
        if self.encoder.len() >= self.chunk_target {
            self.flush();
        }
    }

    /// Records an event. An [`Event::Cpu`] that names the CPU already
    /// current is left out.
    pub fn event(&mut self, event: &Event) {
        if let Event::Cpu(cpu) = event {
            if *cpu == self.cpu {
                return;
            }
            self.cpu = *cpu;
            if self.encoder.is_empty() {
                // The chunk opens with it.
                self.open_chunk();
                return;
            }
        }
        if self.encoder.is_empty() {
            self.open_chunk();
        }
        self.follow_task(event);
        self.encoder.push_event(event);
        // A step's memory values stay in its segment: the analyzer gives
        // them to the step that follows them.
        if self.encoder.len() >= self.chunk_target && !matches!(event, Event::MemoryValues(_)) {
            self.flush();
        }
    }

    /// Records a step or an event.
    pub fn record(&mut self, record: &Record) {
        match record {
            Record::Step(s) => self.step(s),
            Record::Event(e) => self.event(e),
        }
    }

    /// Starts a chunk with each CPU's running task where one is known,
    /// the other CPUs' each after its CPU event, then the current CPU
    /// where it is not 0 or another was named, and its running task. A
    /// one-CPU trace opens a chunk with its running task only.
    fn open_chunk(&mut self) {
        let current = usize::try_from(self.cpu).unwrap_or(usize::MAX);
        let mut named_another = false;
        for (cpu, running) in self.running.iter().enumerate() {
            let (Some(running), Ok(number)) = (running, u32::try_from(cpu)) else {
                continue;
            };
            if cpu != current {
                self.encoder.push_event(&Event::Cpu(number));
                self.encoder.push_event(running);
                named_another = true;
            }
        }
        if self.cpu != 0 || named_another {
            self.encoder.push_event(&Event::Cpu(self.cpu));
        }
        if let Some(Some(running)) = self.running.get(current) {
            self.encoder.push_event(running);
        }
    }

    /// Keeps [`Recorder::running`] up to date: a switch names the current
    /// CPU's task, a rename renames the task wherever it runs.
    fn follow_task(&mut self, event: &Event) {
        match event {
            Event::Task { tid, pid, comm } if self.cpu < crate::record::MAX_CPUS => {
                let slot = self.cpu as usize;
                if self.running.len() <= slot {
                    self.running.resize(slot + 1, None);
                }
                self.running[slot] = Some(Event::Running {
                    tid: *tid,
                    pid: *pid,
                    comm: comm.clone(),
                });
            }
            Event::TaskName { tid, comm } => {
                for running in self.running.iter_mut().flatten() {
                    if let Event::Running {
                        tid: runs,
                        comm: name,
                        ..
                    } = running
                    {
                        if runs == tid {
                            name.clone_from(comm);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// Bytes of the disk that hold segments written so far, and its size
    /// (a ring stays full once it wrapped).
    pub fn disk_fill(&self) -> (u64, u64) {
        let used = self.shared.blocks_used.load(Ordering::Relaxed);
        (
            used.saturating_mul(BLOCK),
            self.blocks_total.saturating_mul(BLOCK),
        )
    }

    /// Whether the disk is a ring (`--wrap`).
    pub fn wraps(&self) -> bool {
        self.wrap
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
        let s = &self.shared;
        let in_flight = s.sent.load(Ordering::Acquire) - s.done.load(Ordering::Acquire);
        s.blocks_free.load(Ordering::Acquire) < self.blocks_per_chunk * (in_flight + 2)
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

    /// Flushes, waits for the writer, and closes the disk: cut back to
    /// what it holds and marked as a trace that ended cleanly.
    pub fn finish(mut self) -> Result<WriterReport, DiskError> {
        self.flush();
        self.shared.finishing.store(true, Ordering::Release);
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
            blocks_used: s.blocks_used.load(Ordering::Relaxed),
            dropped_chunks: s.dropped_chunks.load(Ordering::Relaxed),
        })
    }
}

fn write_loop(
    mut disk: DiskWriter,
    rx: Receiver<Chunk>,
    shared: &Shared,
    compression: Compression,
) -> Result<(), DiskError> {
    let mut result = Ok(());
    let mut rung = 0;
    for chunk in rx {
        let level = compression.levels()[rung];
        let sealed = seal_at_level(
            level,
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
            .blocks_free
            .store(disk.blocks_free(), Ordering::Release);
        shared
            .blocks_used
            .store(disk.blocks_used(), Ordering::Relaxed);
        let done = shared.done.fetch_add(1, Ordering::AcqRel) + 1;
        let waiting = shared.sent.load(Ordering::Acquire).saturating_sub(done);
        rung = compression.next_rung(rung, waiting);
    }
    if shared.finishing.load(Ordering::Acquire) && result.is_ok() {
        disk.close()?;
    } else {
        disk.sync()?;
    }
    result
}
