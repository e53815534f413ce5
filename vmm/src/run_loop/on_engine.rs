//! The on-stage CPU's steps on the engine (Bochs's CPU) while the monitor
//! steps it: one step a pass of the loop, served as stepping's exits are
//! served, so that the monitor sees what it sees of a host that exits
//! after every instruction and completes port I/O at its exit (this
//! host's kind): a debug exit after each step, `OUT` completed, `IN`, a
//! hypercall and MMIO told before the step they belong to, a fault
//! delivered before its handler runs, a software interrupt completed.
//!
//! The devices are the VMM's own, reached from the engine's callbacks
//! (`engine_host`) at the instruction's access, with the step clock where
//! stepping's exits have it: an `OUT`'s device sees the time after it,
//! an `IN`'s the time before it. Interrupts are delivered by the VMM
//! through the guest's IDT into the engine's state, at the passes where
//! stepping delivers them; where the VMM does not model the delivery,
//! the engine delivers the vector the VMM took (the INTR line and
//! `acknowledge`), as KVM delivers a queued one.

use vtrace_bochs::Stop;
use vtrace_guest::status;
use vtrace_x86::has_error_code;

use crate::cpu::soft_int;
use crate::engine::{BochsCpu, EngineMemory};
use crate::error::{Error, Result};
use crate::monitor::{Breakpoints, Directive, ExitView, Injection};
use crate::vm::Vm;
use crate::EngineKind;

use super::decide::{self, InjectionState};
use super::engine_host::{PortAccess, Seen, StepHost, BATCH};
use super::{GuestExit, Next, Run};

