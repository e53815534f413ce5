//! What stands around the run loop for the user, not in it: the terminal
//! and its hotkeys, the `vtrace ctl` socket, the peeper's thread and the
//! periodic progress line. Each reaches the loop as a [`Wake`]; the loop
//! only drains them between exits.

use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use crate::clock::ClockReader;
use crate::console::{self, ConsoleInput, RawTerminal};
use crate::control::{ControlRequest, ControlServer};
use crate::error::Result;
use crate::kick::Kicker;
use crate::memory::GuestRam;
use crate::peep::{PeepMessage, PeepPlan, Peeper};

/// Whether the VM owns the terminal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConsoleMode {
    /// Raw terminal (when stdin is one), stdin to the guest, hotkeys.
    Interactive,
    /// Serial output only; stdin is not read.
    OutputOnly,
}

/// What wakes the run loop between exits or from a halt.
pub(crate) enum Wake {
    /// Console input: bytes for the guest, a hotkey, or its end.
    Console(ConsoleInput),
    /// A `vtrace ctl` request is waiting.
    Control,
    /// A stop signal was caught.
    Signal,
    /// The peeper has samples, or asks for one with the pc.
    Peep(PeepMessage),
    /// CPU `cpu`, entered on a thread of its own while the CPUs run in
    /// parallel, left `KVM_RUN`: with an exit in its `kvm_run` (`errno` 0)
    /// or with this error number.
    CpuExit { cpu: usize, errno: i32 },
}

/// What `Ctrl-A h` lists before the monitor's own keys.
pub(crate) const HOTKEY_HELP: &str = "vtrace console keys (press Ctrl-A, then the key):\n  \
     Ctrl-A x    quit vtrace\n  \
     Ctrl-A h    this help\n  \
     Ctrl-A r    show the guest's registers and recent exits\n  \
     Ctrl-A s    show run statistics\n  \
     Ctrl-A C-a  send Ctrl-A to the guest";

/// The run's frontends, set up before the guest boots and started with
/// the run.
pub(crate) struct Frontends {
    pub(crate) console: ConsoleMode,
    /// Console input may still come (interactive, and stdin not closed).
    pub(crate) console_open: bool,
    pub(crate) control: Option<ControlServer>,
    /// What to peep at while the guest runs, if anything.
    pub(crate) peep: Option<PeepPlan>,
    /// The peeper, while a run has one.
    pub(crate) peeper: Option<Peeper>,
    /// The periodic status line, where asked for.
    pub(crate) progress: Option<ProgressLine>,
}

impl Frontends {
    pub(crate) fn new(console: ConsoleMode, control: Option<ControlServer>) -> Frontends {
        Frontends {
            console,
            console_open: false,
            control,
            peep: None,
            peeper: None,
            progress: None,
        }
    }

    /// Starts every frontend's thread, each sending to `tx` and kicking
    /// the vCPU out of `KVM_RUN`. The terminal stays raw while the
    /// returned guard lives.
    pub(crate) fn start(
        &mut self,
        tx: &Sender<Wake>,
        kicker: &Kicker,
        ram: &GuestRam,
        clock: ClockReader,
    ) -> Result<Option<RawTerminal>> {
        let raw = match self.console {
            ConsoleMode::Interactive => RawTerminal::enable()?,
            ConsoleMode::OutputOnly => None,
        };
        if let Some(plan) = self.peep.clone() {
            let (tx, handle) = (tx.clone(), kicker.handle());
            // Once the loop is gone (the run ended, or failed to start),
            // sending fails and the peeper stops.
            let send = Box::new(move |message, kick| {
                let sent = tx.send(Wake::Peep(message)).is_ok();
                if kick && sent {
                    handle.kick();
                }
                sent
            });
            self.peeper = Some(Peeper::start(plan, ram.clone(), clock, send)?);
        }
        if let Some(control) = &self.control {
            control.set_waker(waker(tx, kicker, || Wake::Control));
        }
        self.console_open = self.console == ConsoleMode::Interactive;
        if self.console_open {
            let (tx, handle) = (tx.clone(), kicker.handle());
            console::spawn_input_thread(move |input| {
                let sent = tx.send(Wake::Console(input)).is_ok();
                handle.kick();
                sent
            })?;
        }
        Ok(raw)
    }

    /// The next waiting `vtrace ctl` request.
    pub(crate) fn next_request(&self) -> Option<ControlRequest> {
        self.control.as_ref().and_then(|c| c.try_next())
    }
}

/// A function for another thread that sends `what` to the loop and kicks
/// the vCPU out of `KVM_RUN`.
pub(crate) fn waker(
    tx: &Sender<Wake>,
    kicker: &Kicker,
    what: fn() -> Wake,
) -> Box<dyn Fn() + Send> {
    let (tx, handle) = (tx.clone(), kicker.handle());
    Box::new(move || {
        let _ = tx.send(what());
        handle.kick();
    })
}

/// The periodic progress line's schedule.
pub(crate) struct ProgressLine {
    every: Duration,
    last: Instant,
    /// Exits at `last`.
    exits: u64,
}

impl ProgressLine {
    /// A line every `every` of host time, the first one `every` from now.
    pub(crate) fn new(every: Duration) -> ProgressLine {
        ProgressLine {
            every,
            last: Instant::now(),
            exits: 0,
        }
    }

    /// Whether a line is due after `exits` exits, and if so the exit rate
    /// since the last one (the schedule then starts again). While
    /// stepping it is looked at every 4096 exits only, so the clock is
    /// not read per step; untraced at every exit (they are far apart).
    pub(crate) fn due(&mut self, exits: u64, stepping: bool) -> Option<f64> {
        let look = !stepping || exits.is_multiple_of(4096);
        if !look || self.last.elapsed() < self.every {
            return None;
        }
        let rate = exits.saturating_sub(self.exits) as f64 / self.last.elapsed().as_secs_f64();
        self.last = Instant::now();
        self.exits = exits;
        Some(rate)
    }
}
