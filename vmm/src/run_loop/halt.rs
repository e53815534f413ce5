//! The guest idles in HLT: wait for the next device event, console
//! input, a `vtrace ctl` request or a stop signal.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use crate::clock::VirtualNanos;
use crate::error::{Error, Result};
use crate::monitor::Monitor;
use crate::signals;
use crate::vm::Vm;

use super::{GuestExit, Next, Wake};

impl Vm {
    /// The guest executed HLT: wait (in host time) until a device has
    /// something for it, serving console input meanwhile.
    pub(super) fn halt(
        &mut self,
        rx: &Receiver<Wake>,
        monitor: &mut dyn Monitor,
        irqs: &mut [u64; 16],
    ) -> Result<Next> {
        if self.machine.vcpu.run_page().if_flag == 0 {
            return Err(Error::GuestFailure {
                reason: "the guest halted with interrupts disabled, so nothing can wake it \
                         (a guest that is done should use the EXIT hypercall)"
                    .into(),
                report: Box::new(self.crash_report(None)),
            });
        }
        loop {
            let now: VirtualNanos = self.machine.clock.now();
            self.machine.devices.update_interrupts(now);
            if let Some(end) = self.machine.devices.machine_end() {
                return Ok(Next::Stop(end));
            }
            if self.machine.devices.pic.pending_vector().is_some() {
                self.inject(irqs, monitor)?;
                return Ok(Next::Continue);
            }
            let deadline = self.machine.devices.next_deadline();
            if let (Some(d), true) = (deadline, self.machine.clock.step_driven()) {
                // Nothing runs while the guest idles: jump to its next event.
                self.machine.clock.skip_to(d);
                continue;
            }
            let wait = deadline
                .and_then(|d| self.machine.clock.host_delay_until(d))
                .unwrap_or(Duration::from_millis(100));
            if let Some(signal) = signals::caught() {
                return Ok(Next::Stop(GuestExit::Signal(signal)));
            }
            if deadline.is_none() && !self.frontends.console_open {
                return Err(Error::GuestFailure {
                    reason: "the guest halted with no timer programmed and no console \
                             input, so nothing can wake it"
                        .into(),
                    report: Box::new(self.crash_report(None)),
                });
            }
            match rx.recv_timeout(wait) {
                Ok(wake) => {
                    if let Next::Stop(exit) = self.woken(wake, monitor) {
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
