//! What the user asks of a running VM: console hotkeys and `vtrace ctl`
//! requests.

use crate::console::{self, ConsoleInput};
use crate::monitor::{CpuView, Monitor};
use crate::peep::PeepMessage;
use crate::vm::Vm;

use super::{GuestExit, Next, Wake};

impl Vm {
    /// Acts on what woke the loop (console input, a signal...).
    pub(super) fn woken(&mut self, wake: Wake, monitor: &mut dyn Monitor) -> Next {
        match wake {
            Wake::Console(input) => self.console_input(input, monitor),
            Wake::Control => {
                self.serve_control(monitor);
                Next::Continue
            }
            // The loop checks `signals::caught` once it has drained its
            // wakes (service) or before it waits again (halt).
            Wake::Signal => Next::Continue,
            Wake::Peep(PeepMessage::Batch(batch)) => {
                monitor.peeped(&batch.samples);
                Next::Continue
            }
            Wake::Peep(PeepMessage::TakeWithPc) => {
                let mut view = self.cpu_view();
                let (pc, cr3) = (view.regs().rip, view.sregs().cr3);
                if let Some(peeper) = &self.peeper {
                    monitor.peeped(&[peeper.take_with_pc(self.clock.now(), pc, cr3)]);
                }
                Next::Continue
            }
        }
    }

    /// Answers the waiting `vtrace ctl` requests.
    pub(super) fn serve_control(&mut self, monitor: &mut dyn Monitor) {
        while let Some(request) = self.control.as_ref().and_then(|c| c.try_next()) {
            let answer = match request.command.as_str() {
                "status" => self.status_line(monitor),
                command => monitor.control(command).unwrap_or_else(|| {
                    format!("error: unknown command '{command}' (start, stop, mark [ID], status)")
                }),
            };
            request.reply(answer);
        }
    }

    /// What `Ctrl-A s`, `vtrace ctl status` and the periodic progress
    /// line say: the monitor's status (tracing, steps, disk), then the
    /// VM's own.
    pub(super) fn status_line(&mut self, monitor: &mut dyn Monitor) -> String {
        let mut own = format!(
            "virtual time {:.6} s, {} exits, {} timer interrupts",
            self.clock.now() as f64 / 1e9,
            self.history.total(),
            self.devices.timer_edges,
        );
        if self.completed_by_vmm > 0 {
            own.push_str(&format!(
                ", {} instructions completed by vtrace",
                self.completed_by_vmm
            ));
        }
        match monitor.control("status") {
            Some(more) => format!("{more}; {own}"),
            None => own,
        }
    }

    /// Prints the progress line when it is due (see
    /// [`Vm::report_progress`]): while stepping, looked at every 4096
    /// exits, so the clock is not read per step.
    pub(super) fn progress(&mut self, monitor: &mut dyn Monitor) {
        let exits = self.history.total();
        let Some(p) = &self.progress else {
            return;
        };
        if !self.stepping || !exits.is_multiple_of(4096) || p.last.elapsed() < p.every {
            return;
        }
        let (every, rate) = (
            p.every,
            exits.saturating_sub(p.exits) as f64 / p.last.elapsed().as_secs_f64(),
        );
        let line = self.status_line(monitor);
        console::user_message(&format!("vtrace: {line} ({rate:.0} exits/s)"));
        self.progress = Some(super::ProgressLine {
            every,
            last: std::time::Instant::now(),
            exits,
        });
    }

    pub(super) fn console_input(&mut self, input: ConsoleInput, monitor: &mut dyn Monitor) -> Next {
        match input {
            ConsoleInput::Guest(bytes) => self.devices.serial.queue_input(&bytes),
            ConsoleInput::Hotkey(b'x') => {
                console::user_message("vtrace: terminated by Ctrl-A x");
                return Next::Stop(GuestExit::UserQuit);
            }
            ConsoleInput::Hotkey(b'h' | b'?') => {
                let mut help = String::from(
                    "vtrace console keys (press Ctrl-A, then the key):\n  \
                     Ctrl-A x    quit vtrace\n  \
                     Ctrl-A h    this help\n  \
                     Ctrl-A r    show the guest's registers and recent exits\n  \
                     Ctrl-A s    show run statistics\n  \
                     Ctrl-A C-a  send Ctrl-A to the guest",
                );
                for (key, meaning) in monitor.hotkey_help() {
                    help.push_str(&format!("\n  Ctrl-A {key}    {meaning}"));
                }
                console::user_message(&help);
            }
            ConsoleInput::Hotkey(b'r') => {
                let report = self.crash_report(None);
                console::user_message(&format!("vtrace: guest state\n{report}"));
            }
            ConsoleInput::Hotkey(b's') => {
                console::user_message(&format!("vtrace: {}", self.status_line(monitor)));
            }
            ConsoleInput::Hotkey(key) => match monitor.hotkey(key) {
                Some(message) => console::user_message(&message),
                None => console::user_message(&format!(
                    "vtrace: Ctrl-A {} does nothing (Ctrl-A h lists the keys)",
                    char::from(key).escape_default()
                )),
            },
            ConsoleInput::Closed => self.console_open = false,
        }
        Next::Continue
    }
}
