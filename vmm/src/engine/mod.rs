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
    /// Reads the core of CPU `cpu` again (also from inside a host
    /// callback).
    #[inline]
    pub(crate) fn refresh(&mut self, library: &Library, cpu: u32) {
        library.read_core(cpu, &mut self.state);
        self.convert();
    }

    fn convert(&mut self) {
        let system = System::of(&self.state);
        if system != self.converted {
            (self.regs, self.sregs) = vtrace_bochs::registers_of(&self.state);
            self.converted = system;
            return;
        }
        self.regs = vtrace_bochs::general_registers_of(&self.state);
    }
}

/// Bochs's CPU over the guest's RAM, for the CPU on stage.
pub(crate) struct BochsCpu {
    library: &'static Library,
    pub(crate) machine: Machine<'static>,
    /// The CPUs' states are the engine's (KVM's are stale) since the last
    /// hand-over.
    holds: bool,
    /// The CPU on stage, whose core `core` holds.
    selected: u32,
    /// By CPU: its last step was an I/O access whose completion (the debug
    /// exit stepping gives on the next entry) is still to be told.
    owed: Vec<bool>,
    /// The core of the CPU on stage. Boxed: the run loop moves the engine
    /// out of the VM and back at every batch of steps.
    pub(crate) core: Box<Core>,
    /// A vector the VMM took from its interrupt controllers for the
    /// engine to deliver at its next step (where the VMM does not model
    /// the delivery through the IDT).
    pub(crate) queued: Option<u8>,
    /// The MSRs the guest read or wrote that Bochs does not model (it
    /// raised #GP), each told to the user once.
    pub(crate) refused_msrs: RefusedMsrs,
}

/// MSRs Bochs's CPU refused the guest (see [`RefusedMsrs::note`]).
#[derive(Debug, Default)]
pub(crate) struct RefusedMsrs {
    seen: std::collections::BTreeSet<(u32, &'static str)>,
    /// Those of `seen` the user was not told of yet, in the order met.
    untold: Vec<(u32, &'static str)>,
}

impl RefusedMsrs {
    /// Notes the MSR of one of Bochs's messages if it is one of an
    /// unmodelled MSR ("RDMSR: Unknown register 0x8b"): whether it was.
    pub(crate) fn note(&mut self, text: &str) -> bool {
        match refused_msr(text) {
            Some(msr) => {
                if self.seen.insert(msr) {
                    self.untold.push(msr);
                }
                true
            }
            None => false,
        }
    }

    /// Tells the user of the MSRs refused since the last time, once each:
    /// where KVM would have answered them, the engine's trace parts from
    /// stepping's.
    pub(crate) fn tell(&mut self) {
        if self.untold.is_empty() {
            return;
        }
        let list: Vec<String> = self
            .untold
            .drain(..)
            .map(|(msr, access)| format!("{access} {msr:#x}"))
            .collect();
        crate::user_message(&format!(
            "vtrace: note: the engine does not model {} MSR access{} ({}): the guest got #GP \
             there (an exception event in the trace); KVM may answer such an MSR, so a stepped \
             trace can differ from that step on",
            list.len(),
            if list.len() == 1 { "" } else { "es" },
            list.join(", ")
        ));
    }
}

/// The MSR and the access of Bochs's message for an MSR it does not model.
fn refused_msr(text: &str) -> Option<(u32, &'static str)> {
    let (access, rest) = if let Some(rest) = text.strip_prefix("RDMSR: Unknown register ") {
        ("RDMSR", rest)
    } else {
        ("WRMSR", text.strip_prefix("WRMSR: Unknown register ")?)
    };
    let hex = rest.trim().trim_start_matches("0x");
    Some((u32::from_str_radix(hex, 16).ok()?, access))
}

impl std::fmt::Debug for BochsCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BochsCpu")
            .field("holds", &self.holds)
            .finish_non_exhaustive()
    }
}

