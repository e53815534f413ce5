//! The order of turns on a machine of several CPUs, in one room: whether
//! the CPUs take turns at all, who runs next, when a turn ends, and what a
//! tracer may say about it. The rules are the pure functions here; the
//! loop's methods at the end of the file only gather what they decide
//! from.
//!
//! - **Turns or a race.** Untraced, with no breakpoint to arm and no
//!   peeper, the CPUs run at once on threads of their own ([`may_race`];
//!   `parallel` runs them). Otherwise the loop's thread enters one CPU at
//!   a time, the one on stage (`crate::cpus` parks the others).
//! - **Who runs next** ([`next_turn`]): the next CPU in number order that
//!   is running, or halted with an interrupt to take. A fixed order, so a
//!   single-stepped machine interleaves its CPUs the same way every run.
//! - **When a turn ends** ([`turn_ends`]), asked after every exit: where
//!   the CPU on stage cannot run on (it halted, or waits for a STARTUP
//!   IPI), or where the monitor lets it hand the turn on
//!   ([`Monitor::turn_may_end`](crate::Monitor::turn_may_end)).
//! - **What a tracer says** ([`TurnSoFar::may_end`]): a traced turn ends
//!   after a step, never between a REP's iterations nor after an
//!   instruction some host runs on from without a trap, so that turns end
//!   at the same instructions on every host.
//! - **Untraced turns are time slices** ([`time_slice`]): exits are rare
//!   then, so the kicker cuts a CPU's `KVM_RUN` short after 1 ms of host
//!   time for the next one's turn.
//! - **Around them**: while stepped, the CPU whose turn follows may step
//!   beside the one on stage (`pair`, which asks [`next_turn`] who that
//!   is); where no CPU may run, the loop idles (`halt`) until one may.

use std::time::Duration;

use crate::cpus::Power;
use crate::monitor::EntryPlan;

use super::Run;

/// Host time a CPU runs untraced before the next one's turn, where the
/// CPUs take turns.
const TIME_SLICE: Duration = Duration::from_millis(1);

/// Whose turn comes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// This CPU's.
    Cpu(usize),
    /// No CPU can run: each waits for an interrupt (or for ever).
    AllIdle,
}

/// Whether a machine of `cpus` CPUs may run them in parallel under
/// `plan`: untraced, with no breakpoint to arm (a breakpoint's exit must
/// come on the loop's thread, where its trigger may start the trace) and
/// no peeper (its samples with the pc read the vCPU on stage, which may
/// be running).
pub(super) fn may_race(cpus: usize, plan: &EntryPlan, peeping: bool) -> bool {
    cpus > 1 && !plan.stepping && plan.breakpoints.as_slice().is_empty() && !plan.done && !peeping
}

/// Whose turn follows `current`'s: the next CPU in number order (wrapping,
/// `current` last) that is running, or halted with an interrupt to take
/// (`wakes`).
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

/// Whether the turn of the CPU on stage, standing at `power`, ends after
/// the exit just served, where the monitor says `monitor_lets` of it: a
/// CPU that cannot run on hands its turn on whatever the monitor says.
pub(crate) fn turn_ends(power: Power, monitor_lets: bool) -> bool {
    power != Power::Running || monitor_lets
}

/// The host time after which a CPU entered untraced on a machine of
/// `cpus` CPUs hands its turn on; none on a machine of one.
pub(super) fn time_slice(cpus: usize) -> Option<Duration> {
    (cpus > 1).then_some(TIME_SLICE)
}

/// What a tracer knows of the turn of the CPU it follows, for
/// [`Monitor::turn_may_end`](crate::Monitor::turn_may_end).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TurnSoFar {
    /// Steps recorded since the turn began.
    pub steps: u64,
    /// The last exit stopped a REP string instruction between two of its
    /// iterations.
    pub mid_rep: bool,
    /// The last step was of an instruction some host runs on from to the
    /// next without a trap (an MMIO store, PAUSE, one whose interrupt
    /// shadow holds the trap, one that may set IF).
    pub held: bool,
}

