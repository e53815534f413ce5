//! The guest's CPUs, and whose turn it is.
//!
//! The run loop enters one vCPU at a time: the one on stage, which is
//! `Machine::vcpu` with its single-step state in `Vm::step`, so the loop's
//! every handler works on "the vCPU" as on a one-CPU machine. The others
//! wait here, parked with their own step state, and a turn swaps one in.
//! The loop takes the turns in a fixed order (`next_turn`), so a
//! single-stepped machine runs the same instructions in the same order
//! every time (two CPUs' steps that cannot see each other may run at
//! once, served in that order: see `run_loop::pair`); untraced, the turns
//! are time slices.
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

/// Whose turn comes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// This CPU's.
    Cpu(usize),
    /// No CPU can run: each waits for an interrupt (or for ever).
    AllIdle,
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

/// Whose turn follows `current`'s: the next CPU in number order (wrapping,
/// `current` last) that is running, or halted with an interrupt to take
/// (`wakes`). A fixed order, so a single-stepped machine interleaves its
/// CPUs the same way every run.
pub(crate) fn next_turn(power: &[Power], wakes: impl Fn(usize) -> bool, current: usize) -> Turn {
    let n = power.len();
    (1..=n)
        .map(|k| (current + k) % n)
        .find(|&cpu| match power[cpu] {
            Power::Running => true,
            Power::Halted => wakes(cpu),
            Power::WaitingForStartup | Power::Stopped => false,
        })
        .map_or(Turn::AllIdle, Turn::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Power::*;

    #[test]
    fn turns_go_round_in_cpu_order() {
        let power = [Running, Running, Running];
        assert_eq!(next_turn(&power, |c| [false; 3][c], 0), Turn::Cpu(1));
        assert_eq!(next_turn(&power, |c| [false; 3][c], 1), Turn::Cpu(2));
        assert_eq!(next_turn(&power, |c| [false; 3][c], 2), Turn::Cpu(0));
    }

    #[test]
    fn halted_cpus_are_passed_over_until_an_interrupt_wakes_them() {
        let power = [Running, Halted, WaitingForStartup, Halted];
        assert_eq!(next_turn(&power, |c| [false; 4][c], 0), Turn::Cpu(0));
        assert_eq!(
            next_turn(&power, |c| [false, false, true, true][c], 0),
            Turn::Cpu(3)
        );
        let asleep = [Halted, Stopped, WaitingForStartup];
        assert_eq!(next_turn(&asleep, |c| [false; 3][c], 0), Turn::AllIdle);
        // A stopped CPU stays stopped whatever is pending for it.
        assert_eq!(
            next_turn(&asleep, |c| [false, true, true][c], 0),
            Turn::AllIdle
        );
        assert_eq!(
            next_turn(&asleep, |c| [true, true, true][c], 2),
            Turn::Cpu(0)
        );
    }

    #[test]
    fn one_cpu_always_takes_its_own_turn() {
        assert_eq!(next_turn(&[Running], |c| [false][c], 0), Turn::Cpu(0));
        assert_eq!(next_turn(&[Halted], |c| [false][c], 0), Turn::AllIdle);
    }
}
