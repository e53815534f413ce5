//! The on-stage CPU's steps on the engine (Bochs's CPU) while the monitor
//! steps it: one step a pass of the loop, served as stepping's exits are
//! served, so that the monitor sees what it sees of a host that exits
//! after every instruction and completes port I/O at its exit (this
//! host's kind): a debug exit after each step, `OUT` completed, `IN`, a
//! hypercall and MMIO told before the step they belong to, a fault
//! delivered before its handler runs, a software interrupt completed.
//!
//! The devices are the VMM's own, reached from the engine's callbacks
//! ([`StepHost`]) at the instruction's access, with the step clock where
//! stepping's exits have it: an `OUT`'s device sees the time after it,
//! an `IN`'s the time before it. Interrupts are delivered by the VMM
//! through the guest's IDT into the engine's state, at the passes where
//! stepping delivers them; where the VMM does not model the delivery,
//! the engine delivers the vector the VMM took (the INTR line and
//! `acknowledge`), as KVM delivers a queued one.

use vtrace_bochs::{Activity, Event, Host, Stop, Wants};
use vtrace_guest::status;
use vtrace_x86::has_error_code;

use crate::clock::VirtualNanos;
use crate::console;
use crate::cpu::soft_int;
use crate::devices::hypercall::{Hypercall, HypercallOutcome};
use crate::devices::lapic::Ipi;
use crate::engine::{BochsCpu, Core, EngineMemory, EngineView};
use crate::error::{Error, Result};
use crate::monitor::{Breakpoints, Directive, ExitView, Injection};
use crate::signals;
use crate::vm::Vm;
use crate::EngineKind;

use super::decide::{self, InjectionState};
use super::exit::{hypercall_of, le_u32};
use super::{GuestExit, Next, Run};

/// The port access a step made.
#[derive(Clone, Debug)]
enum PortAccess {
    In {
        port: u16,
        size: u8,
        value: u32,
    },
    Out {
        port: u16,
        size: u8,
        value: u32,
    },
    Hypercall {
        call: Hypercall,
        result: i32,
        log: Option<String>,
    },
    /// The EXIT hypercall, with the status the guest asked for.
    Exit {
        call: Hypercall,
        status: u8,
    },
}

/// What one step did, as the engine's callbacks saw it.
#[derive(Debug, Default)]
struct Seen {
    /// The step ran to its end (a faulting instruction does not).
    stepped: bool,
    port: Option<PortAccess>,
    /// MMIO accesses, as the monitor is told of them.
    mmio: Vec<ExitView>,
    /// The exception delivered (vector, error code): the run ended at
    /// its handler.
    exception: Option<(u8, u32)>,
    /// INT n, INT3, INTO or INT1 ran.
    software: Option<u8>,
    /// What the CPU said where it could not go on.
    panic: Option<String>,
    /// A failure of the VMM's inside a callback.
    failure: Option<Error>,
    /// IPIs the step's stores sent, for the loop to deliver.
    ipis: Vec<Ipi>,
    /// The step was told to the monitor already, inside the run (see
    /// [`StepHost::step`]); `halt` where its answer (or the CPU) halted.
    told: bool,
    halt: bool,
}

impl Seen {
    /// Whether the loop serves the step (it did more than run).
    fn served_by_loop(&self) -> bool {
        self.port.is_some()
            || !self.mmio.is_empty()
            || !self.ipis.is_empty()
            || self.software.is_some()
            || self.panic.is_some()
            || self.failure.is_some()
    }
}

/// Steps a run on the engine goes on for at most before the loop looks at
/// what stands outside the CPU (console input, `vtrace ctl`, the progress
/// line, stop signals are looked at every step): a fraction of a
/// millisecond.
const BATCH: u64 = 1024;

/// The host of one run of the engine: the run's devices, clock and
/// monitor. A plain step (no port, MMIO or event) is served here, as the
/// loop would serve it, and the run goes on while nothing the loop does
/// between passes is due; any other step ends the run, for the loop.
struct StepHost<'r, 'a> {
    run: &'r mut Run<'a>,
    library: &'static vtrace_bochs::Library,
    core: &'r mut Core,
    /// The vector the VMM took for the engine to deliver.
    queued: Option<u8>,
    seen: Seen,
    /// The devices' next deadline as of the run's start: the run ends at
    /// the step that reaches it (the lines move only then, or at an
    /// access, which ends the run too).
    deadline: Option<VirtualNanos>,
    /// Steps served inside the run.
    served: u64,
    /// The monitor held the guest at the last boundary served inside the
    /// run (the loop does not ask again).
    paused: bool,
}