impl Run<'_> {
    /// One pass of the loop on the engine: the CPU moves to it first if
    /// KVM holds it, then steps.
    pub(super) fn step_on_engine(&mut self) -> Result<Next> {
        if !self.vm.on_engine() {
            self.hand_to_engine()?;
        }
        self.monitor.before_entry(&mut self.vm.cpu_view());
        let on_stage = self.vm.machine.cpus.on_stage();
        if self
            .vm
            .engine
            .as_mut()
            .is_some_and(|e| e.take_completion(on_stage))
        {
            // This pass is the owed exit of the CPU's last step, as
            // stepping's entry after an I/O exit completes it.
            return self.complete_step(false);
        }
        let Some(mut engine) = self.vm.engine.take() else {
            return Ok(Next::Continue);
        };
        let library = engine.library();
        let queued = engine.queued.take();
        let deadline = self.vm.machine.devices.next_deadline();
        let cpu = engine.selected();
        let BochsCpu {
            machine,
            core,
            refused_msrs,
            ..
        } = &mut engine;
        let mut host = StepHost {
            library,
            queued,
            run: self,
            core,
            seen: Seen::default(),
            deadline,
            served: 0,
            paused: false,
            refused_msrs,
        };
        let (stop, _) = machine.run(&mut host, cpu, BATCH);
        let (queued, mut seen, paused) = (host.queued, host.seen, host.paused);
        engine.queued = queued;
        engine.core.refresh(library, cpu);
        self.vm.engine = Some(engine);
        self.engine_paused = paused;
        // Sent once the engine is back: a STARTUP sets a CPU it holds.
        for ipi in std::mem::take(&mut seen.ipis) {
            if let Err(e) = self.send_ipi(ipi) {
                seen.failure.get_or_insert(e);
            }
        }
        self.serve_step(stop, seen)
    }

    /// The CPU moves from KVM to the engine. An interrupt KVM still holds
    /// queued is delivered through the IDT first, as where stepping
    /// starts.
    fn hand_to_engine(&mut self) -> Result<()> {
        self.reclaim_queued_interrupt()?;
        // KVM runs nothing of it meanwhile; nothing stays armed there.
        self.vm.set_debug(false, Breakpoints::default())?;
        let machine = &mut self.vm.machine;
        if let Some(engine) = self.vm.engine.as_mut() {
            for cpu in 0..machine.cpus.count() {
                if let Some(vcpu) = machine.vcpu_of(cpu) {
                    engine.take_over(cpu, vcpu)?;
                }
            }
            engine.took_over(machine.cpus.on_stage());
        }
        machine.clock.set_stepping(true);
        self.monitor.on_engine(EngineKind::Bochs);
        Ok(())
    }

    /// The CPUs move back from the engine to KVM, which runs them on as if
    /// they had never left.
    pub(super) fn hand_to_kvm(&mut self) -> Result<()> {
        let machine = &mut self.vm.machine;
        if let Some(engine) = self.vm.engine.as_mut() {
            for cpu in 0..machine.cpus.count() {
                if let Some(vcpu) = machine.vcpu_of(cpu) {
                    engine.give_back(cpu, vcpu)?;
                }
            }
            engine.gave_back();
        }
        // The clock follows the host again, unless stepping follows.
        machine.clock.set_stepping(false);
        self.monitor.on_engine(EngineKind::Step);
        Ok(())
    }

    /// Tells the monitor what the step did, as stepping's exits tell it.
    fn serve_step(&mut self, stop: Stop, seen: Seen) -> Result<Next> {
        if let Some(e) = seen.failure {
            return Err(e);
        }
        match stop {
            Stop::Panic => {
                return Err(Error::GuestFailure {
                    reason: format!(
                        "Bochs's CPU cannot go on: {}",
                        seen.panic.as_deref().unwrap_or("it did not say why")
                    ),
                    report: Box::new(self.vm.crash_report(None)),
                })
            }
            Stop::Shutdown => {
                self.vm.note("shutdown", 0);
                return Err(Error::GuestShutdown(Box::new(self.vm.crash_report(None))));
            }
            _ => {}
        }
        if let Some((vector, error)) = seen.exception {
            // The instruction did not run; the CPU stands at the handler.
            self.tell(ExitView::FaultDelivered {
                vector,
                error_code: has_error_code(vector).then_some(error),
            });
            return Ok(Next::Continue);
        }
        if seen.told {
            return match seen.halt {
                true => self.halt(),
                false => Ok(Next::Continue),
            };
        }
        if !seen.stepped {
            // Halted, with nothing to wake it yet.
            return self.halt();
        }
        let completes_later = !seen.mmio.is_empty()
            || matches!(
                seen.port,
                Some(PortAccess::In { .. } | PortAccess::Hypercall { .. })
            );
        for view in seen.mmio {
            let answer = self.tell(view);
            if answer.instructions > 0 {
                self.vm.machine.clock.steps(answer.instructions);
            }
        }
        match seen.port {
            Some(PortAccess::Out { port, size, value }) => {
                self.vm.note("io-out", u64::from(port));
                // Its step was counted when the device saw it.
                self.tell(ExitView::IoOut {
                    port,
                    size,
                    value,
                    completed: true,
                });
                return Ok(Next::Continue);
            }
            Some(PortAccess::In { port, size, value }) => {
                self.vm.note("io-in", u64::from(port));
                self.tell(ExitView::IoIn { port, size, value });
            }
            Some(PortAccess::Hypercall { call, result, log }) => {
                self.tell(ExitView::Hypercall { call, result });
                if let Some(text) = log {
                    self.monitor.guest_log(&text);
                }
            }
            Some(PortAccess::Exit { call, status }) => {
                self.tell(ExitView::Hypercall {
                    call,
                    result: status::OK,
                });
                self.tell(ExitView::Debug { breakpoint: false });
                return Ok(Next::Stop(GuestExit::Status(status)));
            }
            None => {}
        }
        if let Some(vector) = seen.software {
            self.vm.machine.clock.step();
            self.tell(ExitView::CompletedByVmm {
                vector: Some(vector),
            });
            return Ok(Next::Continue);
        }
        // Stepping's I/O exit comes before the instruction completes, and
        // on a machine of several CPUs a turn may end there: the step's
        // own exit is told when its CPU's turn comes again.
        if completes_later && self.vm.machine.cpus.count() > 1 {
            let cpu = self.vm.machine.cpus.on_stage();
            if let Some(engine) = self.vm.engine.as_mut() {
                engine.owe_completion(cpu);
            }
            return Ok(Next::Continue);
        }
        self.complete_step(matches!(stop, Stop::Halt))
    }

    /// Tells the monitor that the step ran (its debug exit), with the step
    /// clock and a HLT as stepping's exit has them.
    fn complete_step(&mut self, halted: bool) -> Result<Next> {
        let answer = self.tell(ExitView::Debug { breakpoint: false });
        if answer.instructions > 0 {
            self.vm.machine.clock.steps(answer.instructions);
        }
        if answer.directive == Directive::Halt || halted {
            return self.halt();
        }
        Ok(Next::Continue)
    }

    /// [`Run::inject`] while the engine holds the CPU: the same decision,
    /// the delivery into the engine's state.
    pub(super) fn inject_on_engine(&mut self) -> Result<()> {
        let Some(engine) = self.vm.engine.as_ref() else {
            return Ok(());
        };
        let state = engine.state();
        let window_open = state.rflags & vtrace_x86::rflags::IF != 0
            && state.interruptibility == 0
            && engine.queued.is_none();
        let on_stage = self.vm.machine.cpus.on_stage();
        let how = decide::injection(InjectionState {
            pending: self.vm.pending_vector().is_some(),
            stepping: true,
            io_pending: engine.owes_completion(on_stage),
            window_open,
            plan: self.monitor.plan_entry(),
        });
        match how {
            decide::Injection::ThroughIdt => {
                let Some(vector) = self.vm.pending_vector() else {
                    return Ok(());
                };
                match self.vm.deliver_on_engine(vector) {
                    Some(handler) => {
                        if let Some((vector, irq)) = self.vm.acknowledge() {
                            self.count(irq);
                            let how = Injection::Delivered { handler };
                            self.monitor
                                .on_inject(vector, irq, how, &mut self.vm.cpu_view());
                        }
                        Ok(())
                    }
                    None => self.queue_on_engine(),
                }
            }
            decide::Injection::Queue => self.queue_on_engine(),
            _ => Ok(()),
        }
    }

    /// The engine delivers the pending vector itself at its next step, as
    /// KVM delivers one queued with `KVM_INTERRUPT`.
    fn queue_on_engine(&mut self) -> Result<()> {
        let Some((vector, irq)) = self.vm.acknowledge() else {
            return Ok(());
        };
        if let Some(engine) = self.vm.engine.as_mut() {
            engine.queued = Some(vector);
            engine.set_interrupt_line(true);
        }
        self.count(irq);
        self.monitor
            .on_inject(vector, irq, Injection::Queued, &mut self.vm.cpu_view());
        Ok(())
    }
}