impl TurnSoFar {
    /// Whether the turn may end here: after a step of this turn, not
    /// between a REP's iterations, not after an instruction some host runs
    /// on from. Each host folds different instructions into one exit; a
    /// turn that ends only where none does ends at the same instruction on
    /// every host, and the CPUs interleave the same way.
    pub fn may_end(&self) -> bool {
        self.steps > 0 && !self.mid_rep && !self.held
    }
}

impl Run<'_> {
    /// After an exit: where the on-stage CPU's turn ends, the next CPU in
    /// turn goes on stage.
    pub(super) fn hand_on_if_turn_ends(&mut self) {
        let cpus = &self.vm.machine.cpus;
        if cpus.count() > 1 && turn_ends(cpus.power()[cpus.on_stage()], self.monitor.turn_may_end())
        {
            self.next_turn();
        }
    }

    /// Who follows the CPU on stage, by [`next_turn`].
    pub(super) fn whose_turn_follows(&self) -> Turn {
        let machine = &self.vm.machine;
        let devices = &machine.devices;
        next_turn(
            machine.cpus.power(),
            |cpu| devices.pending_vector(cpu).is_some(),
            machine.cpus.on_stage(),
        )
    }

    /// The next CPU in turn goes on stage (a halted one only where an
    /// interrupt waits for it, and it runs again).
    pub(super) fn next_turn(&mut self) {
        let Turn::Cpu(cpu) = self.whose_turn_follows() else {
            return;
        };
        let machine = &mut self.vm.machine;
        if machine.cpus.power()[cpu] == Power::Halted {
            machine.cpus.set_power(cpu, Power::Running);
        }
        if machine
            .cpus
            .bring_on(cpu, &mut machine.vcpu, &mut self.vm.step)
        {
            let immediate_exit = &mut machine.vcpu.run_page().immediate_exit as *mut u8;
            self.kicker.retarget(immediate_exit);
            if let Some(engine) = self.vm.engine.as_mut().filter(|e| e.holds()) {
                engine.select(cpu);
            }
            self.monitor.on_cpu(cpu);
        }
    }
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

    #[test]
    fn a_cpu_that_cannot_run_on_hands_its_turn_on_whatever_the_monitor_says() {
        for (power, monitor_lets, ends) in [
            (Running, false, false),
            (Running, true, true),
            (Halted, false, true),
            (Stopped, false, true),
            (WaitingForStartup, false, true),
        ] {
            assert_eq!(turn_ends(power, monitor_lets), ends, "{power:?}");
        }
    }

    #[test]
    fn a_traced_turn_ends_only_after_a_step_no_host_runs_on_from() {
        let after = |steps, mid_rep, held| {
            TurnSoFar {
                steps,
                mid_rep,
                held,
            }
            .may_end()
        };
        assert!(!after(0, false, false), "nothing ran in this turn yet");
        assert!(after(1, false, false));
        assert!(!after(5, true, false), "between a REP's iterations");
        assert!(!after(5, false, true), "some host runs on from it");
    }

    #[test]
    fn untraced_turns_are_time_slices_and_only_several_cpus_race() {
        assert_eq!(time_slice(1), None);
        assert_eq!(time_slice(2), Some(TIME_SLICE));
        let untraced = EntryPlan::default();
        assert!(may_race(2, &untraced, false));
        assert!(!may_race(1, &untraced, false), "one CPU has no one to race");
        assert!(
            !may_race(2, &untraced, true),
            "a peeper reads the CPU on stage"
        );
        let stepped = EntryPlan {
            stepping: true,
            ..EntryPlan::default()
        };
        assert!(!may_race(2, &stepped, false));
        let mut armed = EntryPlan::default();
        assert!(armed.breakpoints.push(0x1000));
        assert!(!may_race(2, &armed, false));
        let done = EntryPlan {
            done: true,
            ..EntryPlan::default()
        };
        assert!(!may_race(2, &done, false));
    }
}
