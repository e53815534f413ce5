//! Where an instruction may send execution next, from its decoding.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind};

/// The set of next pcs an instruction explains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Falls through to the next instruction.
    Next,
    /// A `rep` string instruction: one iteration per step, so it may also
    /// stay where it is.
    Repeat,
    /// Always goes to `target` (direct jump or call).
    Jump(u64),
    /// Goes to `target` or falls through (conditional branch, loop).
    Branch(u64),
    /// Cannot be predicted from the bytes (indirect branch, return, IRET,
    /// software interrupt, far transfer): any next pc is accepted.
    Any,
    /// HLT.
    Halt,
    /// Raises an exception by design (UD2 and kin): the next pc is its
    /// handler's, which the engine identifies through the IDT.
    Trap,
}

/// A decoded instruction as the engine needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub len: usize,
    pub flow: Flow,
    /// The instruction invalidates cached translations (INVLPG, MOV to CR,
    /// INVPCID, WBINVD is not enough to matter).
    pub flushes_tlb: bool,
    /// The instruction may clear RFLAGS.TF (SYSCALL, SYSENTER, POPF, IRET,
    /// SYSRET): where stepping rides on TF, it must be armed again.
    pub clears_tf: bool,
    /// IRETQ: its target is the RIP it pops, so the engine can check that
    /// the next step is there.
    pub iretq: bool,
    /// The instruction may set RFLAGS.IF (STI, IRET, POPF).
    pub enables_interrupts: bool,
}

/// Decodes the instruction at the start of `bytes` (at address `ip`).
pub fn decode(bytes: &[u8], bitness: u32, ip: u64) -> Option<Decoded> {
    let mut decoder = Decoder::with_ip(bitness, bytes, ip, DecoderOptions::NONE);
    let insn: Instruction = decoder.decode();
    if insn.is_invalid() {
        return None;
    }
    let near_target = || match insn.op0_kind() {
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 => {
            Some(insn.near_branch_target())
        }
        _ => None,
    };
    let flow = match insn.flow_control() {
        FlowControl::Next if insn.mnemonic() == Mnemonic::Hlt => Flow::Halt,
        FlowControl::Next if insn.has_rep_prefix() || insn.has_repne_prefix() => {
            if is_string_op(insn.mnemonic()) {
                Flow::Repeat
            } else {
                Flow::Next
            }
        }
        FlowControl::Next => Flow::Next,
        FlowControl::UnconditionalBranch | FlowControl::Call => {
            near_target().map_or(Flow::Any, Flow::Jump)
        }
        FlowControl::ConditionalBranch => near_target().map_or(Flow::Any, Flow::Branch),
        FlowControl::Exception => Flow::Trap,
        _ => Flow::Any,
    };
    let flushes_tlb = matches!(
        insn.mnemonic(),
        Mnemonic::Invlpg | Mnemonic::Invpcid | Mnemonic::Invlpga
    ) || (insn.mnemonic() == Mnemonic::Mov
        && insn.op0_kind() == OpKind::Register
        && insn.op0_register().is_cr());
    let clears_tf = matches!(
        insn.mnemonic(),
        Mnemonic::Syscall
            | Mnemonic::Sysenter
            | Mnemonic::Sysret
            | Mnemonic::Sysretq
            | Mnemonic::Sysexit
            | Mnemonic::Sysexitq
            | Mnemonic::Popf
            | Mnemonic::Popfd
            | Mnemonic::Popfq
            | Mnemonic::Iret
            | Mnemonic::Iretd
            | Mnemonic::Iretq
    );
    Some(Decoded {
        len: insn.len(),
        flow,
        flushes_tlb,
        clears_tf,
        iretq: insn.mnemonic() == Mnemonic::Iretq,
        enables_interrupts: matches!(
            insn.mnemonic(),
            Mnemonic::Sti
                | Mnemonic::Iret
                | Mnemonic::Iretd
                | Mnemonic::Iretq
                | Mnemonic::Popf
                | Mnemonic::Popfd
                | Mnemonic::Popfq
        ),
    })
}

