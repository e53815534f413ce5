//! The guest's CPUs: the one on stage and the parked others.
//!
//! The run loop enters one vCPU at a time: the one on stage, which is
//! `Machine::vcpu` with its single-step state in `Vm::step`, so the loop's
//! every handler works on "the vCPU" as on a one-CPU machine. The others
//! wait here, parked with their own step state, and a turn swaps one in.
//! Whose turn it is, and when a turn ends, is decided in one room,
//! `run_loop::turns`.
//!
//! What stays per CPU besides: its power state here, its local APIC in
//! `Devices::lapics`.

use crate::vcpu::Vcpu;

/// Single-stepping as KVM has it for one vCPU, and the exit in flight.
#[derive(Debug, Default)]
pub(crate) struct StepState {
    /// KVM single-steps the vCPU.
    pub(crate) stepping: bool,
    /// The hardware breakpoints KVM has.
    pub(crate) breakpoints: crate::monitor::Breakpoints,
    /// An I/O or MMIO read completes on the next entry.
    pub(crate) io_pending: bool,
    /// That is an MMIO read: KVM's emulator completes it, and writes
    /// RFLAGS back without the trap flag where RIP moved from where
    /// stepping was armed (AMD-V), so stepping is armed again after it.
    pub(crate) mmio_read_pending: bool,
    /// The step of an OUT that completes on the next entry was counted at
    /// its I/O exit.
    pub(crate) out_counted: bool,
}

/// Where a CPU stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Power {
    /// It runs when its turn comes.
    Running,
    /// It executed HLT and waits for an interrupt.
    Halted,
    /// An application processor after power-on or INIT: it waits for a
    /// STARTUP IPI (SDM vol. 3A, 9.4, "wait-for-SIPI").
    WaitingForStartup,
    /// It halted with interrupts disabled: nothing but INIT wakes it.
    Stopped,
}

/// A vCPU off stage, with what the loop keeps of it.
struct Parked {
    vcpu: Vcpu,
    step: StepState,
}

/// Every CPU but the one on stage, and each one's power state.
pub(crate) struct Cpus {
    on_stage: usize,
    /// By CPU number; `None` for the one on stage.
    parked: Vec<Option<Parked>>,
    power: Vec<Power>,
}

impl Cpus {
    /// CPU 0 (the bootstrap processor) on stage and running; `others`
    /// become CPUs 1, 2, ..., waiting for a STARTUP IPI.
    pub(crate) fn new(others: Vec<Vcpu>) -> Cpus {
        let mut parked = vec![None];
        let mut power = vec![Power::Running];
        for vcpu in others {
            parked.push(Some(Parked {
                vcpu,
                step: StepState::default(),
            }));
            power.push(Power::WaitingForStartup);
        }
        Cpus {
            on_stage: 0,
            parked,
            power,
        }
    }

    /// How many CPUs the machine has.
    pub(crate) fn count(&self) -> usize {
        self.power.len()
    }

    /// The CPU the loop enters.
    pub(crate) fn on_stage(&self) -> usize {
        self.on_stage
    }

    pub(crate) fn power(&self) -> &[Power] {
        &self.power
    }

    pub(crate) fn set_power(&mut self, cpu: usize, power: Power) {
        if let Some(p) = self.power.get_mut(cpu) {
            *p = power;
        }
    }

    /// A CPU off stage, to set up (a STARTUP IPI).
    pub(crate) fn parked_vcpu(&mut self, cpu: usize) -> Option<&mut Vcpu> {
        self.parked.get_mut(cpu)?.as_mut().map(|p| &mut p.vcpu)
    }

    /// A CPU off stage: its vCPU and where its stepping stands.
    pub(crate) fn parked(&mut self, cpu: usize) -> Option<(&mut Vcpu, &StepState)> {
        self.parked
            .get_mut(cpu)?
            .as_mut()
            .map(|p| (&mut p.vcpu, &p.step))
    }

    /// Puts CPU `cpu` on stage: its vCPU and step state trade places with
    /// `vcpu` and `step`, the ones on stage. False (nothing moved) where
    /// `cpu` is on stage already or does not exist.
    pub(crate) fn bring_on(&mut self, cpu: usize, vcpu: &mut Vcpu, step: &mut StepState) -> bool {
        let Some(mut parked) = self.parked.get_mut(cpu).and_then(Option::take) else {
            return false;
        };
        std::mem::swap(&mut parked.vcpu, vcpu);
        std::mem::swap(&mut parked.step, step);
        // `parked` now holds the CPU that left the stage.
        self.parked[self.on_stage] = Some(parked);
        self.on_stage = cpu;
        true
    }
}
