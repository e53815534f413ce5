//! The guest idles in HLT: wait for the next device event, console
//! input, a `vtrace ctl` request or a stop signal. On a machine of several
//! CPUs only the halted CPU idles, until every CPU does; and where the
//! CPUs stop running in parallel, the turns go on from a CPU that may run.

use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use crate::clock::VirtualNanos;
use crate::error::{Error, Result};
use crate::frontends::Wake;
use crate::signals;

use super::turns::Turn;
use super::{GuestExit, Next, Run};
use crate::cpus::Power;

impl Run<'_> {
    /// The guest executed HLT: wait (in host time) until a device has
    /// something for it, serving console input meanwhile.
    pub(super) fn halt(&mut self) -> Result<Next> {
        let if_flag = self.vm.interrupts_enabled();
        let several = self.vm.machine.cpus.count() > 1;
        if several {
            // This CPU sits out its turns; the machine waits only when every
            // CPU does.
            let cpu = self.vm.machine.cpus.on_stage();
            let power = if if_flag {
                Power::Halted
            } else {
                Power::Stopped
            };
            self.vm.machine.cpus.set_power(cpu, power);
        } else if !if_flag {
            return Err(Error::GuestFailure {
                reason: "the guest halted with interrupts disabled, so nothing can wake it \
                         (a guest that is done should use the EXIT hypercall)"
                    .into(),
                report: Box::new(self.vm.crash_report(None)),
            });
        }
        self.idle(several)
    }

    /// The turns go on after the CPUs ran in parallel, from the CPU on
    /// stage: the one whose exit was served last, which may have been a
    /// HLT. A halted CPU entered again would run on from its HLT as if
    /// woken, or take the interrupt that woke it and then sit out its
    /// turns as still halted; the turn goes to a CPU that may run,
    /// waiting as a halt does where none may yet.
    pub(super) fn resume_turns(&mut self) -> Result<Next> {
        let cpus = &self.vm.machine.cpus;
        if cpus.power()[cpus.on_stage()] == Power::Running {
            return Ok(Next::Continue);
        }
        let next = self.idle(true)?;
        if let Next::Continue = next {
            self.next_turn();
        }
        Ok(next)
    }

    /// Waits until a CPU may run (`several`) or the one CPU has an
    /// interrupt to take, serving console input, `vtrace ctl` and signals
    /// meanwhile; under the step clock, time jumps to the next event.
    fn idle(&mut self, several: bool) -> Result<Next> {
        loop {
            let now: VirtualNanos = self.vm.machine.clock.now();
            self.vm.machine.devices.update_interrupts(now);
            if let Some(end) = self.vm.machine.devices.machine_end() {
                return Ok(Next::Stop(end));
            }
            if several {
                if self.whose_turn_follows() != Turn::AllIdle {
                    // The loop gives it its turn.
                    return Ok(Next::Continue);
                }
                if !self.vm.machine.cpus.power().contains(&Power::Halted) {
                    return Err(Error::GuestFailure {
                        reason: "every CPU halted with interrupts disabled or waits for a \
                                 STARTUP IPI, so nothing can wake the machine (a guest \
                                 that is done should use the EXIT hypercall)"
                            .into(),
                        report: Box::new(self.vm.crash_report(None)),
                    });
                }
            } else if self.vm.pending_vector().is_some() {
                self.inject()?;
                return Ok(Next::Continue);
            }
            if let Some(signal) = signals::caught() {
                return Ok(Next::Stop(GuestExit::Signal(signal)));
            }
            let deadline = self.vm.machine.devices.next_deadline();
            if let (Some(d), true) = (deadline, self.vm.machine.clock.step_driven()) {
                // Nothing runs while the guest idles: jump to its next event.
                // A guest that masked every interrupt jumps for ever, so
                // `vtrace ctl` and the console are still heard meanwhile.
                self.vm.machine.clock.skip_to(d);
                while let Ok(wake) = self.wakes.try_recv() {
                    if let Some(exit) = self.woken_idle(wake) {
                        return Ok(Next::Stop(exit));
                    }
                }
                continue;
            }
            let wait = deadline
                .and_then(|d| self.vm.machine.clock.host_delay_until(d))
                .unwrap_or(Duration::from_millis(100));
            if deadline.is_none() && !self.vm.frontends.console_open {
                return Err(Error::GuestFailure {
                    reason: "the guest halted with no timer programmed and no console \
                             input, so nothing can wake it"
                        .into(),
                    report: Box::new(self.vm.crash_report(None)),
                });
            }
            match self.wakes.recv_timeout(wait) {
                Ok(wake) => {
                    if let Some(exit) = self.woken_idle(wake) {
                        return Ok(Next::Stop(exit));
                    }
                }
                // The senders live as long as the loop: a timeout, or a
                // channel that cannot end.
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
            }
        }
    }

    /// Serves what woke the idle loop: the run's end where it brings one.
    fn woken_idle(&mut self, wake: Wake) -> Option<GuestExit> {
        if let Next::Stop(exit) = self.woken(wake) {
            return Some(exit);
        }
        // A `vtrace ctl stop` with --exit-after-trace ends the run now, not
        // when an interrupt next wakes a CPU (never, in a guest that
        // masked them all).
        self.monitor
            .plan_entry()
            .done
            .then_some(GuestExit::MonitorDone)
    }
}
