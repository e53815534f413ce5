//! The second engine: Bochs's CPU (`vtrace-bochs`) runs the CPU on stage
//! while the monitor wants every instruction, on the guest's own RAM and
//! the VMM's own devices; KVM runs everything else.
//!
//! The CPU's state lives in one place at a time: in KVM, or, from a
//! hand-over ([`BochsCpu::take_over`]) to the hand-over back
//! ([`BochsCpu::give_back`]), in the engine ([`BochsCpu::holds`]). What
//! reads the CPU while the engine holds it (the monitor's view, interrupt
//! delivery, hypercalls) reads the engine's state: `view.rs` and
//! `memory.rs`. The run loop's side is `run_loop/on_engine.rs`.

mod handover;
mod memory;
mod view;

pub(crate) use memory::EngineMemory;
pub(crate) use view::EngineView;

use vtrace_bochs::{Library, Machine, State};
use vtrace_x86::{Registers, SpecialRegisters};

use crate::error::{Error, Result};
use crate::memory::{GuestRam, LowRam};
use crate::vcpu::Vcpu;

/// What runs the guest while it is traced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineKind {
    /// KVM single-steps it, an exit an instruction (the trap flag).
    #[default]
    Step,
    /// Bochs's CPU runs it in-process (`scripts/engine.sh` builds the
    /// library), handed over from KVM where tracing starts and back where
    /// it stops.
    Bochs,
}

impl EngineKind {
    /// The name `--engine` takes and a trace records.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Step => "step",
            EngineKind::Bochs => "bochs",
        }
    }
}

/// The engine's library, loaded once a process (its CPUs are the
/// process's).
fn library() -> Result<&'static Library> {
    static LIBRARY: std::sync::OnceLock<Library> = std::sync::OnceLock::new();
    if let Some(library) = LIBRARY.get() {
        return Ok(library);
    }
    let path = Library::find().map_err(|e| Error::Engine(e.to_string()))?;
    let library = Library::load(&path).map_err(|e| Error::Engine(e.to_string()))?;
    Ok(LIBRARY.get_or_init(|| library))
}

/// The engine CPU's core state (see [`vtrace_bochs::Library::read_core`])
/// as of the last step or write, and its registers in vtrace's view,
/// converted once a step; the rest of its state is read at hand-overs
/// only.
pub(crate) struct Core {
    pub(crate) state: State,
    pub(crate) regs: Registers,
    pub(crate) sregs: SpecialRegisters,
    /// The system part `sregs` was converted from: most steps change
    /// none of it, and then it is not converted again.
    converted: System,
}

/// The part of the core [`Core::sregs`] is made of.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct System {
    seg: [vtrace_bochs::Segment; 8],
    tables: [u64; 4],
    control: [u64; 6],
}

impl System {
    fn of(s: &State) -> System {
        System {
            seg: s.seg,
            tables: [
                s.gdt_base,
                s.idt_base,
                u64::from(s.gdt_limit),
                u64::from(s.idt_limit),
            ],
            control: [s.cr0, s.cr2, s.cr3, s.cr4, s.efer, s.msrs.apic_base],
        }
    }
}

impl Core {
    /// Reads the core of CPU 0 again (also from inside a host callback).
    #[inline]
    pub(crate) fn refresh(&mut self, library: &Library) {
        library.read_core(0, &mut self.state);
        self.convert();
    }

    fn convert(&mut self) {
        let system = System::of(&self.state);
        if system != self.converted {
            (self.regs, self.sregs) = vtrace_bochs::registers_of(&self.state);
            self.converted = system;
            return;
        }
        let g = &self.state.gpr;
        self.regs = Registers {
            rax: g[0],
            rcx: g[1],
            rdx: g[2],
            rbx: g[3],
            rsp: g[4],
            rbp: g[5],
            rsi: g[6],
            rdi: g[7],
            r8: g[8],
            r9: g[9],
            r10: g[10],
            r11: g[11],
            r12: g[12],
            r13: g[13],
            r14: g[14],
            r15: g[15],
            rip: self.state.rip,
            rflags: self.state.rflags,
        };
    }
}

