//! What the user asks of a running VM: console hotkeys and `vtrace ctl`
//! requests.

use crate::console::{self, ConsoleInput};
use crate::frontends::HOTKEY_HELP;
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
                if let Some(peeper) = &self.frontends.peeper {
                    monitor.peeped(&[peeper.take_with_pc(self.machine.clock.now(), pc, cr3)]);
                }
                Next::Continue
            }
        }
    }

    /// Answers the waiting `vtrace ctl` requests.
    pub(super) fn serve_control(&mut self, monitor: &mut dyn Monitor) {
        while let Some(request) = self.frontends.next_request() {
            let answer = match request.command.as_str() {
                "status" => self.status_line(monitor),
                command => {
                    let answer = monitor.control(command).unwrap_or_else(|| {
                        format!(
                            "error: unknown command '{command}' (start, stop, mark [ID], status)"
                        )
                    });
                    // What changes the run is said where it runs, as a
                    // hotkey's effect is.
                    console::user_message(&format!("vtrace: {answer} (vtrace ctl {command})"));
                    answer
                }
            };
            request.reply(answer);
        }
    }

    /// What `Ctrl-A s`, `vtrace ctl status` and the periodic progress
    /// line say: the monitor's status (tracing, steps, disk), then the
    /// VM's own.
    pub(super) fn status_line(&mut self, monitor: &mut dyn Monitor) -> String {
        let mut own = format!(
            // Ticks the timer raised so far; the closing summary counts
            // the timer interrupts the guest took, which a masked or
            // pending line leaves fewer.
            "virtual time {:.6} s, {} exits, {} timer ticks",
            self.machine.clock.now() as f64 / 1e9,
            self.machine.history.total(),
            self.machine.devices.timer_edges,
        );
        if self.machine.completed_by_vmm > 0 {
            own.push_str(&format!(
                ", {} instructions completed by vtrace",
                self.machine.completed_by_vmm
            ));
        }
        match monitor.control("status") {
            Some(more) => format!("{more}; {own}"),
            None => own,
        }
    }

    /// Prints the progress line when it is due (see
    /// [`Vm::report_progress`]).
    pub(super) fn report_progress_if_due(&mut self, monitor: &mut dyn Monitor) {
        let (exits, stepping) = (self.machine.history.total(), self.step.stepping);
        let due = self.frontends.progress.as_mut();
        let Some(rate) = due.and_then(|p| p.due(exits, stepping)) else {
            return;
        };
        let line = self.status_line(monitor);
        console::user_message(&format!("vtrace: {line} ({rate:.0} exits/s)"));
    }

    pub(super) fn console_input(&mut self, input: ConsoleInput, monitor: &mut dyn Monitor) -> Next {
        match input {
            ConsoleInput::Guest(bytes) => self.machine.devices.serial.queue_input(&bytes),
            ConsoleInput::Hotkey(b'x') => {
                console::user_message("vtrace: terminated by Ctrl-A x");
                return Next::Stop(GuestExit::UserQuit);
            }
            ConsoleInput::Hotkey(b'h' | b'?') => {
                let mut help = String::from(HOTKEY_HELP);
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
            ConsoleInput::Closed => self.frontends.console_open = false,
        }
        Next::Continue
    }
}
