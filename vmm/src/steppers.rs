//! While several CPUs are traced, each CPU but the first is entered from a
//! thread of its own, its stepper, so that two CPUs' steps can run at once
//! (see `run_loop::pair`).
//!
//! KVM waits for an RCU grace period when a vCPU is entered from another
//! thread than the last, so a CPU that steps beside another must be
//! entered from the same thread every time, paired or not: its stepper
//! enters it for every entry while the steppers live (from the start of a
//! traced stretch to its end), and the loop's thread hands it each
//! `KVM_RUN` and waits for it. One step takes microseconds, so both sides
//! spin rather than sleep (a futex wake costs as much as a step); past
//! [`HOT_SPIN`] a waiting side yields the host CPU between looks (another
//! thread may need it: a busy host), and a stepper that waits longer than
//! [`SPIN`] parks.
//!
//! Spinning pays only where each thread has a core. Where the host's
//! cores are busy with other work, the scheduler may put a stepper on
//! the core of the loop's thread: each then waits for the other's spin
//! to end, and two traces at once on two cores took twice as long paired
//! as one CPU at a time. A step launched ahead that has not even started
//! when the loop comes to collect it (a step takes microseconds, the
//! loop's own step as long) had no core; where more than one in four of
//! a window of such hand-overs did ([`crowded`]), the loop steps one CPU
//! at a time for a while ([`Steppers::rest`]).
//!
//! A step launched ahead ([`Steppers::launch_ahead`]) runs while the loop
//! serves other CPUs; its exit is collected when its CPU's turn comes,
//! with what the loop knew of the CPU before it ran ([`Ahead`]).

use std::os::unix::io::RawFd;
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_bindings::kvm_run;

use crate::error::{Error, Result};
use crate::kick::STEP_WATCHDOG;

/// How long a stepper spins for its next entry before it parks: longer
/// than a round of steps of two CPUs on the slowest host seen.
const SPIN: Duration = Duration::from_micros(200);
/// How long a side spins before it yields the host CPU between looks:
/// about a step's time.
const HOT_SPIN: Duration = Duration::from_micros(20);

/// Whether this host has a core for each of the spinning threads of a
/// machine of `cpus` CPUs (the loop's and a stepper per CPU but the
/// first).
pub(crate) fn host_has_cores_for(cpus: usize) -> bool {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    cores_suffice(cores, cpus)
}

/// Whether `cores` host cores can pair steps of `cpus` CPUs. Every
/// stepper spins between its steps, the idle ones too: with fewer cores
/// than spinning threads, the scheduler shares cores among them in slices
/// of milliseconds (4 CPUs on 2 cores: 4,096 pairs took 1.2-4.2 s, not
/// 40-55 ms; the SMP demo 24-25 s paired against 13.1 s one CPU at a
/// time).
fn cores_suffice(cores: usize, cpus: usize) -> bool {
    cpus > 1 && cores >= cpus
}

/// Steps launched ahead between two looks at how many started late.
const WINDOW: u32 = 4096;
/// How long the loop steps one CPU at a time once the host was crowded,
/// the first time.
const REST: Duration = Duration::from_secs(1);
/// The longest rest: a host crowded again right after each rest (more
/// CPUs than cores, another job that goes on) rests twice as long each
/// time, up to this, so that the hand-overs judged late before each rest
/// and the steppers' restarts cost little beside one CPU at a time.
const LONGEST_REST: Duration = Duration::from_secs(8);

/// The rest after one of `last` (zero: none since the host was last
/// found calm).
fn next_rest(last: Duration) -> Duration {
    last.saturating_mul(2).clamp(REST, LONGEST_REST)
}

/// Whether the host is too busy for the steppers to spin: more than one
/// step launched ahead in four had not started when its turn came.
///
/// Measured on 2 cores, windows of 4,096: alone, up to 250 late (the
/// trace writer's thread takes a core now and then; pairing still pays);
/// two traces at once, either the same or 1,000 to all 4,096 (the
/// scheduler put a stepper on its loop's core; pairing took twice as
/// long as one CPU at a time).
pub(crate) fn crowded(late: u32, handovers: u32) -> bool {
    late.saturating_mul(4) > handovers
}

