//! What the user asks of a running VM: console hotkeys and `vtrace ctl`
//! requests. The VMM answers its own (`status`, `help`, `Ctrl-A x h r s`)
//! and hands every other one, word for word, to the monitor, which knows
//! its commands: the VMM names none of them.

use crate::console::{self, ConsoleInput};
use crate::frontends::HOTKEY_HELP;
use crate::monitor::{CpuView, Help};
use crate::peep::PeepMessage;

use super::{GuestExit, Next, Run, Wake};

/// The `vtrace ctl` commands the VMM answers itself.
const OWN_COMMANDS: [(&str, &str); 2] = [
    (
        "status",
        "the run's state: tracing, steps, disk, virtual time",
    ),
    ("help", "this list"),
];

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

/// `vtrace ctl help`: the monitor's commands, then the VMM's own, one a
/// line with the usage in a column.
fn command_help(monitor: &Help) -> String {
    let commands: Vec<_> = monitor.commands.iter().chain(&OWN_COMMANDS).collect();
    let width = commands.iter().map(|(usage, _)| usage.len()).max();
    let mut help = String::from("vtrace ctl commands:");
    for (usage, meaning) in commands {
        let pad = width.unwrap_or(0).saturating_sub(usage.len());
        help.push_str(&format!("\n  {usage}{}  {meaning}", " ".repeat(pad)));
    }
    help
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctl_help_lists_the_monitors_commands_then_the_vmms() {
        let help = Help {
            hotkeys: vec![('t', "toggle")],
            commands: vec![("start", "start tracing"), ("mark [ID]", "a mark")],
        };
        let text = command_help(&help);
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines[0], "vtrace ctl commands:");
        assert_eq!(lines[1], "  start      start tracing");
        assert_eq!(lines[2], "  mark [ID]  a mark");
        assert!(lines[3].starts_with("  status     "));
        assert!(lines[4].starts_with("  help       "));
        assert_eq!(lines.len(), 5);
    }

    #[test]
    fn without_a_monitor_help_is_the_vmms_own() {
        assert_eq!(command_help(&Help::default()).lines().count(), 3);
        assert_eq!(hotkey_help(&Help::default()), HOTKEY_HELP);
        let keys = hotkey_help(&Help {
            hotkeys: vec![('t', "start or stop tracing")],
            commands: Vec::new(),
        });
        assert!(keys.ends_with("\n  Ctrl-A t    start or stop tracing"));
    }
}
