//! Peeping: a host thread reads variables in guest RAM at a fixed interval
//! while the vCPU runs on, with no exit at all (the way a second machine
//! once read a target's physical memory over IEEE 1394 every 100 µs).
//!
//! Samples travel to the run loop in batches, without kicking the vCPU:
//! the loop takes them at its next exit, which a running guest makes
//! often (timer deadlines, I/O) and a stepped one makes every instruction.
//! Only when batches pile up (a guest computing for long without an exit)
//! does the peeper kick. The running pc cannot be read without stopping
//! the vCPU, so a plan that asks for it kicks once per sample and the run
//! loop takes the whole sample at that exit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};

use crate::clock::{ClockReader, VirtualNanos};
use crate::error::{Error, PeepError, Result};
use crate::memory::GuestRam;

/// The shortest interval: shorter ones only measure the host's timer.
pub const MIN_INTERVAL: Duration = Duration::from_micros(10);
/// Most variables one plan samples.
pub const MAX_READS: usize = 16;

/// Samples per batch sent to the run loop, and the longest a batch waits.
const BATCH_SAMPLES: usize = 256;
const BATCH_AGE: Duration = Duration::from_millis(20);
/// Batches the run loop may leave waiting before the peeper kicks it.
const BATCHES_WAITING: u64 = 16;

/// One variable to read: `size` bytes (1, 2, 4 or 8) at guest-physical
/// `gpa`, little-endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeepRead {
    /// Where the variable is, guest-physical.
    pub gpa: u64,
    /// Its width in bytes.
    pub size: u8,
}

/// What to sample and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeepPlan {
    /// Host time between samples.
    pub interval: Duration,
    /// The variables, at most [`MAX_READS`].
    pub reads: Vec<PeepRead>,
    /// Also the running pc and address space (one exit per sample).
    pub pc: bool,
}

/// One sample: the variables' values in the plan's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeepSample {
    /// The guest's virtual time when it was taken.
    pub virtual_ns: VirtualNanos,
    /// Host nanoseconds since the run started.
    pub host_ns: u64,
    /// One value per read of the plan.
    pub values: Vec<u64>,
    /// The running pc and CR3, where the plan asked for them.
    pub pc: Option<(u64, u64)>,
}

/// What peeping did, when the run is over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeepReport {
    /// Samples taken.
    pub samples: u64,
    /// Intervals with no sample: the peeper woke later than the next one
    /// was due (a busy host), or a pc sample was still waiting for its exit.
    pub missed: u64,
}

/// Samples on their way to the run loop. Dropping a batch tells the
/// peeper it arrived (back-pressure without a second channel).
pub struct PeepBatch {
    pub samples: Vec<PeepSample>,
    link: Arc<Link>,
}

