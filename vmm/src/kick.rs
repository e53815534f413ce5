//! Getting the vCPU out of `KVM_RUN` when a device needs it: a timer
//! deadline has come, or the user typed something.
//!
//! A guest computing in a loop never exits on its own, so a helper thread
//! sends the vCPU thread a signal at the next device deadline. The signal
//! handler sets `kvm_run.immediate_exit`, which closes the race of a signal
//! landing just before `KVM_RUN` is entered (the documented KVM idiom).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// `immediate_exit` byte of the `kvm_run` of the vCPU on stage (one VM per
/// process, its vCPUs entered from one thread).
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
    stop: AtomicBool,
    target: libc::pthread_t,
}

impl Shared {
    fn kick(&self) {
        if self.quiet.load(Ordering::Relaxed) {
            return;
        }
        // SAFETY: target is the live vCPU thread (the Kicker is dropped on
        // it before it exits); the signal has a handler installed.
        unsafe { libc::pthread_kill(self.target, kick_signal()) };
    }
}

/// Kicks the calling (vCPU) thread out of `KVM_RUN` on demand or on time.
pub struct Kicker {
    shared: Arc<Shared>,
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
            stop: AtomicBool::new(false),
            // SAFETY: pthread_self has no preconditions.
            target: unsafe { libc::pthread_self() },
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
            timer: Some(timer),
        })
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

    /// A handle for other threads (the console) to kick the vCPU.
    pub fn handle(&self) -> KickHandle {
        KickHandle(self.shared.clone())
    }
}

fn timer_loop(shared: &Shared) {
    while !shared.stop.load(Ordering::Relaxed) {
        let deadline = shared.deadline.load(Ordering::Relaxed);
        let now = shared.epoch.elapsed().as_nanos() as u64;
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
