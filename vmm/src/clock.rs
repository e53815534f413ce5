//! The virtual clock every device reads time from.
//!
//! Devices never look at the host clock themselves: the run loop asks the
//! clock for "now" and passes it in. That is what lets the tracer make time
//! advance per executed step (deterministic traces) instead of per host
//! nanosecond, without touching any device.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Nanoseconds of virtual time since the VM started.
pub type VirtualNanos = u64;

/// How virtual time relates to host time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockMode {
    /// Virtual time is host wall time since the VM started.
    Wall,
    /// Virtual time is host wall time divided by this factor (at least 1):
    /// a guest running N times slower than hardware sees its timer N times
    /// slower too, instead of drowning in timer interrupts.
    Prescaled(u32),
    /// While single-stepping, each executed instruction advances virtual
    /// time by this many nanoseconds (deterministic: the same guest and
    /// input give the same trace); idle waits (HLT) jump to the next timer
    /// event. Untraced stretches run on wall time.
    Steps(u32),
}

impl ClockMode {
    /// Parses `wall`, `prescale:N` or `steps[:NS]`.
    pub fn parse(text: &str) -> Result<ClockMode, String> {
        let number = |n: &str, what: &str| match n.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!("'{n}': the {what} is a whole number from 1 up")),
        };
        match text.split_once(':') {
            None if text == "wall" => Ok(ClockMode::Wall),
            None if text == "steps" => Ok(ClockMode::Steps(1)),
            Some(("prescale", n)) => number(n, "prescale factor").map(ClockMode::Prescaled),
            Some(("steps", n)) => number(n, "nanoseconds per step").map(ClockMode::Steps),
            _ => Err(format!(
                "'{text}': the clock is 'wall', 'prescale:N' or 'steps[:NS]'"
            )),
        }
    }

    fn divisor(self) -> u64 {
        match self {
            ClockMode::Wall | ClockMode::Steps(_) => 1,
            ClockMode::Prescaled(n) => u64::from(n),
        }
    }
}

/// Spelled the way [`ClockMode::parse`] reads it.
impl std::fmt::Display for ClockMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClockMode::Wall => write!(f, "wall"),
            ClockMode::Prescaled(n) => write!(f, "prescale:{n}"),
            ClockMode::Steps(n) => write!(f, "steps:{n}"),
        }
    }
}

/// The VM's one source of time.
#[derive(Debug)]
pub struct VirtualClock {
    mode: ClockMode,
    /// Virtual time accumulated up to `since` (or up to now while stepping
    /// in steps mode, when host time does not count).
    base: VirtualNanos,
    /// Host time from which wall-driven time runs; None while step-driven.
    since: Option<Instant>,
    /// The same, for other threads ([`ClockReader`]).
    published: Arc<Published>,
}

/// `Published::since` while time is step-driven.
const STEP_DRIVEN: u64 = u64::MAX;

/// What [`VirtualClock`] keeps, readable from other threads: a sequence
/// lock, because a reader must not pair a base from before a change of
/// mode with a start from after it. Between such changes (rare: tracing
/// starts or stops) only `base` moves, which a single atomic store keeps
/// whole; that is the one cost per step.
#[derive(Debug)]
struct Published {
    epoch: Instant,
    divisor: u64,
    /// Odd while the writer is between its stores.
    seq: AtomicU64,
    base: AtomicU64,
    /// Host nanoseconds after `epoch` from which wall time counts, or
    /// [`STEP_DRIVEN`].
    since: AtomicU64,
}

/// Reads a running VM's virtual clock from another thread (the peeper's
/// samples carry its time).
#[derive(Clone, Debug)]
pub struct ClockReader(Arc<Published>);

impl ClockReader {
    /// Current virtual time, as the VM's devices see it.
    pub fn now(&self) -> VirtualNanos {
        let p = &self.0;
        loop {
            let before = p.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let base = p.base.load(Ordering::Relaxed);
            let since = p.since.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if p.seq.load(Ordering::Relaxed) != before {
                continue;
            }
            if since == STEP_DRIVEN {
                return base;
            }
            let host = p.epoch.elapsed().as_nanos() as u64;
            return base.saturating_add(host.saturating_sub(since) / p.divisor);
        }
    }
}