impl BochsCpu {
    /// Loads the engine's library and makes its `cpus` CPUs over `ram`'s
    /// region at guest-physical 0 (what lies above it reaches the engine
    /// as MMIO, which `on_engine` serves from RAM where it is RAM).
    pub(crate) fn open(ram: &GuestRam, cpus: u8) -> Result<BochsCpu> {
        let library = library()?;
        let low = LowRam::of(ram)
            .ok_or_else(|| Error::Engine("guest RAM does not start at address 0".into()))?;
        // SAFETY: the region is mapped for as long as `ram` lives, and the
        // VM that owns `ram` owns this engine too, which it drops first
        // (its field comes before the machine's). Bochs writes the guest's
        // RAM as the vCPU does: only while the engine runs, on this thread.
        let bytes: &'static mut [u8] = unsafe { low.as_mut_slice() };
        let machine = Machine::new(library, bytes, u32::from(cpus)).map_err(|e| match e {
            vtrace_bochs::MachineError::Cpus(_) => Error::EngineCpus(cpus),
            e => Error::Engine(e.to_string()),
        })?;
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
            selected: 0,
            owed: vec![false; usize::from(cpus)],
            queued: None,
            refused_msrs: RefusedMsrs::default(),
        })
    }

    /// Whether the engine holds the CPUs' states now.
    pub(crate) fn holds(&self) -> bool {
        self.holds
    }

    /// The CPU on stage, the engine's number of it.
    pub(crate) fn selected(&self) -> u32 {
        self.selected
    }

    /// CPU `cpu`'s last step completes on its next pass (see `owed`).
    pub(crate) fn owe_completion(&mut self, cpu: usize) {
        if let Some(owed) = self.owed.get_mut(cpu) {
            *owed = true;
        }
    }

    /// Whether CPU `cpu`'s last step is still to complete.
    pub(crate) fn owes_completion(&self, cpu: usize) -> bool {
        self.owed.get(cpu).copied().unwrap_or(false)
    }

    /// Whether CPU `cpu`'s last step was still to complete (it is now).
    pub(crate) fn take_completion(&mut self, cpu: usize) -> bool {
        self.owed.get_mut(cpu).is_some_and(std::mem::take)
    }

    /// CPU `cpu` goes on stage: its core is read.
    pub(crate) fn select(&mut self, cpu: usize) {
        self.selected = u32::try_from(cpu).unwrap_or(u32::MAX);
        self.core.refresh(self.library, self.selected);
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
        self.machine.set_core(self.selected, &self.core.state);
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
        self.machine.set_interrupt_line(self.selected, high);
    }

    /// CPU `cpu`'s whole state moves from KVM (`vcpu`) to the engine; the
    /// hand-over is done when [`BochsCpu::took_over`] is told.
    pub(crate) fn take_over(&mut self, cpu: usize, vcpu: &mut Vcpu) -> Result<()> {
        let n = u32::try_from(cpu).unwrap_or(u32::MAX);
        let state = handover::from_kvm(vcpu, self.machine.state(n))?;
        self.machine.set_state(n, &state);
        Ok(())
    }

    /// Every CPU was taken over; `on_stage` is the one the loop runs.
    pub(crate) fn took_over(&mut self, on_stage: usize) {
        // KVM ran the guest meanwhile: any code may have been written.
        self.machine.invalidate_all();
        self.holds = true;
        self.select(on_stage);
    }

    /// CPU `cpu`'s whole state moves back to KVM (`vcpu`); the hand-over
    /// is done when [`BochsCpu::gave_back`] is told.
    pub(crate) fn give_back(&mut self, cpu: usize, vcpu: &mut Vcpu) -> Result<()> {
        let state = self.machine.state(u32::try_from(cpu).unwrap_or(u32::MAX));
        handover::to_kvm(&state, vcpu)
    }

    /// Every CPU went back to KVM.
    pub(crate) fn gave_back(&mut self) {
        self.holds = false;
        self.refused_msrs.tell();
        // KVM has each CPU past its last instruction: nothing is owed.
        self.owed.fill(false);
    }
}

#[cfg(test)]
mod tests {
    use super::refused_msr;

    #[test]
    fn bochs_messages_of_unmodelled_msrs_name_them() {
        assert_eq!(
            refused_msr("RDMSR: Unknown register 0x8b"),
            Some((0x8b, "RDMSR"))
        );
        assert_eq!(
            refused_msr("WRMSR: Unknown register 0xc0010015"),
            Some((0xc001_0015, "WRMSR"))
        );
        assert_eq!(refused_msr("RDMSR: Unknown register zz"), None);
        assert_eq!(refused_msr("prefetch: EIP > CS.limit"), None);
    }
}
