//! SIGINT, SIGTERM and SIGHUP end a run cleanly instead of killing it.
//!
//! Killed by one of them, vtrace would lose the trace segment being filled,
//! the stop record and the control socket file. Caught, the signal is
//! noted; the run loop sees it at its next exit (a kick gets a computing
//! guest out of `KVM_RUN`, a halted one is woken) and ends the run with
//! [`GuestExit::Signal`](crate::GuestExit::Signal), so the caller can flush
//! and exit with status 128 + the signal's number, as the shell would show.
//!
//! A second one of these signals while the first is being handled (a flush
//! that takes too long for the user) does what the signal does by default,
//! after the terminal is restored: the user can always get out.
//!
//! Signal dispositions belong to the process, so this state is global.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::error::{Error, Result};

/// The signals that stop a run.
pub const STOP_SIGNALS: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// The first stop signal caught; 0 while none has been.
static CAUGHT: AtomicI32 = AtomicI32::new(0);
/// Whether installing the handlers worked (once per process).
static INSTALLED: OnceLock<std::result::Result<(), i32>> = OnceLock::new();

type Waker = Box<dyn Fn() + Send>;
/// Gets the run loop going when a signal is caught (set by the run loop).
static WAKER: Mutex<Option<Waker>> = Mutex::new(None);

/// Catches the stop signals from now on, for the life of the process.
/// Idempotent; [`Vm::run`](crate::Vm::run) calls it, and a program that
/// must not die of a signal before the run starts calls it earlier.
pub fn catch_stop_signals() -> Result<()> {
    // The OnceLock keeps the errno: an io::Error is not Clone.
    let installed =
        *INSTALLED.get_or_init(|| install().map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL)));
    installed.map_err(|errno| Error::Host {
        what: "catch SIGINT, SIGTERM and SIGHUP",
        source: std::io::Error::from_raw_os_error(errno),
    })
}

fn install() -> std::io::Result<()> {
    for signal in STOP_SIGNALS {
        // SAFETY: the action runs in the signal handler and only calls
        // async-signal-safe functions (an atomic load, tcsetattr, and
        // signal-hook's emulation of the default action).
        unsafe {
            signal_hook::low_level::register(signal, move || {
                if CAUGHT.load(Ordering::SeqCst) != 0 {
                    crate::console::restore_terminal_in_handler();
                    let _ = signal_hook::low_level::emulate_default_handler(signal);
                }
            })?;
        }
    }
    let mut signals = Signals::new(STOP_SIGNALS)?;
    std::thread::Builder::new()
        .name("vtrace-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                let _ = CAUGHT.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
                if let Ok(waker) = WAKER.lock() {
                    if let Some(wake) = waker.as_ref() {
                        wake();
                    }
                }
            }
        })?;
    Ok(())
}

/// The stop signal caught, if one was.
pub fn caught() -> Option<i32> {
    match CAUGHT.load(Ordering::Relaxed) {
        0 => None,
        signal => Some(signal),
    }
}

/// The signal's name (`SIGINT`), or its number.
pub fn name(signal: i32) -> String {
    signal_hook::low_level::signal_name(signal)
        .map(str::to_string)
        .unwrap_or_else(|| format!("signal {signal}"))
}

/// Sets what to call when a signal is caught; `None` when the run ends.
pub(crate) fn set_waker(wake: Option<Waker>) {
    if let Ok(mut waker) = WAKER.lock() {
        *waker = wake;
    }
}
