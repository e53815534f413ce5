//! Interrupts and exceptions into the guest: through KVM, or through the
//! guest's IDT by the VMM where the CPU would carry the tracer's TF
//! into a frame it pushes.

use crate::cpu::soft_int;
use crate::error::Result;
use crate::monitor::{Exception, ExceptionKind, ExitView, Injection, Monitor};
use crate::vm::Vm;

impl Vm {
    /// Delivers the PIC's pending interrupt if the guest can take it now,
    /// else asks KVM to exit as soon as it can.
    pub(super) fn inject(&mut self, irqs: &mut [u64; 16], monitor: &mut dyn Monitor) -> Result<()> {
        let pending = self.machine.devices.pic.pending_vector().is_some();
        if pending && self.step.stepping && !monitor.interruptible() {
            // Stepping exits after every instruction anyway.
            return Ok(());
        }
        let run = self.machine.vcpu.run_page();
        if !pending {
            run.request_interrupt_window = 0;
            return Ok(());
        }
        if run.ready_for_interrupt_injection != 0 && run.if_flag != 0 {
            run.request_interrupt_window = 0;
            // An IN or MMIO read completes on the next entry; moving RIP
            // under it would break the completion. Deliver one exit later.
            // Whether the next entry steps, not whether the last one did:
            // an interrupt queued where tracing starts would be delivered by
            // the CPU with the tracer's TF in the frame it pushes, for the
            // guest to find after tracing stops.
            if monitor.deliver_interrupts() && monitor.stepping() && !self.step.io_pending {
                if let Some(handler) = self.deliver_through_idt()? {
                    if let Some((vector, irq)) = self.machine.devices.pic.acknowledge() {
                        irqs[usize::from(irq)] += 1;
                        let how = Injection::Delivered { handler };
                        monitor.on_inject(vector, irq, how, &mut self.cpu_view());
                    }
                    return Ok(());
                }
            } else if monitor.deliver_interrupts() && self.step.io_pending {
                return Ok(());
            }
            if let Some((vector, irq)) = self.machine.devices.pic.acknowledge() {
                self.machine.vcpu.interrupt(vector)?;
                irqs[usize::from(irq)] += 1;
                monitor.on_inject(vector, irq, Injection::Queued, &mut self.cpu_view());
            }
        } else {
            run.request_interrupt_window = 1;
        }
        Ok(())
    }

    /// Where stepping is about to start, an interrupt queued with
    /// `KVM_INTERRUPT` while it was off may still wait inside KVM (a kick,
    /// such as the `vtrace ctl start` that turns tracing on, cut the last
    /// `KVM_RUN` short). The CPU would deliver it with the tracer's TF in the
    /// frame it pushes and run the handler unstepped, so the VMM takes it
    /// back and delivers it through the IDT itself.
    pub(super) fn reclaim_queued_interrupt(&mut self, monitor: &mut dyn Monitor) -> Result<()> {
        let Some(vector) = self.machine.vcpu.take_queued_interrupt()? else {
            return Ok(());
        };
        match self.deliver_vector(vector)? {
            Some(handler) => monitor.on_inject(
                vector,
                // Counted by its IRQ line when it was queued.
                u8::MAX,
                Injection::Delivered { handler },
                &mut self.cpu_view(),
            ),
            None => self.machine.vcpu.interrupt(vector)?,
        }
        Ok(())
    }

    /// Delivers the PIC's pending vector through the guest IDT in the VMM.
    /// Returns the handler address, or None where the VMM does not model
    /// the delivery (not 64-bit mode at CPL 0 or 3, a bad gate): the caller
    /// then queues the interrupt with KVM instead.
    pub(super) fn deliver_through_idt(&mut self) -> Result<Option<u64>> {
        let Some(vector) = self.machine.devices.pic.pending_vector() else {
            return Ok(None);
        };
        self.deliver_vector(vector)
    }

    /// Delivers `vector` through the guest IDT (see `deliver_through_idt`).
    pub(super) fn deliver_vector(&mut self, vector: u8) -> Result<Option<u64>> {
        let mut regs = self.machine.vcpu.regs();
        let mut sregs = self.machine.vcpu.sregs();
        let return_rip = regs.rip;
        let memory = self.machine.vcpu.memory(&self.machine.ram);
        let Ok(sregs_changed) =
            soft_int::deliver(&memory, &mut regs, &mut sregs, vector, return_rip)
        else {
            return Ok(None);
        };
        if sregs_changed {
            self.machine.vcpu.set_sregs(&sregs)?;
        }
        self.machine.vcpu.set_regs(&regs)?;
        Ok(Some(regs.rip))
    }

    /// Delivers an exception the monitor foresaw, through the guest's IDT,
    /// and tells the monitor. Where the VMM does not model the delivery
    /// (see `soft_int`), the instruction runs and the CPU delivers it.
    pub(super) fn deliver_exception(
        &mut self,
        e: Exception,
        monitor: &mut dyn Monitor,
    ) -> Result<()> {
        let mut regs = self.machine.vcpu.regs();
        let mut sregs = self.machine.vcpu.sregs();
        if let Some(cr2) = e.cr2 {
            sregs.cr2 = cr2;
        }
        let memory = self.machine.vcpu.memory(&self.machine.ram);
        let delivered = soft_int::deliver_with_error_code(
            &memory,
            &mut regs,
            &mut sregs,
            e.vector,
            e.return_rip,
            e.error_code,
        );
        if let Err(why) = delivered {
            tracing::debug!("vector {} not delivered by the VMM: {why}", e.vector);
            return Ok(());
        }
        self.machine.vcpu.set_sregs(&sregs)?;
        self.machine.vcpu.set_regs(&regs)?;
        let view = match e.kind {
            ExceptionKind::Fault => ExitView::FaultDelivered {
                vector: e.vector,
                error_code: e.error_code,
            },
            ExceptionKind::SoftwareInterrupt => {
                // The instruction completed.
                self.machine.clock.step();
                ExitView::CompletedByVmm {
                    vector: Some(e.vector),
                }
            }
        };
        self.tell(monitor, view);
        Ok(())
    }
}
