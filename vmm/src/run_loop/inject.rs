//! Interrupts and exceptions into the guest: through KVM, or through the
//! guest's IDT by the VMM where the CPU would carry the tracer's TF
//! into a frame it pushes.

use crate::cpu::soft_int;
use crate::error::Result;
use crate::monitor::{Exception, ExceptionKind, ExitView, Injection};
use crate::vm::Vm;

use super::decide::{self, InjectionState};
use super::Run;

impl Run<'_> {
    /// Delivers the on-stage CPU's pending interrupt (the PIC's, or its local
    /// APIC's) if it can take it now, else asks KVM to exit as soon as it
    /// can, unless the step's exit comes first (see [`decide::injection`]).
    pub(super) fn inject(&mut self) -> Result<()> {
        if self.vm.on_engine() {
            return self.inject_on_engine();
        }
        let run = self.vm.machine.vcpu.run_page();
        let window_open = run.ready_for_interrupt_injection != 0 && run.if_flag != 0;
        let state = InjectionState {
            pending: self.vm.pending_vector().is_some(),
            stepping: self.vm.step.stepping,
            io_pending: self.vm.step.io_pending,
            window_open,
            plan: self.monitor.plan_entry(),
        };
        let how = decide::injection(state);
        let run = self.vm.machine.vcpu.run_page();
        run.request_interrupt_window = u8::from(how == decide::Injection::RequestWindow);
        match how {
            decide::Injection::ThroughIdt => {
                if let Some(handler) = self.vm.deliver_through_idt()? {
                    if let Some((vector, irq)) = self.vm.acknowledge() {
                        self.count(irq);
                        let how = Injection::Delivered { handler };
                        self.monitor
                            .on_inject(vector, irq, how, &mut self.vm.cpu_view());
                    }
                    return Ok(());
                }
                // Not modelled by the VMM: KVM delivers it.
                self.queue()
            }
            decide::Injection::Queue => self.queue(),
            _ => Ok(()),
        }
    }

    /// Queues the pending interrupt with `KVM_INTERRUPT`.
    fn queue(&mut self) -> Result<()> {
        if let Some((vector, irq)) = self.vm.acknowledge() {
            self.vm.machine.vcpu.interrupt(vector)?;
            self.count(irq);
            self.monitor
                .on_inject(vector, irq, Injection::Queued, &mut self.vm.cpu_view());
        }
        Ok(())
    }

    /// Where stepping is about to start, an interrupt queued with
    /// `KVM_INTERRUPT` while it was off may still wait inside KVM (a kick,
    /// such as the `vtrace ctl start` that turns tracing on, cut the last
    /// `KVM_RUN` short). The CPU would deliver it with the tracer's TF in the
    /// frame it pushes and run the handler unstepped, so the VMM takes it
    /// back and delivers it through the IDT itself. True where the monitor
    /// was told.
    pub(super) fn reclaim_queued_interrupt(&mut self) -> Result<bool> {
        let Some(vector) = self.vm.machine.vcpu.take_queued_interrupt()? else {
            return Ok(false);
        };
        match self.vm.deliver_vector(vector)? {
            Some(handler) => self.monitor.on_inject(
                vector,
                // Counted by its IRQ line when it was queued.
                u8::MAX,
                Injection::Delivered { handler },
                &mut self.vm.cpu_view(),
            ),
            None => {
                self.vm.machine.vcpu.interrupt(vector)?;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Counts an interrupt by its ISA IRQ line (local APIC interrupts in
    /// `local_apic_interrupts`).
    pub(super) fn count(&mut self, irq: u8) {
        match self.irqs.get_mut(usize::from(irq)) {
            Some(n) => *n += 1,
            None => self.local_apic_interrupts += 1,
        }
    }

    /// Delivers an exception the monitor foresaw, through the guest's IDT,
    /// and tells the monitor. Where the VMM does not model the delivery
    /// (see `soft_int`), the instruction runs and the CPU delivers it.
    pub(super) fn deliver_exception(&mut self, e: Exception) -> Result<()> {
        if !self.vm.deliver_exception(e)? {
            return Ok(());
        }
        let view = match e.kind {
            ExceptionKind::Fault => ExitView::FaultDelivered {
                vector: e.vector,
                error_code: e.error_code,
            },
            ExceptionKind::SoftwareInterrupt => {
                // The instruction completed.
                self.vm.machine.clock.step();
                ExitView::CompletedByVmm {
                    vector: Some(e.vector),
                }
            }
        };
        self.tell(view);
        Ok(())
    }
}

impl Vm {
    /// The vector the CPU on stage would take now.
    pub(super) fn pending_vector(&self) -> Option<u8> {
        let cpu = self.machine.cpus.on_stage();
        self.machine.devices.pending_vector(cpu)
    }

    /// The CPU on stage takes its pending interrupt: vector and IRQ.
    pub(super) fn acknowledge(&mut self) -> Option<(u8, u8)> {
        let cpu = self.machine.cpus.on_stage();
        self.machine.devices.acknowledge(cpu)
    }

    /// Delivers the pending vector through the guest IDT in the VMM.
    /// Returns the handler address, or None where the VMM does not model
    /// the delivery (not 64-bit mode at CPL 0 or 3, a bad gate): the caller
    /// then queues the interrupt with KVM instead.
    fn deliver_through_idt(&mut self) -> Result<Option<u64>> {
        let Some(vector) = self.pending_vector() else {
            return Ok(None);
        };
        self.deliver_vector(vector)
    }

    /// Delivers `vector` through the guest IDT (see `deliver_through_idt`).
    fn deliver_vector(&mut self, vector: u8) -> Result<Option<u64>> {
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

    /// Delivers exception `e` through the guest's IDT; false where the
    /// VMM does not model the delivery (see `soft_int`).
    fn deliver_exception(&mut self, e: Exception) -> Result<bool> {
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
            return Ok(false);
        }
        self.machine.vcpu.set_sregs(&sregs)?;
        self.machine.vcpu.set_regs(&regs)?;
        Ok(true)
    }
}
