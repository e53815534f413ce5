//! What the engine's functions share while following one exit, built
//! once per exit ([`AtExit`]), and the one decision of how the exit
//! completed the pending instruction ([`outcome`]), a pure function
//! tested as a table (as the VMM's `run_loop/decide.rs` is).

use vtrace_vmm::CpuView;
use vtrace_x86::{Registers, SpecialRegisters};

use super::Pending;

/// The vCPU as one exit left it: its registers (a step may correct
/// them before they are recorded) and where it goes next.
pub(super) struct AtExit<'a> {
    /// The vCPU and guest memory.
    pub cpu: &'a mut dyn CpuView,
    /// The general registers at the exit.
    pub regs: Registers,
    /// The system registers at the exit.
    pub sregs: SpecialRegisters,
    /// The linear address of the next instruction.
    pub next: u64,
}

impl<'a> AtExit<'a> {
    /// The vCPU's state now.
    #[inline]
    pub fn read(cpu: &'a mut dyn CpuView) -> AtExit<'a> {
        let regs = cpu.regs();
        let sregs = cpu.sregs();
        let next = crate::context::linear_pc(&sregs, regs.rip);
        AtExit {
            cpu,
            regs,
            sregs,
            next,
        }
    }
}

/// What the exit says of the pending instruction's completion, taken from
/// the engine's state as the exit is followed.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Completion {
    /// The exit is not a debug exit: the instruction completed at it
    /// (I/O, HLT, an instruction the VMM completed).
    pub here: bool,
    /// A MOV store that completed an MMIO exit.
    pub mmio_store: bool,
    /// The last exit was in a REP instruction's midst.
    pub mid_rep: bool,
    /// The engine put TF into R11 for this instruction (SYSRET).
    pub carried_r11: bool,
}

/// How an exit completed the pending instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// It ran, and went where its decoding says: one step (or a REP
    /// batch's iterations).
    Explained,
    /// It held the trap back (an interrupt shadow, a fence, SWAPGS, PAUSE
    /// on QEMU's SVM, an MMIO store on the paravirtual hosts): the
    /// instructions after it ran too, and are rebuilt, where they explain
    /// the next pc.
    HeldTrap,
    /// Not where it goes: it faulted (its handler's first step is
    /// inferred through the IDT), or the CPU went somewhere unseen (a gap).
    FaultOrGap,
}

/// How the exit at `next`, at privilege level `cpl`, completed `p`.
#[inline]
pub(super) fn outcome(p: &Pending, completion: Completion, cpl: u8, next: u64) -> Outcome {
    match &p.decoded {
        // Only some instructions change the privilege level; after any
        // other, a new CPL means the CPU went somewhere unseen.
        Some(d) if d.explains(p.pc, next) && (d.changes_privilege || cpl == p.cpl) => {
            Outcome::Explained
        }
        // A MOV store that completed an MMIO exit may not trap on its own
        // (the paravirtual hosts), nor may PAUSE (QEMU's SVM, the AMD-V
        // test machine: its PAUSE ends the translation block without the
        // trap): the instruction after it ran too, as after a fence.
        Some(d)
            if d.shadow.is_some()
                || completion.mmio_store
                || d.insn.mnemonic() == iced_x86::Mnemonic::Pause =>
        {
            Outcome::HeldTrap
        }
        _ => Outcome::FaultOrGap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtrace_storage::CpuMode;

    const PC: u64 = 0x1000;

    /// Instruction, CPL before, how it completed, CPL after, next pc, the
    /// outcome, and why.
    type Row<'a> = (&'a [u8], u8, Completion, u8, u64, Outcome, &'a str);

    fn pending(bytes: &[u8], cpl: u8) -> Pending {
        Pending {
            pc: PC,
            bytes: None,
            decoded: crate::flow::decode(bytes, 64, PC),
            fetched: bytes.len() as u8,
            cr3: 0,
            mode: CpuMode::Long64,
            cpl,
        }
    }

    #[test]
    fn each_completion_has_its_outcome() {
        use Outcome::*;
        let plain = Completion::default();
        let mmio = Completion {
            mmio_store: true,
            ..plain
        };
        let rows: &[Row] = &[
            (&[0x90], 0, plain, 0, PC + 1, Explained, "nop falls through"),
            (
                &[0x90],
                0,
                plain,
                0,
                PC + 9,
                FaultOrGap,
                "nop elsewhere: unseen",
            ),
            (
                &[0x90],
                0,
                plain,
                3,
                PC + 1,
                FaultOrGap,
                "nop to CPL 3: unseen",
            ),
            (
                &[0x0f, 0x05],
                3,
                plain,
                0,
                0xffff_8000,
                Explained,
                "syscall to CPL 0",
            ),
            (
                &[0xeb, 0x10],
                0,
                plain,
                0,
                PC + 0x12,
                Explained,
                "jmp to its target",
            ),
            (
                &[0xeb, 0x10],
                0,
                plain,
                0,
                PC + 2,
                FaultOrGap,
                "jmp through",
            ),
            (&[0xc3], 0, plain, 0, 0x4242, Explained, "ret anywhere"),
            (&[0xfb], 0, plain, 0, PC + 2, HeldTrap, "sti and the next"),
            (
                &[0x0f, 0xae, 0xe8],
                0,
                plain,
                0,
                PC + 4,
                HeldTrap,
                "lfence and the next",
            ),
            (
                &[0xf3, 0x90],
                0,
                plain,
                0,
                PC + 3,
                HeldTrap,
                "pause and the next",
            ),
            (
                &[0x89, 0x03],
                0,
                plain,
                0,
                PC + 3,
                FaultOrGap,
                "a store and the next",
            ),
            (
                &[0x89, 0x03],
                0,
                mmio,
                0,
                PC + 3,
                HeldTrap,
                "an MMIO store and the next",
            ),
            (
                &[0x89, 0x03],
                0,
                mmio,
                0,
                PC + 2,
                Explained,
                "an MMIO store alone",
            ),
            (
                &[0x0f, 0x0b],
                0,
                plain,
                0,
                PC + 2,
                FaultOrGap,
                "ud2 does not fall through",
            ),
            (
                &[0x0f, 0xff],
                0,
                plain,
                0,
                PC + 2,
                FaultOrGap,
                "undecodable",
            ),
        ];
        for (bytes, before, completion, after, next, want, what) in rows {
            let p = pending(bytes, *before);
            assert_eq!(outcome(&p, *completion, *after, *next), *want, "{what}");
        }
    }
}