impl Host for StepHost<'_, '_> {
    fn port_in(&mut self, cpu: u32, port: u16, len: u32) -> u32 {
        if port == vtrace_guest::PORT && len == 4 {
            return self.hypercall(cpu);
        }
        let machine = &mut self.run.vm.machine;
        let mut data = [0u8; 4];
        let data = &mut data[..(len as usize).min(4)];
        machine.devices.pio_read(port, data, machine.clock.now());
        let value = le_u32(data);
        self.seen.port = Some(PortAccess::In {
            port,
            size: data.len() as u8,
            value,
        });
        value
    }

    fn port_out(&mut self, _cpu: u32, port: u16, len: u32, value: u32) {
        let machine = &mut self.run.vm.machine;
        // The device sees the time after the OUT, as at its exit.
        machine.clock.step();
        let bytes = value.to_le_bytes();
        let data = &bytes[..(len as usize).min(4)];
        machine.devices.pio_write(port, data, machine.clock.now());
        self.seen.port = Some(PortAccess::Out {
            port,
            size: data.len() as u8,
            value,
        });
    }

    fn mmio_read(&mut self, _cpu: u32, gpa: u64, len: u32) -> u64 {
        use vm_memory::{Bytes, GuestAddress};
        let size = len.clamp(1, 8) as u8;
        let machine = &mut self.run.vm.machine;
        // RAM above the engine's region (past the 3 GiB hole) is RAM.
        let mut bytes = [0u8; 8];
        if machine
            .ram
            .read_slice(&mut bytes[..usize::from(size)], GuestAddress(gpa))
            .is_ok()
        {
            return u64::from_le_bytes(bytes);
        }
        let cpu = machine.cpus.on_stage();
        let value = match machine.devices.mmio_read(cpu, gpa, machine.clock.now()) {
            Some(v) => u64::from(v),
            None => u64::MAX >> (64 - 8 * u32::from(size)),
        };
        self.seen.mmio.push(ExitView::Mmio {
            addr: gpa,
            size,
            write: false,
            value,
        });
        value
    }

    fn mmio_write(&mut self, _cpu: u32, gpa: u64, len: u32, value: u64) {
        use vm_memory::{Bytes, GuestAddress};
        let size = len.clamp(1, 8) as u8;
        let machine = &mut self.run.vm.machine;
        let bytes = value.to_le_bytes();
        if machine
            .ram
            .write_slice(&bytes[..usize::from(size)], GuestAddress(gpa))
            .is_ok()
        {
            return;
        }
        self.seen.mmio.push(ExitView::Mmio {
            addr: gpa,
            size,
            write: true,
            value,
        });
        let cpu = machine.cpus.on_stage();
        if let Some(ipi) = machine
            .devices
            .mmio_write(cpu, gpa, value, machine.clock.now())
        {
            self.seen.ipis.push(ipi);
        }
    }

    fn step(&mut self, cpu: u32) -> Wants {
        self.seen.stepped = true;
        let interrupt = self.queued.is_some();
        let end = Wants {
            end_run: true,
            interrupt,
        };
        // A REP iteration's state is the loop's to read (see
        // `Library::in_repeat`).
        if self.seen.served_by_loop() || self.library.in_repeat(cpu) {
            return end;
        }
        match self.serve_plain_step(cpu) {
            true => Wants {
                end_run: false,
                interrupt,
            },
            false => end,
        }
    }

    fn acknowledge(&mut self, _cpu: u32) -> u8 {
        // The VMM took the vector from its interrupt controllers already.
        self.queued.take().unwrap_or(0xff)
    }

    fn cpuid(&mut self, cpu: u32, leaf: u32, subleaf: u32) -> Option<[u32; 4]> {
        let state = self.library.state(cpu);
        let seen = [
            state.gpr[0] as u32,
            state.gpr[3] as u32,
            state.gpr[1] as u32,
            state.gpr[2] as u32,
        ];
        let machine = &self.run.vm.machine;
        let apic_id = u8::try_from(machine.cpus.on_stage()).unwrap_or(u8::MAX);
        Some(machine.cpuid.as_given_on(apic_id, leaf, subleaf, seen))
    }

    fn event(&mut self, _cpu: u32, event: Event) -> Wants {
        match event {
            Event::Exception { vector, error } => {
                self.seen.exception = Some((vector, error));
                return Wants {
                    end_run: true,
                    interrupt: false,
                };
            }
            Event::Software(vector) => self.seen.software = Some(vector),
            Event::External(_) => {}
        }
        Wants::default()
    }