const IDLE: u32 = 0;
const GO: u32 = 1;
const RUNNING: u32 = 2;
const DONE: u32 = 3;
const QUIT: u32 = 4;

/// What the loop knew of a CPU whose step it launched ahead, before the
/// step ran: what the loop's own entry would have noted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ahead {
    /// RIP at the entry.
    pub(crate) entry_rip: u64,
    /// The echo witness before the entry (see `cpu::echo`).
    pub(crate) witness: [u64; 4],
}

/// The hand-over between the loop's thread and one stepper.
struct Hand {
    state: AtomicU32,
    errno: AtomicI32,
    /// The stepper sleeps in `park` (or is about to): wake it.
    parked: AtomicBool,
}

/// One CPU's thread.
struct Stepper {
    hand: Arc<Hand>,
    thread: Option<JoinHandle<()>>,
    /// The vCPU's `kvm_run`, to kick it out of a step that hangs.
    run: *mut kvm_run,
    ahead: Option<Ahead>,
}

/// Every stepper, by CPU; none while the CPUs are not traced.
#[derive(Default)]
pub(crate) struct Steppers {
    members: Vec<Option<Stepper>>,
    /// Steps launched ahead in this window.
    handovers: u32,
    /// Of these, the ones not started when their turn came.
    late: u32,
    /// The last full window was [`crowded`].
    crowded: bool,
    /// No steppers before this (see [`Steppers::rest`]).
    rest_until: Option<Instant>,
    /// The last rest's length; zero once a window was calm.
    rest_for: Duration,
    /// Times they rested since [`Steppers::take_rests`] last asked.
    rests: u32,
}