impl VirtualClock {
    /// A clock starting at zero now.
    pub fn new(mode: ClockMode) -> Self {
        let epoch = Instant::now();
        VirtualClock {
            mode,
            base: 0,
            since: Some(epoch),
            published: Arc::new(Published {
                epoch,
                divisor: mode.divisor(),
                seq: AtomicU64::new(0),
                base: AtomicU64::new(0),
                since: AtomicU64::new(0),
            }),
        }
    }

    /// A clock starting at zero for a guest that is single-stepped from
    /// its first instruction: in steps mode no host time counts at all, so
    /// the same guest sees the same time on a fast host and a slow one.
    #[cfg(test)]
    pub fn stepping_from_start(mode: ClockMode) -> Self {
        let mut clock = VirtualClock::new(mode);
        clock.restart(true);
        clock
    }

    /// Starts again from zero now, keeping its readers; while `stepping`,
    /// in steps mode no host time counts at all, so the same guest sees
    /// the same time on a fast host and a slow one.
    pub fn restart(&mut self, stepping: bool) {
        self.base = 0;
        self.since = match (stepping, self.mode) {
            (true, ClockMode::Steps(_)) => None,
            _ => Some(Instant::now()),
        };
        self.publish();
    }

    /// A reader for other threads.
    pub fn reader(&self) -> ClockReader {
        ClockReader(self.published.clone())
    }