    fn log(&mut self, level: i32, text: &str) {
        match level {
            3 => self.seen.panic = Some(text.to_string()),
            2 => tracing::warn!("the engine: {text}"),
            _ => tracing::debug!("the engine: {text}"),
        }
    }
}

impl StepHost<'_, '_> {
    /// Tells the monitor of a plain step as the loop tells it (a debug
    /// exit, the step clock by its answer), then does what the loop does
    /// before the next step where nothing stands in the way: whether the
    /// run goes on.
    fn serve_plain_step(&mut self, cpu: u32) -> bool {
        self.core.refresh(self.library, cpu);
        let Run { vm, monitor, .. } = &mut *self.run;
        let machine = &mut vm.machine;
        let mut view = EngineView {
            core: &mut *self.core,
            machine: None,
            library: self.library,
            low: machine.low_ram,
            ram: &machine.ram,
            wrote: false,
        };
        let answer = monitor.on_exit(&ExitView::Debug { breakpoint: false }, &mut view);
        if answer.instructions > 0 {
            machine.clock.steps(answer.instructions);
        }
        self.seen.told = true;
        self.served += 1;
        let halted = view.core.state.activity != Activity::Active as u32;
        if answer.directive == Directive::Halt || halted {
            self.seen.halt = true;
            return false;
        }
        let on_stage = machine.cpus.on_stage();
        let due = self.deadline.is_some_and(|d| machine.clock.now() >= d);
        // Several CPUs take turns a step or so long: the loop hands them on.
        if view.wrote
            || due
            || self.served >= BATCH
            || machine.cpus.count() > 1
            || machine.devices.pending_vector(on_stage).is_some()
            || signals::caught().is_some()
        {
            return false;
        }
        // The loop's pass before the next step: the monitor may hold the
        // guest, plan otherwise, and note the instruction about to run.
        let held = monitor.pause(&mut view);
        if !held.is_zero() {
            machine.clock.leave_out(held);
            self.paused = true;
            return false;
        }
        let plan = monitor.plan_entry();
        if !plan.stepping || plan.done {
            return false;
        }
        monitor.before_entry(&mut view);
        // The next step is a new one (nothing else of it was set: the loop
        // serves a step that does more than run).
        (self.seen.stepped, self.seen.told) = (false, false);
        !view.wrote
    }

    /// An `IN` on the hypercall port: the port serves what is the VMM's,
    /// the monitor the rest; the guest gets the status at once.
    fn hypercall(&mut self, cpu: u32) -> u32 {
        let state = self.library.state(cpu);
        let (regs, sregs) = vtrace_bochs::registers_of(&state);
        let rip = self.library.instruction_start(cpu);
        let call = hypercall_of(&regs, sregs.cs.l == 1, rip);
        let machine = &mut self.run.vm.machine;
        let memory = EngineMemory::new(&machine.ram, sregs);
        let outcome = machine
            .hypercalls
            .handle(call, &memory, &mut console::user_message);
        let (result, log) = match outcome {
            HypercallOutcome::Reply { status, log } => (status, log),
            HypercallOutcome::ForMonitor => {
                let answer = self.run.monitor.hypercall(&call);
                let status = self.run.vm.machine.hypercalls.unanswered(
                    call,
                    answer,
                    &mut console::user_message,
                );
                (status, None)
            }
            HypercallOutcome::Exit(status) => {
                self.seen.port = Some(PortAccess::Exit { call, status });
                return status::OK as u32;
            }
        };
        self.seen.port = Some(PortAccess::Hypercall { call, result, log });
        result as u32
    }
}

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
        let BochsCpu { machine, core, .. } = &mut engine;
        let mut host = StepHost {
            library,
            queued,
            run: self,
            core,
            seen: Seen::default(),
            deadline,
            served: 0,
            paused: false,
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
            let on_stage = machine.cpus.on_stage();
            for cpu in 0..machine.cpus.count() {
                match cpu == on_stage {
                    true => engine.take_over(cpu, &mut machine.vcpu)?,
                    false => match machine.cpus.parked_vcpu(cpu) {
                        Some(vcpu) => engine.take_over(cpu, vcpu)?,
                        None => continue,
                    },
                }
            }
            engine.took_over(on_stage);
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
            let on_stage = machine.cpus.on_stage();
            for cpu in 0..machine.cpus.count() {
                match cpu == on_stage {
                    true => engine.give_back(cpu, &mut machine.vcpu)?,
                    false => match machine.cpus.parked_vcpu(cpu) {
                        Some(vcpu) => engine.give_back(cpu, vcpu)?,
                        None => continue,
                    },
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