fn is_string_op(m: Mnemonic) -> bool {
    matches!(
        m,
        Mnemonic::Movsb
            | Mnemonic::Movsw
            | Mnemonic::Movsd
            | Mnemonic::Movsq
            | Mnemonic::Stosb
            | Mnemonic::Stosw
            | Mnemonic::Stosd
            | Mnemonic::Stosq
            | Mnemonic::Lodsb
            | Mnemonic::Lodsw
            | Mnemonic::Lodsd
            | Mnemonic::Lodsq
            | Mnemonic::Scasb
            | Mnemonic::Scasw
            | Mnemonic::Scasd
            | Mnemonic::Scasq
            | Mnemonic::Cmpsb
            | Mnemonic::Cmpsw
            | Mnemonic::Cmpsd
            | Mnemonic::Cmpsq
            | Mnemonic::Insb
            | Mnemonic::Insw
            | Mnemonic::Insd
            | Mnemonic::Outsb
            | Mnemonic::Outsw
            | Mnemonic::Outsd
    )
}

impl Decoded {
    /// Whether execution going from `pc` to `next` is what this instruction does.
    pub fn explains(&self, pc: u64, next: u64) -> bool {
        let fall = pc.wrapping_add(self.len as u64);
        match self.flow {
            Flow::Next | Flow::Halt => next == fall,
            Flow::Repeat => next == fall || next == pc,
            Flow::Jump(t) => next == t,
            Flow::Branch(t) => next == t || next == fall,
            Flow::Any => true,
            Flow::Trap => false,
        }
    }

    /// Where execution was expected to go (for a gap record).
    pub fn expected(&self, pc: u64) -> u64 {
        match self.flow {
            Flow::Jump(t) => t,
            _ => pc.wrapping_add(self.len as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_control_flow() {
        assert_eq!(decode(&[0x90], 64, 0x10).unwrap().flow, Flow::Next);
        assert_eq!(decode(&[0xf4], 64, 0x10).unwrap().flow, Flow::Halt);
        assert_eq!(
            decode(&[0xeb, 0xfe], 64, 0x10).unwrap().flow,
            Flow::Jump(0x10)
        );
        assert_eq!(
            decode(&[0x74, 0x02], 64, 0x10).unwrap().flow,
            Flow::Branch(0x14)
        );
        assert_eq!(
            decode(&[0xe8, 0, 0, 0, 0], 64, 0x10).unwrap().flow,
            Flow::Jump(0x15)
        );
        assert_eq!(decode(&[0xc3], 64, 0x10).unwrap().flow, Flow::Any);
        assert_eq!(
            decode(&[0xff, 0xe0], 64, 0x10).unwrap().flow,
            Flow::Any,
            "jmp rax"
        );
        assert_eq!(
            decode(&[0xf3, 0xa4], 64, 0x10).unwrap().flow,
            Flow::Repeat,
            "rep movsb"
        );
        assert_eq!(
            decode(&[0xf3, 0x90], 64, 0x10).unwrap().flow,
            Flow::Next,
            "pause"
        );
        assert!(
            decode(&[0x0f, 0x01, 0x38], 64, 0).unwrap().flushes_tlb,
            "invlpg [rax]"
        );
        assert!(
            decode(&[0x0f, 0x22, 0xd8], 64, 0).unwrap().flushes_tlb,
            "mov cr3, rax"
        );
        assert!(decode(&[0x48, 0xcf], 64, 0).unwrap().clears_tf, "iretq");
        assert!(decode(&[0x9d], 64, 0).unwrap().clears_tf, "popfq");
        assert!(decode(&[0x0f, 0x05], 64, 0).unwrap().clears_tf, "syscall");
        assert!(!decode(&[0x90], 64, 0).unwrap().clears_tf);
        assert_eq!(
            decode(&[0x0f, 0x0b], 64, 0).unwrap().flow,
            Flow::Trap,
            "ud2"
        );
        assert!(decode(&[0x0f, 0xff], 64, 0).is_none() || decode(&[0x0f, 0xff], 64, 0).is_some());
    }

    #[test]
    fn explains_next_pcs() {
        let jz = decode(&[0x74, 0x02], 64, 0x10).unwrap();
        assert!(jz.explains(0x10, 0x12) && jz.explains(0x10, 0x14));
        assert!(!jz.explains(0x10, 0x20));
        let rep = decode(&[0xf3, 0xaa], 64, 0x10).unwrap();
        assert!(rep.explains(0x10, 0x10) && rep.explains(0x10, 0x12));
        assert_eq!(
            decode(&[0x90], 16, 0x7c00).unwrap().expected(0x7c00),
            0x7c01
        );
    }
}
