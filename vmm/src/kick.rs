//! Getting the vCPU out of `KVM_RUN` when a device needs it: a timer
//! deadline has come, or the user typed something.
//!
//! A guest computing in a loop never exits on its own, so a helper thread
//! sends the vCPU thread a signal at the next device deadline. The signal
//! handler sets `kvm_run.immediate_exit`, which closes the race of a signal
//! landing just before `KVM_RUN` is entered (the documented KVM idiom).
//!
//! While the vCPU single-steps no kick is sent, with one exception: a
//! `KVM_RUN` that has not returned after [`STEP_WATCHDOG`] lost its trap
//! (a guest that cleared the trap flag KVM stepped it with runs on without
//! exits), and without a kick it would never return: no `vtrace ctl`, no
//! Ctrl-C could reach the run. The kick brings it out, the run loop arms
//! stepping again and says so, and the tracer records the instructions it
//! missed as a gap.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// `immediate_exit` byte of the `kvm_run` of the vCPU on stage (one VM per
/// process; the kick signal goes to the thread that enters it, see
/// [`Kicker::retarget_thread`]).
static IMMEDIATE_EXIT: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static HANDLER: Once = Once::new();

fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int) {
    let p = IMMEDIATE_EXIT.load(Ordering::Relaxed);
    if !p.is_null() {
        // SAFETY: p points into the vCPU's kvm_run mapping, which outlives
        // the Kicker (it is cleared in Kicker::drop before the VM goes).
        unsafe { std::ptr::write_volatile(p, 1) };
    }
}

const NO_DEADLINE: u64 = u64::MAX;

struct Shared {
    epoch: Instant,
    /// While the vCPU single-steps it exits after every instruction: kicks
    /// are not needed, and a signal landing mid-step can cost the step's
    /// debug exit (KVM reports EINTR instead).
    quiet: AtomicBool,
    /// Host nanoseconds since `epoch` at which to kick; NO_DEADLINE if none.
    deadline: AtomicU64,
    /// Bumped by the vCPU thread as it enters `KVM_RUN` and as it leaves
    /// (odd: inside), for the stepping watchdog.
    runs: AtomicU64,
    /// The watchdog kicked the vCPU out of a stepping `KVM_RUN`.
    watchdog_fired: AtomicBool,
    stop: AtomicBool,
    /// The thread that enters the vCPU on stage: the loop's own, or the
    /// stepper thread that enters it while several CPUs are traced.
    target: AtomicU64,
}

impl Shared {
    fn kick(&self) {
        if self.quiet.load(Ordering::Relaxed) {
            return;
        }
        self.signal();
    }

    fn signal(&self) {
        let target: libc::pthread_t = self.target.load(Ordering::Relaxed);
        // SAFETY: target is a live vCPU thread (the Kicker is dropped on
        // the loop's thread before it exits, steppers are joined after
        // they are no longer targeted); the signal has a handler installed.
        unsafe { libc::pthread_kill(target, kick_signal()) };
    }
}

/// Kicks the calling (vCPU) thread out of `KVM_RUN` on demand or on time.
pub struct Kicker {
    shared: Arc<Shared>,
    /// The thread that made it: the run loop's.
    home: libc::pthread_t,
    timer: Option<JoinHandle<()>>,
}

/// A handle other threads use to kick the vCPU at once.
#[derive(Clone)]
pub struct KickHandle(Arc<Shared>);

impl KickHandle {
    pub fn kick(&self) {
        // After the Kicker is gone the vCPU thread may be too.
        if !self.0.stop.load(Ordering::Relaxed) {
            self.0.kick();
        }
    }
}

