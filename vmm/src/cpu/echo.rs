//! The single-step KVM on VT-x reports twice.
//!
//! After an instruction KVM completes itself (an `OUT` or `IN` the VMM
//! served, `RDMSR`/`WRMSR`, a control-register or descriptor-table write),
//! KVM synthesizes the trap that instruction owes the debugger: a debug
//! exit at once, with RIP past it. On VT-x the CPU still holds a pending
//! single-step trap for it as well (measured on KVM's VMX code in the VT-x
//! test machine): the next entry exits again with a #DB before any
//! instruction ran, RIP and registers as they were. Counted as a step, the
//! next instruction would be recorded twice with a gap between. The same
//! echo comes on the first entry after single-stepping is armed, and after
//! an exit KVM serves without user space (an EPT violation on the first
//! touch of a page: the demo's `memset` of a fresh frame recorded its first
//! `rep stosb` iteration twice). So every stepping exit is judged.
//!
//! The two are told apart by who wrote the exit: KVM's #DB intercept copies
//! the guest's DR7 into `kvm_run.debug.arch.dr7`, whose bit 10 always reads
//! 1, while a synthesized trap leaves the field as it was. The VMM writes
//! [`NOT_REPORTED_DR7`] there before each stepping entry.
//!
//! An exit that ran nothing looks like one step of an instruction that
//! branches to itself (`jmp $`); that one case is an echo only where the
//! host was seen to echo before, so that hosts that do not (AMD-V, the
//! paravirtual emulating hosts) never lose a step of a spin loop.

use iced_x86::{Decoder, DecoderOptions, FlowControl, OpKind};

use crate::vcpu::NOT_REPORTED_DR7;

/// Whether a debug exit's DR7 (`kvm_run.debug.arch.dr7`, cleared before
/// the entry) says the CPU raised the #DB rather than KVM synthesizing it.
pub(crate) fn raised_by_cpu(dr7: u64) -> bool {
    dr7 != NOT_REPORTED_DR7
}

/// What is known of a single-step debug exit when judging it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StepExit {
    /// The CPU's #DB reached KVM (DR7 was reported), rather than KVM
    /// synthesizing the trap after completing an instruction itself.
    pub(crate) from_cpu: bool,
    /// RIP, RSP, RCX and RFLAGS are as they were at entry. Only an
    /// instruction that branches to itself leaves them so (a REP
    /// iteration, the other way RIP stays, moves RCX).
    pub(crate) unchanged: bool,
}

/// What the host was seen to do, to judge the next exit.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct EchoWatch {
    /// This host was seen to echo (an unambiguous case).
    pub(crate) seen: bool,
    /// Echoes passed over, for the diagnostics.
    pub(crate) count: u64,
}

impl EchoWatch {
    /// Judges a single-step exit. `may_branch_to_itself` is asked only
    /// where the answer matters. True: nothing ran, the VMM enters again
    /// without telling anyone.
    pub(crate) fn is_echo(
        &mut self,
        exit: StepExit,
        may_branch_to_itself: impl FnOnce() -> bool,
    ) -> bool {
        if !(exit.from_cpu && exit.unchanged) {
            return false;
        }
        let echo = if may_branch_to_itself() {
            self.seen
        } else {
            self.seen = true;
            true
        };
        if echo {
            self.count += 1;
        }
        echo
    }
}

/// Whether one step of `code` (at `rip`, decoded as `bitness`-bit code)
/// could leave RIP where it was: a branch of any kind, unless it is a
/// direct one to elsewhere (a far jump's offset becomes RIP, whatever its
/// selector). Code that does not decode could be anything.
pub(crate) fn may_branch_to_itself(code: &[u8], bitness: u32, rip: u64) -> bool {
    let mut decoder = Decoder::with_ip(bitness, code, rip, DecoderOptions::NONE);
    let insn = decoder.decode();
    if insn.is_invalid() {
        return true;
    }
    match insn.flow_control() {
        FlowControl::Next => false,
        FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
            if insn.is_jmp_short_or_near() || insn.is_jcc_short_or_near() || insn.is_loop() =>
        {
            insn.near_branch_target() == rip
        }
        FlowControl::UnconditionalBranch if insn.op0_kind() == OpKind::FarBranch16 => {
            u64::from(insn.far_branch16()) == rip
        }
        FlowControl::UnconditionalBranch if insn.op0_kind() == OpKind::FarBranch32 => {
            u64::from(insn.far_branch32()) == rip
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RAN_NOTHING: StepExit = StepExit {
        from_cpu: true,
        unchanged: true,
    };

    #[test]
    fn an_unchanged_cpu_trap_is_an_echo() {
        let mut w = EchoWatch::default();
        assert!(w.is_echo(RAN_NOTHING, || false));
        assert!(w.seen);
        assert_eq!(w.count, 1);
    }

    #[test]
    fn a_step_that_changed_anything_or_a_synthesized_trap_is_not() {
        let mut w = EchoWatch::default();
        // A REP iteration: RIP stays, RCX moved.
        let rep = StepExit {
            from_cpu: true,
            unchanged: false,
        };
        assert!(!w.is_echo(rep, || unreachable!("not asked")));
        // Emulating hosts synthesize every trap: never an echo.
        let synthesized = StepExit {
            from_cpu: false,
            unchanged: true,
        };
        assert!(!w.is_echo(synthesized, || false));
        assert_eq!((w.seen, w.count), (false, 0));
    }

    #[test]
    fn a_spin_loop_is_an_echo_only_where_the_host_echoes() {
        let mut amd = EchoWatch::default();
        assert!(!amd.is_echo(RAN_NOTHING, || true), "a step of jmp $");
        let mut intel = EchoWatch::default();
        assert!(intel.is_echo(RAN_NOTHING, || false));
        assert!(intel.is_echo(RAN_NOTHING, || true));
    }

    #[test]
    fn only_branches_that_may_target_themselves_are_ambiguous() {
        let at = |code: &[u8]| may_branch_to_itself(code, 64, 0x1000);
        assert!(at(&[0xeb, 0xfe]), "jmp $");
        assert!(at(&[0x75, 0xfe]), "jne $");
        assert!(at(&[0xe9, 0xfb, 0xff, 0xff, 0xff]), "jmp near $");
        assert!(at(&[0xff, 0xe0]), "jmp rax: could be to itself");
        assert!(at(&[0xc3]), "ret: could be to itself");
        assert!(at(&[]), "nothing read");
        assert!(!at(&[0xeb, 0x00]), "jmp to the next instruction");
        assert!(!at(&[0x75, 0x10]), "jne elsewhere");
        assert!(!at(&[0xf3, 0xaa]), "rep stosb");
        assert!(!may_branch_to_itself(&[0xfa], 32, 0x1000), "cli");
        // An application processor's way into protected mode (the SMP
        // demo's trampoline): its first echo on VT-x.
        let far = [0x66, 0xea, 0x1e, 0x00, 0x01, 0x00, 0x08, 0x00];
        assert!(
            !may_branch_to_itself(&far, 16, 0x10016),
            "jmp far 8:0x1001e"
        );
        assert!(may_branch_to_itself(&far, 16, 0x1001e), "jmp far 8:$");
        assert!(
            may_branch_to_itself(&[0xff, 0x2c, 0x24], 64, 0x1000),
            "jmp far [rsp]: could be to itself"
        );
    }
}
