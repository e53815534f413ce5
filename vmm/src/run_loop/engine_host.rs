//! The engine's callbacks during one run (see `on_engine`): the devices,
//! the step clock and the monitor as a stepped exit would reach them, and
//! what a step did for the loop to serve.

use vtrace_bochs::{Activity, Event, Host, Wants};
use vtrace_guest::status;

use crate::clock::VirtualNanos;
use crate::devices::hypercall::Hypercall;
use crate::devices::lapic::Ipi;
use crate::engine::{Core, EngineMemory, EngineView, RefusedMsrs};
use crate::error::Error;
use crate::monitor::{Directive, ExitView};
use crate::signals;

use super::exit::{answer_hypercall, hypercall_of, le_u32, Answered};
use super::Run;

/// The port access a step made.
#[derive(Clone, Debug)]
pub(super) enum PortAccess {
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
pub(super) struct Seen {
    /// The step ran to its end (a faulting instruction does not).
    pub(super) stepped: bool,
    pub(super) port: Option<PortAccess>,
    /// MMIO accesses, as the monitor is told of them.
    pub(super) mmio: Vec<ExitView>,
    /// The exception delivered (vector, error code): the run ended at
    /// its handler.
    pub(super) exception: Option<(u8, u32)>,
    /// INT n, INT3, INTO or INT1 ran.
    pub(super) software: Option<u8>,
    /// What the CPU said where it could not go on.
    pub(super) panic: Option<String>,
    /// A failure of the VMM's inside a callback.
    pub(super) failure: Option<Error>,
    /// IPIs the step's stores sent, for the loop to deliver.
    pub(super) ipis: Vec<Ipi>,
    /// The step was told to the monitor already, inside the run (see
    /// [`StepHost::step`]); `halt` where its answer (or the CPU) halted.
    pub(super) told: bool,
    pub(super) halt: bool,
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
pub(super) const BATCH: u64 = 1024;

/// The host of one run of the engine: the run's devices, clock and
/// monitor. A plain step (no port, MMIO or event) is served here, as the
/// loop would serve it, and the run goes on while nothing the loop does
/// between passes is due; any other step ends the run, for the loop.
pub(super) struct StepHost<'r, 'a> {
    pub(super) run: &'r mut Run<'a>,
    pub(super) library: &'static vtrace_bochs::Library,
    pub(super) core: &'r mut Core,
    /// The vector the VMM took for the engine to deliver.
    pub(super) queued: Option<u8>,
    pub(super) seen: Seen,
    /// The devices' next deadline as of the run's start: the run ends at
    /// the step that reaches it (the lines move only then, or at an
    /// access, which ends the run too).
    pub(super) deadline: Option<VirtualNanos>,
    /// Steps served inside the run.
    pub(super) served: u64,
    /// The monitor held the guest at the last boundary served inside the
    /// run (the loop does not ask again).
    pub(super) paused: bool,
    /// MSRs Bochs refused the guest, told at the end.
    pub(super) refused_msrs: &'r mut RefusedMsrs,
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
            // Told once each, at the end of the window (see RefusedMsrs).
            2 if self.refused_msrs.note(text) => tracing::debug!("the engine: {text}"),
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
        let Run { vm, monitor, .. } = &mut *self.run;
        let machine = &mut vm.machine;
        let memory = EngineMemory::new(&machine.ram, sregs);
        let (result, log) =
            match answer_hypercall(&mut machine.hypercalls, &mut **monitor, call, &memory) {
                Answered::Reply { status, log } => (status, log),
                Answered::Exit(status) => {
                    self.seen.port = Some(PortAccess::Exit { call, status });
                    return status::OK as u32;
                }
            };
        self.seen.port = Some(PortAccess::Hypercall { call, result, log });
        result as u32
    }
}