impl Vm {
    /// Delivers `vector` through the guest's IDT into the engine's state
    /// (see `soft_int`): the handler's address, or `None` where the VMM
    /// does not model the delivery.
    fn deliver_on_engine(&mut self, vector: u8) -> Option<u64> {
        let engine: &mut BochsCpu = self.engine.as_mut()?;
        let state = *engine.state();
        let (regs, sregs) = (*engine.regs(), *engine.sregs());
        let mut kregs: kvm_bindings::kvm_regs = (&regs).into();
        let mut ksregs = kvm_bindings::kvm_sregs::from(&sregs);
        let memory = EngineMemory::new(&self.machine.ram, sregs);
        let delivered = soft_int::deliver(&memory, &mut kregs, &mut ksregs, vector, regs.rip);
        for (gpa, len) in memory.written() {
            engine.invalidate(gpa, len);
        }
        delivered.ok()?;
        let regs = vtrace_x86::Registers::from(&kregs);
        let sregs = vtrace_x86::SpecialRegisters::from(&ksregs);
        let mut delivered = vtrace_bochs::state_of(&regs, &sregs, state);
        // An interrupt wakes a halted CPU and ends any shadow.
        delivered.activity = vtrace_bochs::Activity::Active as u32;
        delivered.interruptibility = 0;
        engine.set_core(delivered);
        Some(regs.rip)
    }

    /// Whether the on-stage CPU takes maskable interrupts (RFLAGS.IF), in
    /// whichever holds it.
    pub(super) fn interrupts_enabled(&mut self) -> bool {
        match self.engine.as_ref().filter(|e| e.holds()) {
            Some(engine) => engine.regs().rflags & vtrace_x86::rflags::IF != 0,
            None => self.machine.vcpu.run_page().if_flag != 0,
        }
    }
}
