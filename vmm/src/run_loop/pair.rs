//! Two CPUs' steps at once, while several CPUs are traced.
//!
//! The turns give the steps of a machine of several CPUs one total order
//! (see `turns`). Where the CPU on stage is about to step and the
//! CPU whose turn comes next would step an instruction that neither can
//! see the other's effects of (the monitor judges the instructions, see
//! [`Monitor::runs_beside`](crate::monitor::Monitor::runs_beside)), the
//! second CPU's step is launched ahead on its stepper (see `crate::steppers`) and
//! runs while the loop's thread runs the first; its exit is served when
//! its turn comes, as if it had run then. The trace is the one the turns
//! give one step after the other.
//!
//! That holds only if the loop would have done nothing to the second CPU
//! between the two steps, which [`may_pair`] makes sure of: no interrupt
//! waits for it, no device event falls due before it steps, no I/O of its
//! own completes, its debug state is armed already. And while a step is
//! ahead the loop takes no wake (a key, a `vtrace ctl`, a signal): what
//! comes from the host is taken after it, which its host timing allows.

use crate::cpus::StepState;
use crate::error::Result;
use crate::monitor::EntryPlan;

use super::turns::Turn;
use super::Run;
use crate::cpus::Power;
use crate::steppers::{self, Ahead};

/// What the loop knows of the CPU whose turn follows, for [`may_pair`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Second<'a> {
    /// A stepper enters it (CPUs 1, 2...).
    pub(super) has_stepper: bool,
    pub(super) power: Power,
    /// An interrupt waits for it.
    pub(super) interrupt_waiting: bool,
    /// Where its stepping stands.
    pub(super) step: &'a StepState,
    /// Its registers were written since stepping was armed.
    pub(super) step_stale: bool,
}

/// What [`may_pair`] decides from.
#[derive(Clone, Copy, Debug)]
pub(super) struct PairState<'a> {
    pub(super) plan: &'a EntryPlan,
    /// The CPU on stage: where its stepping stands (its entry is ready).
    pub(super) first: &'a StepState,
    /// The CPU whose turn follows, where another's does.
    pub(super) second: Option<Second<'a>>,
    /// A step runs ahead already.
    pub(super) ahead: bool,
    /// A device event (a timer) may fall due before the second CPU steps.
    pub(super) event_due: bool,
}

/// Whether the next CPU's step may be launched beside the on-stage one's,
/// as far as the machine goes (the monitor judges the instructions).
pub(super) fn may_pair(s: &PairState<'_>) -> bool {
    let Some(second) = s.second else {
        return false;
    };
    let quiet = |step: &StepState| !step.io_pending && !step.mmio_read_pending;
    s.plan.pairing
        && s.plan.stepping
        && !s.ahead
        && !s.event_due
        && quiet(s.first)
        && second.has_stepper
        && second.power == Power::Running
        && !second.interrupt_waiting
        && quiet(second.step)
        && !second.step.out_counted
        && second.step.stepping
        && second.step.breakpoints == s.plan.breakpoints
        && !second.step_stale
}