/// Bochs's CPU over the guest's RAM, for the CPU on stage.
pub(crate) struct BochsCpu {
    library: &'static Library,
    pub(crate) machine: Machine<'static>,
    /// The CPU's state is the engine's (KVM's is stale) since the last
    /// hand-over.
    holds: bool,
    /// Boxed: the run loop moves the engine out of the VM and back at
    /// every batch of steps.
    pub(crate) core: Box<Core>,
    /// A vector the VMM took from its interrupt controllers for the
    /// engine to deliver at its next step (where the VMM does not model
    /// the delivery through the IDT).
    pub(crate) queued: Option<u8>,
}

impl std::fmt::Debug for BochsCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BochsCpu")
            .field("holds", &self.holds)
            .finish_non_exhaustive()
    }
}

impl BochsCpu {
    /// Loads the engine's library and makes its CPU over `ram`'s region
    /// at guest-physical 0 (what lies above it reaches the engine as
    /// MMIO, which `on_engine` serves from RAM where it is RAM).
    pub(crate) fn open(ram: &GuestRam, cpus: u8) -> Result<BochsCpu> {
        if cpus != 1 {
            return Err(Error::EngineCpus(cpus));
        }
        let library = library()?;
        let low = LowRam::of(ram)
            .ok_or_else(|| Error::Engine("guest RAM does not start at address 0".into()))?;
        // SAFETY: the region is mapped for as long as `ram` lives, and the
        // VM that owns `ram` owns this engine too, which it drops first
        // (its field comes before the machine's). Bochs writes the guest's
        // RAM as the vCPU does: only while the engine runs, on this thread.
        let bytes: &'static mut [u8] = unsafe { low.as_mut_slice() };
        let machine = Machine::new(library, bytes, 1).map_err(|e| Error::Engine(e.to_string()))?;
        let state = machine.state(0);
        let (regs, sregs) = vtrace_bochs::registers_of(&state);
        let converted = System::of(&state);
        Ok(BochsCpu {
            library,
            core: Box::new(Core {
                state,
                regs,
                sregs,
                converted,
            }),
            machine,
            holds: false,
            queued: None,
        })
    }

    /// Whether the engine holds the CPU's state now.
    pub(crate) fn holds(&self) -> bool {
        self.holds
    }

    /// The engine's state as of the last step: its core (see [`Core`]).
    pub(crate) fn state(&self) -> &State {
        &self.core.state
    }

    /// The general registers as of the last step.
    pub(crate) fn regs(&self) -> &Registers {
        &self.core.regs
    }

    /// The system registers as of the last step.
    pub(crate) fn sregs(&self) -> &SpecialRegisters {
        &self.core.sregs
    }

    /// The library, for what a host callback reads of the CPU mid-step.
    pub(crate) fn library(&self) -> &'static Library {
        self.library
    }

    /// Gives the engine the core of `state` (registers, segments, control
    /// registers, activity, shadow); the rest of its state stays.
    pub(crate) fn set_core(&mut self, state: State) {
        self.core.state = state;
        self.machine.set_core(0, &self.core.state);
        self.core.convert();
    }

    /// The VMM wrote guest RAM at `[gpa, gpa + len)`: the engine drops
    /// what it decoded from there.
    pub(crate) fn invalidate(&mut self, gpa: u64, len: u64) {
        self.machine.invalidate(gpa, len);
    }

    /// Raises or lowers the CPU's INTR line (an interrupt the engine
    /// delivers itself, where the VMM does not model the delivery).
    pub(crate) fn set_interrupt_line(&mut self, high: bool) {
        self.machine.set_interrupt_line(0, high);
    }

    /// The CPU's whole state moves from KVM to the engine.
    pub(crate) fn take_over(&mut self, vcpu: &mut Vcpu) -> Result<()> {
        self.core.state = handover::from_kvm(vcpu, self.machine.state(0))?;
        self.machine.set_state(0, &self.core.state);
        self.core.convert();
        // KVM ran the guest meanwhile: any code may have been written.
        self.machine.invalidate_all();
        self.holds = true;
        Ok(())
    }

    /// The CPU's whole state moves back to KVM.
    pub(crate) fn give_back(&mut self, vcpu: &mut Vcpu) -> Result<()> {
        self.core.state = self.machine.state(0);
        handover::to_kvm(&self.core.state, vcpu)?;
        self.holds = false;
        Ok(())
    }
}