impl Drop for PeepBatch {
    fn drop(&mut self) {
        self.link.delivered.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the peeper sends the run loop.
pub enum PeepMessage {
    Batch(PeepBatch),
    /// Take a sample with the pc now (the vCPU was kicked for it).
    TakeWithPc,
}

#[derive(Default)]
struct Link {
    stop: AtomicBool,
    delivered: AtomicU64,
    /// A pc sample was asked for and not taken yet.
    pc_wanted: AtomicBool,
    missed: AtomicU64,
    samples: AtomicU64,
}

/// Checks a plan against the guest's RAM before anything runs.
pub fn check(plan: &PeepPlan, ram: &GuestRam) -> Result<()> {
    if plan.interval < MIN_INTERVAL {
        return Err(PeepError::TooOften {
            asked: plan.interval,
            shortest: MIN_INTERVAL,
        }
        .into());
    }
    if plan.reads.len() > MAX_READS {
        return Err(PeepError::TooMany {
            asked: plan.reads.len(),
            most: MAX_READS,
        }
        .into());
    }
    for read in &plan.reads {
        if !matches!(read.size, 1 | 2 | 4 | 8) {
            return Err(PeepError::BadSize(read.size).into());
        }
        let mut buf = [0u8; 8];
        if ram
            .read_slice(&mut buf[..usize::from(read.size)], GuestAddress(read.gpa))
            .is_err()
        {
            return Err(PeepError::NotInRam {
                gpa: read.gpa,
                size: read.size,
            }
            .into());
        }
    }
    Ok(())
}

/// Reads one variable. An aligned one is read in one access, so a value
/// the guest is writing is never torn.
fn read(ram: &GuestRam, r: PeepRead) -> u64 {
    let at = GuestAddress(r.gpa);
    let aligned = r.gpa.is_multiple_of(u64::from(r.size));
    let value = match (aligned, r.size) {
        (true, 1) => ram.load::<u8>(at, Ordering::Relaxed).map(u64::from),
        (true, 2) => ram.load::<u16>(at, Ordering::Relaxed).map(u64::from),
        (true, 4) => ram.load::<u32>(at, Ordering::Relaxed).map(u64::from),
        (true, 8) => ram.load::<u64>(at, Ordering::Relaxed),
        _ => {
            let mut buf = [0u8; 8];
            ram.read_slice(&mut buf[..usize::from(r.size)], at)
                .map(|()| u64::from_le_bytes(buf))
        }
    };
    // `check` made sure every read is RAM, and RAM does not move.
    value.unwrap_or(0)
}

/// Reads `plan`'s variables now.
fn sample(
    ram: &GuestRam,
    plan: &PeepPlan,
    started: Instant,
    virtual_ns: VirtualNanos,
    pc: Option<(u64, u64)>,
) -> PeepSample {
    PeepSample {
        virtual_ns,
        host_ns: started.elapsed().as_nanos() as u64,
        values: plan.reads.iter().map(|r| read(ram, *r)).collect(),
        pc,
    }
}

/// A running peeper thread.
pub struct Peeper {
    plan: PeepPlan,
    ram: GuestRam,
    started: Instant,
    link: Arc<Link>,
    thread: Option<JoinHandle<Vec<PeepSample>>>,
}

impl Peeper {
    /// Starts sampling `plan` (checked with [`check`]). `send` hands a
    /// message to the run loop, kicking the vCPU out of the guest when
    /// `kick` is set; false if the loop is gone, which stops the thread.
    pub fn start(
        plan: PeepPlan,
        ram: GuestRam,
        clock: ClockReader,
        send: Box<dyn Fn(PeepMessage, bool) -> bool + Send>,
    ) -> Result<Peeper> {
        let started = Instant::now();
        let link = Arc::new(Link::default());
        let worker = Worker {
            plan: plan.clone(),
            ram: ram.clone(),
            clock,
            started,
            link: link.clone(),
            send,
        };
        let thread = std::thread::Builder::new()
            .name("vtrace-peep".into())
            .spawn(move || worker.run())
            .map_err(|source| Error::Host {
                what: "start the peeping thread",
                source,
            })?;
        Ok(Peeper {
            plan,
            ram,
            started,
            link,
            thread: Some(thread),
        })
    }

    /// Takes a sample on the vCPU thread, with the vCPU's `pc` and `cr3`
    /// (answering [`PeepMessage::TakeWithPc`]).
    pub fn take_with_pc(&self, virtual_ns: VirtualNanos, pc: u64, cr3: u64) -> PeepSample {
        self.link.pc_wanted.store(false, Ordering::Release);
        self.link.samples.fetch_add(1, Ordering::Relaxed);
        sample(
            &self.ram,
            &self.plan,
            self.started,
            virtual_ns,
            Some((pc, cr3)),
        )
    }

    /// Stops the thread. What it had not sent yet comes back, with one
    /// last sample of the values as the guest left them.
    pub fn stop(mut self, virtual_ns: VirtualNanos) -> (Vec<PeepSample>, PeepReport) {
        self.link.stop.store(true, Ordering::Release);
        let mut rest = self
            .thread
            .take()
            .and_then(|t| {
                // It may be asleep until its next sample, however far off.
                t.thread().unpark();
                t.join().ok()
            })
            .unwrap_or_default();
        rest.push(sample(
            &self.ram,
            &self.plan,
            self.started,
            virtual_ns,
            None,
        ));
        let report = PeepReport {
            samples: self.link.samples.load(Ordering::Relaxed) + 1,
            missed: self.link.missed.load(Ordering::Relaxed),
        };
        (rest, report)
    }
}

struct Worker {
    plan: PeepPlan,
    ram: GuestRam,
    clock: ClockReader,
    started: Instant,
    link: Arc<Link>,
    send: Box<dyn Fn(PeepMessage, bool) -> bool + Send>,
}

impl Worker {
    /// Samples until stopped; returns what it had not sent.
    fn run(self) -> Vec<PeepSample> {
        // Linux stretches a sleep by the thread's timer slack (50 µs by
        // default): more than half of a 100 µs interval.
        // SAFETY: prctl with PR_SET_TIMERSLACK only changes this thread's
        // slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
        let interval = self.plan.interval;
        // None: the next sample is too far off for the host's clock to
        // name (an interval of centuries); the thread sleeps until stopped.
        let mut due = self.started.checked_add(interval);
        let mut sent: u64 = 0;
        let mut batch = self.new_batch();
        let mut batch_since = Instant::now();
        while !self.link.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            let Some(at) = due.filter(|&at| at <= now) else {
                // Parked, not slept: `stop` unparks it, so a long interval
                // never holds up the end of a run.
                std::thread::park_timeout(due.map_or(Duration::MAX, |at| at - now));
                continue;
            };
            // Intervals the thread slept through are missed, not made up.
            let late = (now - at).as_nanos() / interval.as_nanos();
            self.link
                .missed
                .fetch_add(u64::try_from(late).unwrap_or(u64::MAX), Ordering::Relaxed);
            due = u32::try_from(late.saturating_add(1))
                .ok()
                .and_then(|n| interval.checked_mul(n))
                .and_then(|ahead| at.checked_add(ahead));
            if self.plan.pc {
                if self.link.pc_wanted.swap(true, Ordering::AcqRel) {
                    self.link.missed.fetch_add(1, Ordering::Relaxed);
                } else if !(self.send)(PeepMessage::TakeWithPc, true) {
                    break;
                }
                continue;
            }
            batch.samples.push(PeepSample {
                virtual_ns: self.clock.now(),
                host_ns: self.started.elapsed().as_nanos() as u64,
                values: self
                    .plan
                    .reads
                    .iter()
                    .map(|r| read(&self.ram, *r))
                    .collect(),
                pc: None,
            });
            self.link.samples.fetch_add(1, Ordering::Relaxed);
            if batch.samples.len() >= BATCH_SAMPLES || batch_since.elapsed() >= BATCH_AGE {
                let waiting = sent.saturating_sub(self.link.delivered.load(Ordering::Relaxed));
                let full = std::mem::replace(&mut batch, self.new_batch());
                sent += 1;
                if !(self.send)(PeepMessage::Batch(full), waiting >= BATCHES_WAITING) {
                    break;
                }
                batch_since = Instant::now();
            }
        }
        std::mem::take(&mut batch.samples)
    }

    fn new_batch(&self) -> PeepBatch {
        PeepBatch {
            samples: Vec::with_capacity(BATCH_SAMPLES),
            link: self.link.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ClockMode, VirtualClock};
    use crate::memory::create_guest_ram;
    use std::sync::mpsc;

    fn plan(interval_us: u64, reads: Vec<PeepRead>) -> PeepPlan {
        PeepPlan {
            interval: Duration::from_micros(interval_us),
            reads,
            pc: false,
        }
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        let ram = create_guest_ram(1 << 20).unwrap();
        let ok = PeepRead {
            gpa: 0x1000,
            size: 8,
        };
        assert!(check(&plan(100, vec![ok]), &ram).is_ok());
        assert!(
            check(&plan(1, vec![ok]), &ram).is_err(),
            "interval too short"
        );
        let outside = PeepRead {
            gpa: (1 << 20) - 4,
            size: 8,
        };
        assert!(check(&plan(100, vec![outside]), &ram).is_err());
        let odd = PeepRead { gpa: 0, size: 3 };
        assert!(check(&plan(100, vec![odd]), &ram).is_err());
        assert!(check(&plan(100, vec![ok; MAX_READS + 1]), &ram).is_err());
    }

    #[test]
    fn a_peeper_asleep_until_a_far_sample_stops_at_once() {
        let ram = create_guest_ram(1 << 20).unwrap();
        let clock = VirtualClock::new(ClockMode::Wall);
        let reads = vec![PeepRead {
            gpa: 0x2000,
            size: 8,
        }];
        // A thousand seconds, and the longest interval a command line
        // can name (past what the host's clock can add).
        for interval in [Duration::from_secs(1000), Duration::from_nanos(u64::MAX)] {
            let plan = PeepPlan {
                interval,
                reads: reads.clone(),
                pc: false,
            };
            let send = Box::new(|_: PeepMessage, _: bool| true);
            let peeper = Peeper::start(plan, ram.clone(), clock.reader(), send).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            let asked = Instant::now();
            let (rest, report) = peeper.stop(clock.now());
            // Before, stop waited for the sleep to end: 1,000 s, or forever.
            assert!(asked.elapsed() < Duration::from_secs(30), "{interval:?}");
            assert_eq!(report.samples, 1, "only the last sample");
            assert_eq!(rest.len(), 1);
        }
    }

    #[test]
    fn samples_what_another_thread_writes() {
        let ram = create_guest_ram(1 << 20).unwrap();
        let clock = VirtualClock::new(ClockMode::Wall);
        let reads = vec![
            PeepRead {
                gpa: 0x2000,
                size: 8,
            },
            PeepRead {
                gpa: 0x2009,
                size: 2,
            },
        ];
        ram.write_slice(&[0x34, 0x12], GuestAddress(0x2009))
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let send = Box::new(move |m: PeepMessage, _kick: bool| match m {
            PeepMessage::Batch(b) => tx.send(b.samples.clone()).is_ok(),
            PeepMessage::TakeWithPc => true,
        });
        let peeper = Peeper::start(plan(100, reads), ram.clone(), clock.reader(), send).unwrap();
        for n in 1..=30u64 {
            ram.write_obj(n, GuestAddress(0x2000)).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        let (rest, report) = peeper.stop(clock.now());
        let mut all: Vec<PeepSample> = rx.try_iter().flatten().collect();
        all.extend(rest);
        assert_eq!(all.len() as u64, report.samples);
        assert!(all.len() > 30, "{} samples in 60 ms", all.len());
        assert!(all.windows(2).all(|w| w[0].values[0] <= w[1].values[0]
            && w[0].host_ns <= w[1].host_ns
            && w[0].virtual_ns <= w[1].virtual_ns));
        assert_eq!(all.last().unwrap().values, vec![30, 0x1234]);
    }
}