impl Run<'_> {
    /// Starts the steppers where the plan pairs a machine of several CPUs,
    /// ends them where it no longer does or the host is too busy for
    /// them (never with a step ahead).
    pub(super) fn fit_steppers(&mut self, plan: &EntryPlan) -> Result<()> {
        let count = self.vm.machine.cpus.count();
        let want = plan.pairing && plan.stepping && steppers::host_has_cores_for(count);
        let steppers = &mut self.vm.steppers;
        if steppers.any_ahead() {
            return Ok(());
        }
        if want && steppers.live() && steppers.crowded() {
            steppers.rest();
            tracing::debug!("the host is busy: one CPU steps at a time for a while");
            return Ok(());
        }
        if want == steppers.live() {
            return Ok(());
        }
        if !want {
            self.vm.steppers.stop();
            tracing::debug!("CPUs 1.. are entered from the loop's thread again");
            return Ok(());
        }
        if !steppers.may_start() {
            return Ok(());
        }
        let machine = &mut self.vm.machine;
        let on_stage = machine.cpus.on_stage();
        let mut vcpus = Vec::with_capacity(count);
        for cpu in 1..count {
            let (fd, run) = match cpu == on_stage {
                true => machine.vcpu.raw_parts(),
                false => match machine.cpus.parked_vcpu(cpu) {
                    Some(vcpu) => vcpu.raw_parts(),
                    None => continue,
                },
            };
            vcpus.push((cpu, fd, run));
        }
        tracing::debug!("CPUs 1.. are entered from steppers of their own");
        self.vm.steppers.start(vcpus)
    }

    /// Right before the on-stage CPU's entry: launches the step of the CPU
    /// whose turn follows ahead, where the two may run at once.
    pub(super) fn pair_up(&mut self, plan: &EntryPlan) {
        if !plan.pairing || !self.vm.steppers.live() {
            return;
        }
        let Some(second) = self.pairable_second(plan) else {
            return;
        };
        let first = self.vm.machine.cpus.on_stage();
        if !self.monitor.runs_beside(first, &mut self.vm.cpu_view()) {
            return;
        }
        let beside = match self.vm.parked_cpu_view(second) {
            Some(mut view) => self.monitor.runs_beside(second, &mut view),
            None => false,
        };
        let Some(vcpu) = self.vm.machine.cpus.parked_vcpu(second).filter(|_| beside) else {
            return;
        };
        // What `Vm::enter` and `inject` would do before its entry.
        vcpu.clear_debug_report();
        vcpu.run_page().request_interrupt_window = 0;
        let ahead = Ahead {
            entry_rip: vcpu.rip(),
            witness: vcpu.echo_witness(),
        };
        self.vm.steppers.launch_ahead(second, ahead);
        self.paired += 1;
    }

    /// The CPU whose turn follows the on-stage one's, where the machine
    /// lets it step beside it.
    fn pairable_second(&mut self, plan: &EntryPlan) -> Option<usize> {
        let Turn::Cpu(second) = self.whose_turn_follows() else {
            return None;
        };
        let machine = &mut self.vm.machine;
        let devices = &machine.devices;
        // Two steps' time: the first's, and a margin.
        let event_due = match machine.clock.step_nanos() {
            Some(ns) => {
                let soon = machine.clock.now().saturating_add(ns.saturating_mul(2));
                devices.next_deadline().is_some_and(|d| d <= soon)
            }
            None => false,
        };
        let interrupt_waiting = devices.pending_vector(second).is_some();
        let power = machine.cpus.power().get(second).copied()?;
        let has_stepper = self.vm.steppers.has(second);
        let ahead = self.vm.steppers.any_ahead();
        let first_step = &self.vm.step;
        let (vcpu, step) = self.vm.machine.cpus.parked(second)?;
        let state = PairState {
            plan,
            first: first_step,
            second: Some(Second {
                has_stepper,
                power,
                interrupt_waiting,
                step,
                step_stale: vcpu.step_stale(),
            }),
            ahead,
            event_due,
        };
        may_pair(&state).then_some(second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::Breakpoints;

    fn stepping() -> StepState {
        StepState {
            stepping: true,
            ..StepState::default()
        }
    }

    fn plan() -> EntryPlan {
        EntryPlan {
            stepping: true,
            pairing: true,
            ..EntryPlan::default()
        }
    }

    /// Whether the pair may run, with `change` made to a state that may.
    fn pairs(
        change: impl FnOnce(&mut EntryPlan, &mut StepState, &mut StepState, &mut PairFlags),
    ) -> bool {
        let (mut plan, mut first, mut second, mut flags) =
            (plan(), stepping(), stepping(), PairFlags::default());
        change(&mut plan, &mut first, &mut second, &mut flags);
        may_pair(&PairState {
            plan: &plan,
            first: &first,
            second: (!flags.no_second).then_some(Second {
                has_stepper: !flags.no_stepper,
                power: flags.power.unwrap_or(Power::Running),
                interrupt_waiting: flags.interrupt_waiting,
                step: &second,
                step_stale: flags.step_stale,
            }),
            ahead: flags.ahead,
            event_due: flags.event_due,
        })
    }

    #[derive(Default)]
    struct PairFlags {
        no_second: bool,
        no_stepper: bool,
        power: Option<Power>,
        interrupt_waiting: bool,
        step_stale: bool,
        ahead: bool,
        event_due: bool,
    }

    #[test]
    fn two_stepping_cpus_with_nothing_due_pair() {
        assert!(pairs(|_, _, _, _| {}));
    }

    #[test]
    fn a_plan_that_does_not_pair_or_step_pairs_nothing() {
        assert!(!pairs(|p, _, _, _| p.pairing = false));
        assert!(!pairs(|p, _, _, _| p.stepping = false));
    }

    #[test]
    fn nothing_the_loop_would_do_between_the_steps_may_wait() {
        assert!(!pairs(|_, _, _, f| f.event_due = true));
        assert!(!pairs(|_, _, _, f| f.interrupt_waiting = true));
        assert!(!pairs(|_, _, _, f| f.step_stale = true));
        assert!(!pairs(|_, _, s, _| s.io_pending = true));
        assert!(!pairs(|_, _, s, _| s.mmio_read_pending = true));
        assert!(!pairs(|_, _, s, _| s.out_counted = true));
        assert!(!pairs(|_, _, s, _| s.stepping = false));
        assert!(!pairs(|p, _, _, _| {
            p.breakpoints = Breakpoints::default();
            p.breakpoints.push(0x1000);
        }));
    }

    #[test]
    fn the_first_cpu_must_step_an_instruction_of_its_own() {
        assert!(!pairs(|_, f, _, _| f.io_pending = true));
        assert!(!pairs(|_, f, _, _| f.mmio_read_pending = true));
    }

    #[test]
    fn only_a_running_cpu_with_a_stepper_and_none_ahead_pairs() {
        assert!(!pairs(|_, _, _, f| f.no_second = true));
        assert!(!pairs(|_, _, _, f| f.no_stepper = true));
        assert!(!pairs(|_, _, _, f| f.power = Some(Power::Halted)));
        assert!(!pairs(|_, _, _, f| f.ahead = true));
    }
}