impl Kicker {
    /// Must be called on the vCPU thread. `immediate_exit` is the address of
    /// the `kvm_run.immediate_exit` byte of that thread's vCPU.
    pub fn new(immediate_exit: *mut u8) -> Result<Kicker> {
        let mut install_error = None;
        HANDLER.call_once(|| {
            // SAFETY: a plain sigaction with a handler that only does an
            // atomic load and a volatile store.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_kick as *const () as usize;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                if libc::sigaction(kick_signal(), &action, std::ptr::null_mut()) != 0 {
                    install_error = Some(std::io::Error::last_os_error());
                }
            }
        });
        if let Some(e) = install_error {
            return Err(Error::Host {
                what: "install the vCPU kick handler",
                source: e,
            });
        }
        IMMEDIATE_EXIT.store(immediate_exit, Ordering::Relaxed);
        let shared = Arc::new(Shared {
            epoch: Instant::now(),
            deadline: AtomicU64::new(NO_DEADLINE),
            quiet: AtomicBool::new(false),
            runs: AtomicU64::new(0),
            watchdog_fired: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            // SAFETY: pthread_self has no preconditions.
            target: AtomicU64::new(unsafe { libc::pthread_self() }),
        });
        let worker = shared.clone();
        let timer = std::thread::Builder::new()
            .name("vtrace-kick".into())
            .spawn(move || timer_loop(&worker))
            .map_err(|source| Error::Host {
                what: "start the timer thread",
                source,
            })?;
        Ok(Kicker {
            shared,
            // SAFETY: as above.
            home: unsafe { libc::pthread_self() },
            timer: Some(timer),
        })
    }

    /// Kicks go to `thread` from now on (it enters the vCPU on stage), or
    /// to the thread that made the kicker where `None`.
    #[inline]
    pub fn retarget_thread(&self, thread: Option<libc::pthread_t>) {
        let target = thread.unwrap_or(self.home);
        self.shared.target.store(target, Ordering::Relaxed);
    }

    /// Kicks go to the vCPU whose `kvm_run.immediate_exit` byte this is
    /// from now on: the one on stage (see `crate::cpus`), which runs on the
    /// same thread.
    pub fn retarget(&self, immediate_exit: *mut u8) {
        IMMEDIATE_EXIT.store(immediate_exit, Ordering::Relaxed);
    }

    /// Kick after `delay` of host time, replacing any earlier deadline.
    pub fn kick_after(&self, delay: Duration) {
        let at = self.shared.epoch.elapsed().saturating_add(delay).as_nanos() as u64;
        let previous = self.shared.deadline.swap(at, Ordering::Relaxed);
        if at < previous {
            if let Some(t) = &self.timer {
                t.thread().unpark();
            }
        }
    }

    /// Suppresses all kicks (timed and on demand) while `quiet`.
    pub fn set_quiet(&self, quiet: bool) {
        self.shared.quiet.store(quiet, Ordering::Relaxed);
    }

    /// No timed kick is needed.
    pub fn cancel(&self) {
        self.shared.deadline.store(NO_DEADLINE, Ordering::Relaxed);
    }

    /// The vCPU thread enters `KVM_RUN` (`true`) or has left it.
    pub fn in_run(&self, inside: bool) {
        // One writer (this thread): a load and a store, no locked add, on
        // the per-step path.
        let n = self.shared.runs.load(Ordering::Relaxed);
        if (n % 2 == 1) != inside {
            self.shared.runs.store(n.wrapping_add(1), Ordering::Relaxed);
        }
    }

    /// Whether the stepping watchdog kicked the vCPU since last asked.
    pub fn take_watchdog(&self) -> bool {
        self.shared.watchdog_fired.swap(false, Ordering::Relaxed)
    }

    /// A handle for other threads (the console) to kick the vCPU.
    pub fn handle(&self) -> KickHandle {
        KickHandle(self.shared.clone())
    }
}

/// How long one stepping `KVM_RUN` may last before the watchdog kicks:
/// far longer than any one instruction takes, even on an emulated VT-x.
pub const STEP_WATCHDOG: Duration = Duration::from_secs(2);

/// The stepping watchdog's view: which `KVM_RUN` it saw last, and since when.
#[derive(Debug, Default)]
struct Watchdog {
    seen: u64,
    since: Duration,
}

impl Watchdog {
    /// At `now`, with the vCPU's run count `runs` and `stepping`: whether
    /// one stepping `KVM_RUN` (an odd count) has lasted [`STEP_WATCHDOG`].
    /// Once it fired, it fires again only after as long once more.
    fn due(&mut self, stepping: bool, runs: u64, now: Duration) -> bool {
        if runs != self.seen || !stepping || runs.is_multiple_of(2) {
            self.seen = runs;
            self.since = now;
            return false;
        }
        if now.saturating_sub(self.since) < STEP_WATCHDOG {
            return false;
        }
        self.since = now;
        true
    }
}

fn timer_loop(shared: &Shared) {
    let mut watchdog = Watchdog::default();
    while !shared.stop.load(Ordering::Relaxed) {
        let deadline = shared.deadline.load(Ordering::Relaxed);
        let elapsed = shared.epoch.elapsed();
        let now = elapsed.as_nanos() as u64;
        let stepping = shared.quiet.load(Ordering::Relaxed);
        if watchdog.due(stepping, shared.runs.load(Ordering::Relaxed), elapsed) {
            shared.watchdog_fired.store(true, Ordering::Relaxed);
            shared.signal();
        }
        if deadline != NO_DEADLINE && now >= deadline {
            // Kick once per deadline; the vCPU sets the next one.
            if shared
                .deadline
                .compare_exchange(deadline, NO_DEADLINE, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                shared.kick();
            }
            continue;
        }
        let wait = if deadline == NO_DEADLINE {
            Duration::from_millis(50)
        } else {
            Duration::from_nanos(deadline - now).min(Duration::from_millis(50))
        };
        std::thread::park_timeout(wait);
    }
}

impl Drop for Kicker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.timer.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        IMMEDIATE_EXIT.store(std::ptr::null_mut(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn the_watchdog_fires_only_inside_one_long_stepping_run() {
        let mut w = Watchdog::default();
        let limit = STEP_WATCHDOG.as_millis() as u64;
        // Inside run 1 (odd), stepping: quiet until the limit, then once.
        assert!(!w.due(true, 1, at(0)));
        assert!(!w.due(true, 1, at(limit - 1)));
        assert!(w.due(true, 1, at(limit)));
        assert!(!w.due(true, 1, at(limit + 1)));
        assert!(w.due(true, 1, at(2 * limit)));
        // Runs that come and go never fire, however long it all takes.
        for n in 2..100u64 {
            assert!(!w.due(true, n, at(2 * limit + n * limit)));
        }
        // Outside KVM_RUN (an even count: the loop idles, gdb holds the
        // guest), or not stepping (kicks work then), it never fires.
        let mut w = Watchdog::default();
        assert!(!w.due(true, 4, at(0)));
        assert!(!w.due(true, 4, at(10 * limit)));
        assert!(!w.due(false, 5, at(0)));
        assert!(!w.due(false, 5, at(10 * limit)));
    }
}
