//! The run loop's decisions as pure functions of what the loop knows at
//! an exit: which debug exit is a breakpoint's, what the step clock counts,
//! whether a HLT waits, how an interrupt reaches the guest. The handlers
//! act on them; the tests below check every host quirk they encode with
//! made-up exits, where no /dev/kvm exists.

use kvm_bindings::{
    kvm_guest_debug, KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_SINGLESTEP, KVM_GUESTDBG_USE_HW_BP,
};

use crate::monitor::{Breakpoints, Directive, EntryPlan, ExitAnswer};

/// DR6 bits 0-3: the hardware breakpoint that matched.
const DR6_BREAKPOINTS: u64 = 0xf;
/// DR6.BS: the exit is a single step's.
const DR6_SINGLE_STEP: u64 = 1 << 14;

/// KVM's debug configuration for single-stepping and for instruction
/// breakpoints at `breakpoints`.
pub(super) fn guest_debug(stepping: bool, breakpoints: &Breakpoints) -> kvm_guest_debug {
    let mut debug = kvm_guest_debug::default();
    if stepping || !breakpoints.is_empty() {
        debug.control = KVM_GUESTDBG_ENABLE;
    }
    if stepping {
        debug.control |= KVM_GUESTDBG_SINGLESTEP;
    }
    if !breakpoints.is_empty() {
        debug.control |= KVM_GUESTDBG_USE_HW_BP;
        for (i, addr) in breakpoints.as_slice().iter().enumerate() {
            debug.arch.debugreg[i] = *addr;
            // Local enable; R/W and LEN 0: break on execution.
            debug.arch.debugreg[7] |= 1 << (2 * i);
        }
    }
    debug
}

/// Whether a debug exit with `dr6` is a hardware breakpoint's (the
/// instruction at it has not run) rather than a step's. With stepping and a
/// breakpoint on the next instruction both set, some hosts report both
/// bits at the step: that exit is the step's.
pub(super) fn breakpoint_hit(dr6: u64) -> bool {
    dr6 & DR6_BREAKPOINTS != 0 && dr6 & DR6_SINGLE_STEP == 0
}

/// What follows a debug exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct AfterDebug {
    /// Instructions the step clock advances by.
    pub(super) clock_steps: u64,
    /// The step of an OUT counted ahead at its I/O exit is settled.
    pub(super) settles_out: bool,
    /// Set RFLAGS.RF: an instruction breakpoint fires before the
    /// instruction, and RF lets it run once without firing again.
    pub(super) resume_flag: bool,
    /// What the monitor asked for.
    pub(super) then: Directive,
}

/// At a debug exit: `out_counted` says the OUT this step completes was
/// counted at its I/O exit already (see [`out_counted_ahead`]).
pub(super) fn after_debug(breakpoint: bool, answer: ExitAnswer, out_counted: bool) -> AfterDebug {
    if breakpoint {
        return AfterDebug {
            clock_steps: 0,
            settles_out: false,
            resume_flag: true,
            then: answer.directive,
        };
    }
    AfterDebug {
        clock_steps: answer.instructions.saturating_sub(u64::from(out_counted)),
        settles_out: true,
        resume_flag: false,
        then: answer.directive,
    }
}

/// Whether an OUT's step is counted at its I/O exit, ahead of the debug
/// exit that completes it. Devices must see the time after the OUT on
/// every host: where KVM's emulator ran it (`completed`) its step is done;
/// on KVM's fast path (VT-x/AMD-V) RIP is still at it and the next entry's
/// debug exit steps it, which must then not count it again.
pub(super) fn out_counted_ahead(completed: bool) -> bool {
    !completed
}

/// What follows a HLT exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AfterHalt {
    /// No HLT ran (an emulating host reported once more a HLT it stepped
    /// before an interrupt woke the guest): make the vCPU runnable, go on.
    RunOn,
    /// Wait for the next interrupt as HLT does, after advancing the step
    /// clock by `clock_steps`.
    Wait {
        /// Instructions the exit covered (none outside stepping: the clock
        /// follows the host then).
        clock_steps: u64,
    },
}

/// At a HLT exit: while stepping the monitor knows whether a HLT ran (it
/// answers [`Directive::Halt`]); outside stepping one always did.
pub(super) fn after_halt(stepping: bool, answer: ExitAnswer) -> AfterHalt {
    match (stepping, answer.directive) {
        (false, _) => AfterHalt::Wait { clock_steps: 0 },
        (true, Directive::Halt) => AfterHalt::Wait {
            clock_steps: answer.instructions,
        },
        (true, _) => AfterHalt::RunOn,
    }
}