    /// Publishes base and start together (see [`Published`]).
    fn publish(&self) {
        let p = &self.published;
        let seq = p.seq.load(Ordering::Relaxed);
        p.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        p.base.store(self.base, Ordering::Relaxed);
        let since = self.since.map_or(STEP_DRIVEN, |s| {
            s.saturating_duration_since(p.epoch).as_nanos() as u64
        });
        p.since.store(since, Ordering::Relaxed);
        p.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// Virtual nanoseconds a step counts, where time is step-driven now.
    pub fn step_nanos(&self) -> Option<u64> {
        match (self.mode, self.since) {
            (ClockMode::Steps(ns), None) => Some(u64::from(ns)),
            _ => None,
        }
    }

    /// Whether time is step-driven now.
    pub fn step_driven(&self) -> bool {
        self.since.is_none()
    }

    /// The guest starts or stops single-stepping. In steps mode, time then
    /// stops or starts following the host clock.
    pub fn set_stepping(&mut self, stepping: bool) {
        let ClockMode::Steps(_) = self.mode else {
            return;
        };
        match (stepping, self.since) {
            (true, Some(since)) => {
                self.base += since.elapsed().as_nanos() as u64;
                self.since = None;
            }
            (false, None) => self.since = Some(Instant::now()),
            _ => return,
        }
        self.publish();
    }

    /// Host time `held` does not count for the guest (a debugger held it
    /// still): a clock that follows the host's goes on from where it was.
    pub fn leave_out(&mut self, held: Duration) {
        if let Some(since) = self.since {
            self.since = Some(since + held);
            self.publish();
        }
    }

    /// One instruction was executed under single-step.
    #[inline]
    pub fn step(&mut self) {
        self.steps(1);
    }

    /// `n` instructions were executed under single-step (REP iterations a
    /// host ran in one exit).
    #[inline]
    pub fn steps(&mut self, n: u64) {
        if let (ClockMode::Steps(ns), None) = (self.mode, self.since) {
            self.base = self.base.saturating_add(u64::from(ns).saturating_mul(n));
            self.published.base.store(self.base, Ordering::Relaxed);
        }
    }

    /// Step-driven idle: jump virtual time forward to `deadline`.
    pub fn skip_to(&mut self, deadline: VirtualNanos) {
        if self.since.is_none() {
            self.base = self.base.max(deadline);
            self.published.base.store(self.base, Ordering::Relaxed);
        }
    }

    /// The guest stopped for good: time stands still at now, for this
    /// clock and every reader (the peeper's last samples, the run's
    /// summary), however long the run takes to wind up. Returns it.
    pub fn freeze(&mut self) -> VirtualNanos {
        self.base = self.now();
        self.since = None;
        self.publish();
        self.base
    }

    /// Current virtual time.
    pub fn now(&self) -> VirtualNanos {
        match self.since {
            Some(since) => self.base + since.elapsed().as_nanos() as u64 / self.mode.divisor(),
            None => self.base,
        }
    }

    /// Host time left until virtual time reaches `deadline` (zero if past).
    /// (None while time is step-driven: host time does not move it.)
    pub fn host_delay_until(&self, deadline: VirtualNanos) -> Option<Duration> {
        self.since?;
        Some(Duration::from_nanos(
            deadline
                .saturating_sub(self.now())
                .saturating_mul(self.mode.divisor()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_clock_moves_forward() {
        let clock = VirtualClock::new(ClockMode::Wall);
        let a = clock.now();
        std::thread::sleep(Duration::from_millis(2));
        let b = clock.now();
        assert!(b >= a + 2_000_000, "{a} -> {b}");
        assert_eq!(clock.host_delay_until(0), Some(Duration::ZERO));
    }

    #[test]
    fn a_frozen_clock_stands_still_for_its_readers() {
        let mut clock = VirtualClock::new(ClockMode::Wall);
        let reader = clock.reader();
        std::thread::sleep(Duration::from_millis(1));
        let stopped = clock.freeze();
        assert!(stopped >= 1_000_000, "{stopped}");
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(clock.now(), stopped);
        assert_eq!(reader.now(), stopped);
    }

    #[test]
    fn prescaled_clock_runs_slower() {
        let clock = VirtualClock::new(ClockMode::Prescaled(1000));
        std::thread::sleep(Duration::from_millis(20));
        let now = clock.now();
        assert!(
            (20_000..200_000).contains(&now),
            "20 ms of host time is ~20 us: {now}"
        );
        let delay = clock.host_delay_until(now + 1_000).unwrap();
        assert!(
            delay <= Duration::from_millis(1) && delay >= Duration::from_micros(900),
            "{delay:?}"
        );
    }

    #[test]
    fn parses_clock_modes() {
        assert_eq!(ClockMode::parse("wall"), Ok(ClockMode::Wall));
        assert_eq!(
            ClockMode::parse("prescale:6300"),
            Ok(ClockMode::Prescaled(6300))
        );
        assert!(ClockMode::parse("prescale:0").is_err());
        assert_eq!(ClockMode::parse("steps"), Ok(ClockMode::Steps(1)));
        assert_eq!(ClockMode::parse("steps:4"), Ok(ClockMode::Steps(4)));
        assert!(ClockMode::parse("steps:x").is_err());
        assert!(ClockMode::parse("fast").is_err());
    }

    #[test]
    fn step_driven_time_counts_steps_and_skips_idle() {
        let mut clock = VirtualClock::new(ClockMode::Steps(10));
        clock.set_stepping(true);
        let start = clock.now();
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(clock.now(), start, "host time does not count");
        for _ in 0..5 {
            clock.step();
        }
        assert_eq!(clock.now(), start + 50);
        clock.skip_to(start + 1_000);
        assert_eq!(clock.now(), start + 1_000);
        assert_eq!(clock.host_delay_until(start + 2_000), None);
        clock.set_stepping(false);
        std::thread::sleep(Duration::from_millis(1));
        assert!(
            clock.now() >= start + 1_000_000,
            "untraced: wall time again"
        );
    }

    #[test]
    fn a_reader_on_another_thread_sees_the_same_time() {
        let mut clock = VirtualClock::new(ClockMode::Steps(10));
        let reader = clock.reader();
        std::thread::sleep(Duration::from_millis(2));
        let (wall, mine) = (reader.now(), clock.now());
        assert!(wall >= 2_000_000 && wall <= mine, "{wall} {mine}");
        clock.set_stepping(true);
        let start = clock.now();
        assert_eq!(reader.now(), start);
        clock.steps(7);
        let seen = std::thread::spawn(move || reader.now()).join().unwrap();
        assert_eq!(seen, start + 70);
        clock.restart(true);
        assert_eq!(clock.reader().now(), 0);
    }

    #[test]
    fn a_guest_stepped_from_its_start_sees_no_host_time() {
        let mut clock = VirtualClock::stepping_from_start(ClockMode::Steps(1));
        std::thread::sleep(Duration::from_millis(2));
        clock.set_stepping(true);
        clock.step();
        assert_eq!(clock.now(), 1);
    }
}
