//! What the user asks of a running VM: console hotkeys and `vtrace ctl`
//! requests. The VMM answers its own (`status`, `help`, `Ctrl-A x h r s`)
//! and hands every other one, word for word, to the monitor, which knows
//! its commands: the VMM names none of them.

use crate::console::{self, ConsoleInput};
use crate::frontends::HOTKEY_HELP;
use crate::monitor::{CpuView, Help};
use crate::peep::PeepMessage;

use super::{GuestExit, Next, Run};
use crate::frontends::Wake;

/// The `vtrace ctl` commands the VMM answers itself.
const OWN_COMMANDS: [&str; 2] = ["status", "help"];

impl Run<'_> {
    /// Acts on what woke the loop (console input, a signal...).
    pub(super) fn woken(&mut self, wake: Wake) -> Next {
        match wake {
            Wake::Console(input) => self.console_input(input),
            Wake::Control => {
                self.serve_control();
                Next::Continue
            }
            // The loop checks `signals::caught` once it has drained its
            // wakes (service) or before it waits again (halt).
            Wake::Signal => Next::Continue,
            // The parallel loop takes these itself; no CPU runs on a
            // thread of its own anywhere else (see `parallel`).
            Wake::CpuExit { cpu, .. } => {
                tracing::debug!("CPU {cpu}'s exit came outside the parallel loop");
                Next::Continue
            }
            Wake::Peep(PeepMessage::Batch(batch)) => {
                self.monitor.peeped(&batch.samples);
                Next::Continue
            }
            Wake::Peep(PeepMessage::TakeWithPc) => {
                let mut view = self.vm.cpu_view();
                let (pc, cr3) = (view.regs().rip, view.sregs().cr3);
                if let Some(peeper) = &self.vm.frontends.peeper {
                    let now = self.vm.machine.clock.now();
                    self.monitor.peeped(&[peeper.take_with_pc(now, pc, cr3)]);
                }
                Next::Continue
            }
        }
    }

    /// Answers the waiting `vtrace ctl` requests.
    pub(super) fn serve_control(&mut self) {
        while let Some(request) = self.vm.frontends.next_request() {
            let command = request.command.trim();
            let answer = match command {
                "status" => self.status_line(),
                "help" => command_help(&self.monitor.help()),
                _ => {
                    let answer = self.monitor.control(command).unwrap_or_else(|| {
                        format!(
                            "error: unknown command '{command}' (`vtrace ctl help` lists the \
                             commands)"
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
    fn status_line(&mut self) -> String {
        let machine = &self.vm.machine;
        let mut own = format!(
            // Ticks the timer raised so far; the closing summary counts
            // the timer interrupts the guest took, which a masked or
            // pending line leaves fewer.
            "virtual time {:.6} s, {} exits, {} timer ticks",
            machine.clock.now() as f64 / 1e9,
            machine.history.total(),
            machine.devices.timer_edges,
        );
        if !self.vm.step.stepping {
            // Where the guest runs untraced, for a user who waits for a
            // trigger (the vCPU on stage, as of its last exit).
            use crate::monitor::CpuView;
            let rip = self.vm.cpu_view().regs().rip;
            own.push_str(&format!(", the guest at {rip:#x}"));
        }
        let machine = &self.vm.machine;
        if machine.completed_by_vmm > 0 {
            own.push_str(&format!(
                ", {} instructions completed by vtrace",
                machine.completed_by_vmm
            ));
        }
        match self.monitor.status() {
            Some(more) => format!("{more}; {own}"),
            None => own,
        }
    }

    /// Prints the progress line when it is due.
    pub(super) fn report_progress_if_due(&mut self) {
        let (exits, stepping) = (self.vm.machine.history.total(), self.vm.step.stepping);
        let due = self.vm.frontends.progress.as_mut();
        let Some(rate) = due.and_then(|p| p.due(exits, stepping)) else {
            return;
        };
        let line = self.status_line();
        console::user_message(&format!("vtrace: {line} ({rate:.0} exits/s)"));
    }

    fn console_input(&mut self, input: ConsoleInput) -> Next {
        match input {
            ConsoleInput::Guest(bytes) => self.vm.machine.devices.serial.queue_input(&bytes),
            ConsoleInput::Hotkey(b'x') => {
                console::user_message("vtrace: terminated by Ctrl-A x");
                return Next::Stop(GuestExit::UserQuit);
            }
            ConsoleInput::Hotkey(b'h' | b'?') => {
                console::user_message(&hotkey_help(&self.monitor.help()));
            }
            ConsoleInput::Hotkey(b'r') => {
                let report = self.vm.crash_report(None);
                console::user_message(&format!("vtrace: guest state\n{report}"));
            }
            ConsoleInput::Hotkey(b's') => {
                console::user_message(&format!("vtrace: {}", self.status_line()));
            }
            ConsoleInput::Hotkey(key) => match self.monitor.hotkey(key) {
                Some(message) => console::user_message(&message),
                None => console::user_message(&format!(
                    "vtrace: Ctrl-A {} does nothing (Ctrl-A h lists the keys)",
                    char::from(key).escape_default()
                )),
            },
            ConsoleInput::Closed => self.vm.frontends.console_open = false,
        }
        Next::Continue
    }
}

/// `Ctrl-A h`: the VMM's keys, then the monitor's.
fn hotkey_help(monitor: &Help) -> String {
    let mut help = String::from(HOTKEY_HELP);
    for (key, meaning) in &monitor.hotkeys {
        help.push_str(&format!("\n  Ctrl-A {key}    {meaning}"));
    }
    help
}

/// The `help` request's answer: every command's usage, the monitor's
/// first, on one line (the protocol answers a request with one line).
fn command_help(monitor: &Help) -> String {
    let usages: Vec<&str> = monitor
        .commands
        .iter()
        .copied()
        .chain(OWN_COMMANDS)
        .collect();
    format!("commands: {}", usages.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctl_help_lists_the_monitors_commands_then_the_vmms_on_one_line() {
        let help = Help {
            hotkeys: vec![('t', "toggle")],
            commands: vec!["start", "mark [ID]"],
        };
        assert_eq!(
            command_help(&help),
            "commands: start, mark [ID], status, help"
        );
    }

    #[test]
    fn without_a_monitor_help_is_the_vmms_own() {
        assert_eq!(command_help(&Help::default()), "commands: status, help");
        assert_eq!(hotkey_help(&Help::default()), HOTKEY_HELP);
        let keys = hotkey_help(&Help {
            hotkeys: vec![('t', "start or stop tracing")],
            commands: Vec::new(),
        });
        assert!(keys.ends_with("\n  Ctrl-A t    start or stop tracing"));
    }
}