/// What the loop knows when it may inject an interrupt.
#[derive(Clone, Copy, Debug)]
pub(super) struct InjectionState {
    /// The PIC has an interrupt for the CPU.
    pub(super) pending: bool,
    /// KVM single-steps the vCPU as of the last entry.
    pub(super) stepping: bool,
    /// The next entry completes an IN or MMIO read (RIP must not move).
    pub(super) io_pending: bool,
    /// KVM can take an interrupt now and the guest's IF is set.
    pub(super) window_open: bool,
    /// The monitor's plan for the next entry.
    pub(super) plan: EntryPlan,
}

/// How (or whether) the pending interrupt reaches the guest now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Injection {
    /// Not now: the monitor holds interrupts back (mid REP) and stepping
    /// exits after every instruction anyway.
    Hold,
    /// Nothing is pending: no interrupt window is needed.
    NothingPending,
    /// The guest cannot take it now: ask KVM to exit when it can.
    RequestWindow,
    /// The guest cannot take it now, and the vCPU steps: the next exit
    /// comes after one instruction, so no interrupt window is asked for.
    NextStep,
    /// The guest can, but the VMM delivers and an IN or MMIO read
    /// completes on the next entry (moving RIP under it would break the
    /// completion): one exit later.
    AfterIo,
    /// Through the guest's IDT by the VMM, so the handler is stepped
    /// (falls back to [`Injection::Queue`] where the VMM does not model the
    /// delivery).
    ThroughIdt,
    /// With `KVM_INTERRUPT`: KVM delivers it on the next entry.
    Queue,
}

