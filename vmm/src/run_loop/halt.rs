//! The guest idles in HLT: wait for the next device event, console
//! input, a `vtrace ctl` request or a stop signal.

use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use crate::clock::VirtualNanos;
use crate::error::{Error, Result};
use crate::signals;

use super::{GuestExit, Next, Run};

impl Run<'_> {
    /// The guest executed HLT: wait (in host time) until a device has
    /// something for it, serving console input meanwhile.
    pub(super) fn halt(&mut self) -> Result<Next> {
        if self.vm.machine.vcpu.run_page().if_flag == 0 {
            return Err(Error::GuestFailure {
                reason: "the guest halted with interrupts disabled, so nothing can wake it \
                         (a guest that is done should use the EXIT hypercall)"
                    .into(),
                report: Box::new(self.vm.crash_report(None)),
            });
        }
        loop {
            let now: VirtualNanos = self.vm.machine.clock.now();
            self.vm.machine.devices.update_interrupts(now);
            if let Some(end) = self.vm.machine.devices.machine_end() {
                return Ok(Next::Stop(end));
            }
            if self.vm.machine.devices.pic.pending_vector().is_some() {
                self.inject()?;
                return Ok(Next::Continue);
            }
            let deadline = self.vm.machine.devices.next_deadline();
            if let (Some(d), true) = (deadline, self.vm.machine.clock.step_driven()) {
                // Nothing runs while the guest idles: jump to its next event.
                self.vm.machine.clock.skip_to(d);
                continue;
            }
            let wait = deadline
                .and_then(|d| self.vm.machine.clock.host_delay_until(d))
                .unwrap_or(Duration::from_millis(100));
            if let Some(signal) = signals::caught() {
                return Ok(Next::Stop(GuestExit::Signal(signal)));
            }
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
                    if let Next::Stop(exit) = self.woken(wake) {
                        return Ok(Next::Stop(exit));
                    }
                }
                // The senders live as long as the loop: a timeout, or a
                // channel that cannot end.
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
            }
        }
    }
}
