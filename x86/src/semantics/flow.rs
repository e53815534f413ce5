//! Where an instruction sends control, from its decoding.

use iced_x86::{FlowControl, Instruction, Mnemonic, OpKind};

/// How an instruction passes control on. The tracer asks it where the
/// next step may be (with [`near_target`]); the analyzer, where calls,
/// returns and kernel entries are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flow {
    /// Falls through to the next instruction.
    Next,
    /// A `rep` string instruction: one iteration per step, so it may also
    /// stay where it is.
    Repeat,
    /// HLT: falls through once the CPU wakes.
    Halt,
    /// Raises an exception by design (UD2 and kin, and bytes that do not
    /// decode): the next pc is its handler's.
    Trap,
    /// XBEGIN: falls through, or, where the transaction aborts, goes to
    /// its abort handler.
    Transaction,
    /// An unconditional jump, direct or indirect, near or far.
    Jump,
    /// A conditional branch (Jcc, LOOP, JRCXZ): to its target or through.
    Branch,
    /// CALL, near or far, direct or indirect.
    Call,
    /// RET, near or far.
    Return,
    /// IRET, SYSRET, SYSEXIT: back from an interrupt or a kernel entry.
    InterruptReturn,
    /// INT n, INT3, INT1, INTO, SYSCALL, SYSENTER: a deliberate kernel
    /// entry.
    SystemCall,
}

impl Flow {
    /// The flow of `insn`.
    pub fn of(insn: &Instruction) -> Flow {
        use Mnemonic::*;
        match insn.mnemonic() {
            Iret | Iretd | Iretq | Sysret | Sysretq | Sysexit | Sysexitq => {
                return Flow::InterruptReturn
            }
            Syscall | Sysenter | Int | Int3 | Into | Int1 => return Flow::SystemCall,
            _ => {}
        }
        match insn.flow_control() {
            FlowControl::Next if insn.mnemonic() == Hlt => Flow::Halt,
            FlowControl::Next
                if (insn.has_rep_prefix() || insn.has_repne_prefix())
                    && is_string_op(insn.mnemonic()) =>
            {
                Flow::Repeat
            }
            FlowControl::Next => Flow::Next,
            FlowControl::UnconditionalBranch | FlowControl::IndirectBranch => Flow::Jump,
            FlowControl::ConditionalBranch => Flow::Branch,
            FlowControl::Call | FlowControl::IndirectCall => Flow::Call,
            FlowControl::Return => Flow::Return,
            FlowControl::Interrupt => Flow::SystemCall,
            FlowControl::XbeginXabortXend => Flow::Transaction,
            FlowControl::Exception => Flow::Trap,
        }
    }

    /// Whether control goes on in line, as a call nest sees it: no jump,
    /// call, return or kernel entry (HLT, REP iterations, UD2 and
    /// transactions included).
    pub fn in_line(self) -> bool {
        matches!(
            self,
            Flow::Next | Flow::Repeat | Flow::Halt | Flow::Trap | Flow::Transaction
        )
    }

    /// Whether it is a jump, conditional or not.
    pub fn jumps(self) -> bool {
        matches!(self, Flow::Jump | Flow::Branch)
    }
}

/// The target of a direct near jump, branch or call, from its bytes; `None`
/// for any other instruction (an indirect or far transfer's target is not
/// in its bytes).
pub fn near_target(insn: &Instruction) -> Option<u64> {
    match insn.op0_kind() {
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 => {
            Some(insn.near_branch_target())
        }
        _ => None,
    }
}

fn is_string_op(m: Mnemonic) -> bool {
    use Mnemonic::*;
    matches!(
        m,
        Movsb
            | Movsw
            | Movsd
            | Movsq
            | Stosb
            | Stosw
            | Stosd
            | Stosq
            | Lodsb
            | Lodsw
            | Lodsd
            | Lodsq
            | Scasb
            | Scasw
            | Scasd
            | Scasq
            | Cmpsb
            | Cmpsw
            | Cmpsd
            | Cmpsq
            | Insb
            | Insw
            | Insd
            | Outsb
            | Outsw
            | Outsd
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    fn flow(bytes: &[u8]) -> (Flow, Option<u64>) {
        let insn = Decoder::with_ip(64, bytes, 0x10, DecoderOptions::NONE).decode();
        (Flow::of(&insn), near_target(&insn))
    }

    #[test]
    fn each_kind_of_transfer_has_its_flow() {
        let cases: &[(&[u8], Flow, Option<u64>, &str)] = &[
            (&[0x90], Flow::Next, None, "nop"),
            (
                &[0xf3, 0x90],
                Flow::Next,
                None,
                "pause: a REP prefix, no string",
            ),
            (&[0xf4], Flow::Halt, None, "hlt"),
            (&[0xf3, 0xa4], Flow::Repeat, None, "rep movsb"),
            (&[0xa4], Flow::Next, None, "movsb, one"),
            (&[0xeb, 0xfe], Flow::Jump, Some(0x10), "jmp $"),
            (&[0xff, 0xe0], Flow::Jump, None, "jmp rax"),
            (&[0x74, 0x02], Flow::Branch, Some(0x14), "jz"),
            (&[0xe2, 0xfe], Flow::Branch, Some(0x10), "loop"),
            (&[0xe8, 0, 0, 0, 0], Flow::Call, Some(0x15), "call"),
            (&[0xff, 0xd0], Flow::Call, None, "call rax"),
            (&[0xc3], Flow::Return, None, "ret"),
            (&[0x48, 0xcf], Flow::InterruptReturn, None, "iretq"),
            (&[0x48, 0x0f, 0x07], Flow::InterruptReturn, None, "sysretq"),
            (&[0x0f, 0x05], Flow::SystemCall, None, "syscall"),
            (&[0xcd, 0x80], Flow::SystemCall, None, "int 0x80"),
            (&[0xcc], Flow::SystemCall, None, "int3"),
            (&[0x0f, 0x0b], Flow::Trap, None, "ud2"),
            (
                &[0xc7, 0xf8, 0, 0, 0, 0],
                Flow::Transaction,
                Some(0x16),
                "xbegin",
            ),
        ];
        for (bytes, want, target, what) in cases {
            assert_eq!(flow(bytes), (*want, *target), "{what}");
        }
    }

    #[test]
    fn a_nest_sees_only_transfers_as_out_of_line() {
        for f in [
            Flow::Next,
            Flow::Repeat,
            Flow::Halt,
            Flow::Trap,
            Flow::Transaction,
        ] {
            assert!(f.in_line() && !f.jumps(), "{f:?}");
        }
        for f in [Flow::Jump, Flow::Branch] {
            assert!(!f.in_line() && f.jumps(), "{f:?}");
        }
        for f in [
            Flow::Call,
            Flow::Return,
            Flow::InterruptReturn,
            Flow::SystemCall,
        ] {
            assert!(!f.in_line() && !f.jumps(), "{f:?}");
        }
    }
}