/// The stepper's loop: wait for `GO`, enter the vCPU, report.
fn stepper(fd: RawFd, hand: &Hand) {
    loop {
        let waiting = Instant::now();
        let mut spins = 0u32;
        loop {
            match hand.state.load(Ordering::Acquire) {
                GO => break,
                QUIT => return,
                _ => {}
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let waited = waiting.elapsed();
            if waited < HOT_SPIN {
                continue;
            }
            if waited < SPIN {
                std::thread::yield_now();
                continue;
            }
            // Seen by `go` after it set GO, or GO is seen here (both
            // sequentially consistent).
            hand.parked.store(true, Ordering::SeqCst);
            if hand.state.load(Ordering::SeqCst) != GO {
                std::thread::park();
            }
            hand.parked.store(false, Ordering::Relaxed);
        }
        // Only the loop's look at whether the step started reads it.
        hand.state.store(RUNNING, Ordering::Relaxed);
        // SAFETY: `fd` is a vCPU's, open until the steppers are gone; the
        // loop's thread does not use the vCPU until this one reports.
        let errno = unsafe { crate::vcpu::run_raw(fd) };
        hand.errno.store(errno, Ordering::Relaxed);
        hand.state.store(DONE, Ordering::Release);
    }
}

impl Steppers {
    /// Whether the steppers live.
    pub(crate) fn live(&self) -> bool {
        !self.members.is_empty()
    }

    /// Starts a stepper for each vCPU `vcpus` gives (CPU number, its file
    /// descriptor and `kvm_run`); CPU 0 has none (the loop's thread
    /// enters it).
    pub(crate) fn start(&mut self, vcpus: Vec<(usize, RawFd, *mut kvm_run)>) -> Result<()> {
        self.stop();
        for (cpu, fd, run) in vcpus {
            if cpu == 0 {
                continue;
            }
            let hand = Arc::new(Hand {
                state: AtomicU32::new(IDLE),
                errno: AtomicI32::new(0),
                parked: AtomicBool::new(false),
            });
            let theirs = hand.clone();
            let thread = std::thread::Builder::new()
                .name(format!("vtrace-step{cpu}"))
                .spawn(move || stepper(fd, &theirs))
                .map_err(|source| Error::Host {
                    what: "start a vCPU's stepping thread",
                    source,
                })?;
            if self.members.len() <= cpu {
                self.members.resize_with(cpu + 1, || None);
            }
            self.members[cpu] = Some(Stepper {
                hand,
                thread: Some(thread),
                run,
                ahead: None,
            });
        }
        Ok(())
    }

    /// Ends every stepper; a step launched ahead is waited for (and lost:
    /// call only where none is, but the run is over).
    pub(crate) fn stop(&mut self) {
        for cpu in 0..self.members.len() {
            if self.ahead(cpu).is_some() {
                self.wait(cpu);
            }
        }
        for s in self.members.iter_mut().flatten() {
            s.hand.state.store(QUIT, Ordering::SeqCst);
            if let Some(t) = &s.thread {
                t.thread().unpark();
            }
        }
        for s in self.members.iter_mut().flatten() {
            if let Some(t) = s.thread.take() {
                let _ = t.join();
            }
        }
        self.members.clear();
        self.handovers = 0;
        self.late = 0;
        self.crowded = false;
    }

    /// Whether the last window of hand-overs found the host crowded.
    pub(crate) fn crowded(&self) -> bool {
        self.crowded
    }

    /// Ends the steppers and starts none for a while (the host is busy).
    pub(crate) fn rest(&mut self) {
        self.stop();
        self.rest_for = next_rest(self.rest_for);
        self.rest_until = Some(Instant::now() + self.rest_for);
        self.rests = self.rests.saturating_add(1);
    }

    /// How many times the steppers rested since the last call.
    pub(crate) fn take_rests(&mut self) -> u32 {
        std::mem::take(&mut self.rests)
    }

    /// Whether steppers may start (not resting).
    pub(crate) fn may_start(&self) -> bool {
        self.rest_until.is_none_or(|t| Instant::now() >= t)
    }

    /// Counts a step launched ahead, collected `late` or not; at the end
    /// of a window, looks at how many were.
    fn count_ahead(&mut self, late: bool) {
        self.handovers += 1;
        self.late += u32::from(late);
        if self.handovers < WINDOW {
            return;
        }
        self.crowded = crowded(self.late, self.handovers);
        if !self.crowded {
            self.rest_for = Duration::ZERO;
        }
        self.handovers = 0;
        self.late = 0;
    }

    fn member(&self, cpu: usize) -> Option<&Stepper> {
        self.members.get(cpu)?.as_ref()
    }

    /// Whether CPU `cpu` is entered by its stepper.
    #[inline]
    pub(crate) fn has(&self, cpu: usize) -> bool {
        self.member(cpu).is_some()
    }

    /// The thread that enters CPU `cpu`, where not the loop's.
    pub(crate) fn thread_of(&self, cpu: usize) -> Option<libc::pthread_t> {
        Some(self.member(cpu)?.thread.as_ref()?.as_pthread_t())
    }

    /// Whether some CPU's step was launched ahead and not yet collected.
    #[inline]
    pub(crate) fn any_ahead(&self) -> bool {
        self.members.iter().flatten().any(|s| s.ahead.is_some())
    }

    /// CPU `cpu`'s step launched ahead, if one is.
    pub(crate) fn ahead(&self, cpu: usize) -> Option<Ahead> {
        self.member(cpu)?.ahead
    }

    /// Starts CPU `cpu`'s `KVM_RUN` on its stepper; false where it has
    /// none.
    fn go(&self, cpu: usize) -> bool {
        let Some(s) = self.member(cpu) else {
            return false;
        };
        s.hand.state.store(GO, Ordering::SeqCst);
        if s.hand.parked.load(Ordering::SeqCst) {
            if let Some(t) = &s.thread {
                t.thread().unpark();
            }
        }
        true
    }

    /// Launches CPU `cpu`'s step now, to be collected by [`Steppers::run`]
    /// when its turn comes.
    pub(crate) fn launch_ahead(&mut self, cpu: usize, ahead: Ahead) {
        if self.go(cpu) {
            if let Some(Some(s)) = self.members.get_mut(cpu) {
                s.ahead = Some(ahead);
            }
        }
    }

    /// CPU `cpu`'s `KVM_RUN` on its stepper: the one launched ahead (and
    /// what was known before it), else one started now. The errno, 0 for
    /// an exit.
    pub(crate) fn run(&mut self, cpu: usize) -> (i32, Option<Ahead>) {
        let ahead = match self.members.get_mut(cpu) {
            Some(Some(s)) => s.ahead.take(),
            _ => None,
        };
        if ahead.is_none() && !self.go(cpu) {
            return (libc::EBADF, None);
        }
        if ahead.is_some() {
            let late = self
                .member(cpu)
                .is_some_and(|s| s.hand.state.load(Ordering::Relaxed) == GO);
            self.count_ahead(late);
        }
        (self.wait(cpu), ahead)
    }

    /// Waits for CPU `cpu`'s `KVM_RUN` to return. A step that has not
    /// after the stepping watchdog's time lost its trap (the loop's own
    /// watchdog covers the CPU on stage): it is kicked out.
    fn wait(&self, cpu: usize) -> i32 {
        let Some(s) = self.member(cpu) else {
            return libc::EBADF;
        };
        let since = Instant::now();
        let mut spins = 0u32;
        let mut kicked = false;
        let mut patient = false;
        while s.hand.state.load(Ordering::Acquire) != DONE {
            spins = spins.wrapping_add(1);
            if patient {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            if spins.is_multiple_of(256) {
                let waited = since.elapsed();
                patient = waited > HOT_SPIN;
                if !kicked && waited > STEP_WATCHDOG * 2 {
                    kicked = true;
                    self.kick(s);
                }
            }
        }
        s.hand.state.store(IDLE, Ordering::Relaxed);
        s.hand.errno.load(Ordering::Relaxed)
    }

    /// Gets a stepper's vCPU out of `KVM_RUN`.
    fn kick(&self, s: &Stepper) {
        tracing::warn!("a step launched ahead did not return: kicking it");
        // SAFETY: `run` is the vCPU's kvm_run mapping, alive as long as
        // the vCPU; KVM only reads this byte.
        unsafe { std::ptr::write_volatile(&mut (*s.run).immediate_exit, 1) };
        if let Some(t) = &s.thread {
            // SAFETY: the thread lives until joined in `stop`; the kick
            // signal has a handler (installed by the kicker).
            unsafe { libc::pthread_kill(t.as_pthread_t(), libc::SIGRTMIN()) };
        }
    }
}

impl Drop for Steppers {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_crowded_where_more_than_one_step_ahead_in_four_had_not_started() {
        assert!(!crowded(0, WINDOW));
        assert!(!crowded(250, WINDOW), "the worst window of a trace alone");
        assert!(!crowded(WINDOW / 4, WINDOW));
        assert!(crowded(WINDOW / 4 + 1, WINDOW));
        assert!(crowded(WINDOW, WINDOW));
    }

    #[test]
    fn the_steppers_judge_a_whole_window_at_its_end() {
        let mut steppers = Steppers::default();
        for _ in 0..WINDOW - 1 {
            steppers.count_ahead(true);
        }
        assert!(!steppers.crowded(), "not before the window is full");
        steppers.count_ahead(true);
        assert!(steppers.crowded());
        for i in 0..WINDOW {
            steppers.count_ahead(i % 8 == 0);
        }
        assert!(!steppers.crowded(), "one in eight late is not crowded");
    }

    #[test]
    fn steps_pair_only_where_each_spinning_thread_has_a_core() {
        assert!(!cores_suffice(1, 2), "one core");
        assert!(cores_suffice(2, 2));
        assert!(!cores_suffice(2, 4), "measured: twice as slow as serial");
        assert!(!cores_suffice(2, 3));
        assert!(cores_suffice(16, 8));
        assert!(!cores_suffice(16, 1), "nothing to pair");
    }

    #[test]
    fn steppers_that_rest_start_again_only_after_a_while() {
        let mut steppers = Steppers::default();
        assert!(steppers.may_start() && !steppers.crowded() && !steppers.live());
        steppers.rest();
        assert!(!steppers.may_start(), "resting");
        steppers.rest_until = Some(Instant::now());
        assert!(steppers.may_start());
    }

    #[test]
    fn a_host_crowded_again_after_each_rest_rests_longer_until_a_calm_window() {
        let mut steppers = Steppers::default();
        let mut rests = Vec::new();
        for _ in 0..6 {
            steppers.rest();
            rests.push(steppers.rest_for.as_secs());
        }
        assert_eq!(rests, [1, 2, 4, 8, 8, 8]);
        for _ in 0..WINDOW {
            steppers.count_ahead(false);
        }
        steppers.rest();
        assert_eq!(steppers.rest_for, REST, "calm since: a short rest again");
    }
}