/// Decides how the pending interrupt is injected. Whether the *next*
/// entry steps decides delivery through the IDT, not whether the last one
/// did: an interrupt queued where tracing starts would be delivered by the
/// CPU with the tracer's TF in the frame it pushes, for the guest to find
/// after tracing stops.
pub(super) fn injection(s: InjectionState) -> Injection {
    if s.pending && s.stepping && !s.plan.interruptible {
        return Injection::Hold;
    }
    if !s.pending {
        return Injection::NothingPending;
    }
    if !s.window_open {
        // KVM would arm its interrupt window on every entry until the
        // guest sets IF, for an exit the step brings anyway. (On the AMD-V
        // test machine each such VMRUN also risks QEMU losing one of the
        // host kernel's timer interrupts: docs/amdv.md.)
        if s.stepping && s.plan.stepping {
            return Injection::NextStep;
        }
        return Injection::RequestWindow;
    }
    match (s.plan.deliver_interrupts, s.plan.stepping, s.io_pending) {
        (true, true, false) => Injection::ThroughIdt,
        (true, _, true) => Injection::AfterIo,
        _ => Injection::Queue,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(directive: Directive, instructions: u64) -> ExitAnswer {
        ExitAnswer {
            directive,
            instructions,
        }
    }

    #[test]
    fn debug_configuration_arms_what_was_asked() {
        let none = guest_debug(false, &Breakpoints::default());
        assert_eq!(none.control, 0, "nothing asked: debugging off");

        let step = guest_debug(true, &Breakpoints::default());
        assert_eq!(step.control, KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP);
        assert_eq!(step.arch.debugreg, [0; 8]);

        let mut at = Breakpoints::default();
        at.push(0x1000);
        at.push(0x2000);
        let bp = guest_debug(false, &at);
        assert_eq!(bp.control, KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_HW_BP);
        assert_eq!(&bp.arch.debugreg[..2], &[0x1000, 0x2000]);
        assert_eq!(bp.arch.debugreg[7], 0b101, "L0 and L1, execute, length 0");
    }

    #[test]
    fn a_debug_exit_is_a_breakpoint_only_without_the_step_bit() {
        assert!(breakpoint_hit(0b0001));
        assert!(breakpoint_hit(0b1000));
        assert!(!breakpoint_hit(DR6_SINGLE_STEP));
        assert!(
            !breakpoint_hit(DR6_SINGLE_STEP | 0b0001),
            "a step that also matched"
        );
        // DR6's reserved bits read as ones on real CPUs.
        assert!(!breakpoint_hit(0xffff_0ff0 | DR6_SINGLE_STEP));
        assert!(breakpoint_hit(0xffff_0ff0 | 0b0010));
    }

    #[test]
    fn a_breakpoint_sets_rf_and_advances_no_clock() {
        let after = after_debug(true, answer(Directive::Continue, 1), true);
        assert!(after.resume_flag);
        assert_eq!(after.clock_steps, 0, "the instruction has not run");
        assert!(!after.settles_out, "the OUT's own step is still to come");
    }

    #[test]
    fn a_step_counts_the_instructions_the_monitor_saw() {
        let after = after_debug(false, answer(Directive::ReArm, 3), false);
        assert_eq!(after.clock_steps, 3, "a batch of REP iterations");
        assert!(!after.resume_flag);
        assert_eq!(after.then, Directive::ReArm);
    }

    #[test]
    fn an_out_completed_on_the_next_entry_is_counted_once() {
        // VT-x/AMD-V: the OUT's exit counts its step ahead, and the debug
        // exit that completes it counts one less.
        assert!(out_counted_ahead(false));
        let after = after_debug(false, answer(Directive::Continue, 1), true);
        assert_eq!(after.clock_steps, 0);
        assert!(after.settles_out);
        // This host's emulator completed it at the I/O exit: the next
        // debug exit is the next instruction's, counted in full.
        assert!(!out_counted_ahead(true));
        let after = after_debug(false, answer(Directive::Continue, 1), false);
        assert_eq!(after.clock_steps, 1);
        // Never below zero, whatever a monitor answers.
        let after = after_debug(false, answer(Directive::Continue, 0), true);
        assert_eq!(after.clock_steps, 0);
    }

    #[test]
    fn hlt_waits_while_stepping_only_where_the_monitor_saw_it_run() {
        assert_eq!(
            after_halt(true, answer(Directive::Halt, 1)),
            AfterHalt::Wait { clock_steps: 1 }
        );
        assert_eq!(
            after_halt(true, answer(Directive::Continue, 1)),
            AfterHalt::RunOn,
            "a HLT reported again after the interrupt that woke it"
        );
        assert_eq!(
            after_halt(false, answer(Directive::Continue, 1)),
            AfterHalt::Wait { clock_steps: 0 },
            "untraced, a HLT exit is a HLT"
        );
    }

    fn state(pending: bool, stepping: bool, io_pending: bool, window_open: bool) -> InjectionState {
        InjectionState {
            pending,
            stepping,
            io_pending,
            window_open,
            plan: EntryPlan::default(),
        }
    }

    #[test]
    fn untraced_interrupts_are_queued_or_wait_for_a_window() {
        assert_eq!(
            injection(state(false, false, false, true)),
            Injection::NothingPending
        );
        assert_eq!(injection(state(true, false, false, true)), Injection::Queue);
        assert_eq!(
            injection(state(true, false, false, false)),
            Injection::RequestWindow
        );
        // Without a monitor that delivers, an I/O completion does not
        // hold KVM's own injection back.
        assert_eq!(injection(state(true, false, true, true)), Injection::Queue);
    }

    #[test]
    fn a_stepped_guest_takes_interrupts_through_its_idt_after_io_completes() {
        let mut s = state(true, true, false, true);
        s.plan.stepping = true;
        s.plan.deliver_interrupts = true;
        assert_eq!(injection(s), Injection::ThroughIdt);
        s.io_pending = true;
        assert_eq!(injection(s), Injection::AfterIo);
        s.window_open = false;
        assert_eq!(
            injection(s),
            Injection::NextStep,
            "stepping exits after the instruction that sets IF: no window"
        );
        // Tracing starts at this entry: the next entry steps, so the
        // VMM delivers, though the last one did not step.
        let mut starting = state(true, false, false, true);
        starting.plan.stepping = true;
        starting.plan.deliver_interrupts = true;
        assert_eq!(injection(starting), Injection::ThroughIdt);
        starting.window_open = false;
        assert_eq!(
            injection(starting),
            Injection::RequestWindow,
            "the entry that starts stepping has yet to show it steps"
        );
        // Tracing stops at this entry: KVM delivers.
        let mut stopping = state(true, true, false, true);
        stopping.plan.deliver_interrupts = true;
        assert_eq!(injection(stopping), Injection::Queue);
        stopping.window_open = false;
        assert_eq!(injection(stopping), Injection::RequestWindow);
    }

    #[test]
    fn no_interrupt_between_rep_iterations_while_stepping() {
        let mut s = state(true, true, false, true);
        s.plan.interruptible = false;
        assert_eq!(injection(s), Injection::Hold);
        s.stepping = false;
        assert_eq!(
            injection(s),
            Injection::Queue,
            "untraced the CPU decides between iterations"
        );
    }
}
