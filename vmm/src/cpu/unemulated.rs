//! Instructions KVM's emulator gives up on that the VMM can complete itself
//! on hosts where kernel code is emulated: software interrupts (delivered
//! through the guest IDT, see [`super::soft_int`]), FWAIT, and the MXCSR
//! loads and stores that Linux's `kernel_fpu_begin` uses. Anything else
//! stays an emulation failure for the user to see.

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use kvm_bindings::{kvm_fpu, kvm_regs, kvm_sregs};

use super::soft_int::{self, SoftIntError};
use crate::memory::LinearMemory;
use vtrace_x86::Registers;

/// Vector of the x87 floating-point error (#MF).
const VECTOR_MF: u8 = 16;
/// x87 status word: exception summary (an unmasked exception is pending).
const X87_FSW_ES: u16 = 0x80;
const RFLAGS_OF: u64 = 1 << 11;

/// What the VMM must do to complete the instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// Deliver `vector` through the IDT, returning to `return_rip`.
    Interrupt { vector: u8, return_rip: u64 },
    /// Skip the instruction (it had no effect).
    Skip { next_rip: u64 },
    /// Load MXCSR from guest memory at `addr`.
    LoadMxcsr { addr: u64, next_rip: u64 },
    /// Store MXCSR to guest memory at `addr`.
    StoreMxcsr { addr: u64, next_rip: u64 },
}

/// Why an instruction could not be completed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompleteError {
    #[error(transparent)]
    Interrupt(#[from] SoftIntError),
    #[error("guest address {0:#x} is not mapped")]
    Unmapped(u64),
    #[error("MXCSR value {0:#x} sets reserved bits (the CPU would raise #GP)")]
    ReservedMxcsr(u32),
}

/// Decides how to complete the instruction in `code` at `regs.rip`.
pub fn plan(code: &[u8], bitness: u32, regs: &kvm_regs, sregs: &kvm_sregs) -> Option<Completion> {
    let mut decoder = Decoder::with_ip(bitness, code, regs.rip, DecoderOptions::NONE);
    let insn: Instruction = decoder.decode();
    if insn.is_invalid() {
        return None;
    }
    let next_rip = insn.next_ip();
    let memory = |insn: &Instruction| {
        if insn.op0_kind() != OpKind::Memory {
            return None;
        }
        let segment_base = match insn.memory_segment() {
            Register::FS => sregs.fs.base,
            Register::GS => sregs.gs.base,
            Register::SS => sregs.ss.base,
            Register::ES => sregs.es.base,
            Register::CS => sregs.cs.base,
            _ => sregs.ds.base,
        };
        let view = Registers::from(regs);
        let offset = insn.virtual_address(0, 0, |reg, _, _| match reg {
            Register::FS
            | Register::GS
            | Register::SS
            | Register::ES
            | Register::CS
            | Register::DS => Some(0),
            r => view.value(r),
        })?;
        Some(segment_base.wrapping_add(offset))
    };
    Some(match insn.mnemonic() {
        Mnemonic::Int3 => Completion::Interrupt {
            vector: 3,
            return_rip: next_rip,
        },
        Mnemonic::Int1 => Completion::Interrupt {
            vector: 1,
            return_rip: next_rip,
        },
        Mnemonic::Int => Completion::Interrupt {
            vector: insn.immediate8(),
            return_rip: next_rip,
        },
        Mnemonic::Into if regs.rflags & RFLAGS_OF != 0 => Completion::Interrupt {
            vector: 4,
            return_rip: next_rip,
        },
        Mnemonic::Into => Completion::Skip { next_rip },
        Mnemonic::Wait => Completion::Skip { next_rip },
        Mnemonic::Ldmxcsr => Completion::LoadMxcsr {
            addr: memory(&insn)?,
            next_rip,
        },
        Mnemonic::Stmxcsr => Completion::StoreMxcsr {
            addr: memory(&insn)?,
            next_rip,
        },
        _ => return None,
    })
}

/// Carries out `plan` on the register images; the caller writes them back.
/// `fpu` is read and changed for FWAIT and the MXCSR instructions. Returns
/// the vector when the completion delivered an interrupt.
pub fn complete(
    plan: Completion,
    mem: &dyn LinearMemory,
    regs: &mut kvm_regs,
    sregs: &mut kvm_sregs,
    fpu: &mut kvm_fpu,
) -> Result<Option<u8>, CompleteError> {
    match plan {
        // FWAIT acts only on a pending unmasked x87 exception: #MF, a fault
        // that returns to the FWAIT itself.
        Completion::Skip { .. } if fpu.fsw & X87_FSW_ES != 0 => {
            soft_int::deliver(mem, regs, sregs, VECTOR_MF, regs.rip)?;
            return Ok(Some(VECTOR_MF));
        }
        Completion::Skip { next_rip } => regs.rip = next_rip,
        Completion::Interrupt { vector, return_rip } => {
            soft_int::deliver(mem, regs, sregs, vector, return_rip)?;
            return Ok(Some(vector));
        }
        Completion::LoadMxcsr { addr, next_rip } => {
            let mut b = [0u8; 4];
            mem.read(addr, &mut b).map_err(CompleteError::Unmapped)?;
            let value = u32::from_le_bytes(b);
            // Bits above 15 are reserved (MXCSR_MASK on every CPU that has
            // SSE2 allows 0..15, DAZ included).
            if value >> 16 != 0 {
                return Err(CompleteError::ReservedMxcsr(value));
            }
            fpu.mxcsr = value;
            regs.rip = next_rip;
        }
        Completion::StoreMxcsr { addr, next_rip } => {
            mem.write(addr, &fpu.mxcsr.to_le_bytes())
                .map_err(CompleteError::Unmapped)?;
            regs.rip = next_rip;
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs(rip: u64) -> kvm_regs {
        kvm_regs {
            rip,
            rsp: 0x8000,
            rbx: 0x100,
            ..Default::default()
        }
    }

    #[test]
    fn plans_each_instruction() {
        let s = kvm_sregs::default();
        assert_eq!(
            plan(&[0xcc], 64, &regs(0x10), &s),
            Some(Completion::Interrupt {
                vector: 3,
                return_rip: 0x11
            })
        );
        assert_eq!(
            plan(&[0xcd, 0x80], 64, &regs(0x10), &s),
            Some(Completion::Interrupt {
                vector: 0x80,
                return_rip: 0x12
            })
        );
        assert_eq!(
            plan(&[0x9b], 64, &regs(0x10), &s),
            Some(Completion::Skip { next_rip: 0x11 })
        );
        // ldmxcsr [rsp+4]
        assert_eq!(
            plan(&[0x0f, 0xae, 0x54, 0x24, 0x04], 64, &regs(0x10), &s),
            Some(Completion::LoadMxcsr {
                addr: 0x8004,
                next_rip: 0x15
            })
        );
        // stmxcsr [rbx]
        assert_eq!(
            plan(&[0x0f, 0xae, 0x1b], 64, &regs(0x10), &s),
            Some(Completion::StoreMxcsr {
                addr: 0x100,
                next_rip: 0x13
            })
        );
        assert_eq!(plan(&[0x90], 64, &regs(0x10), &s), None);
    }

    #[test]
    fn fs_relative_operands_use_the_segment_base() {
        let mut s = kvm_sregs::default();
        s.fs.base = 0x7000_0000;
        // stmxcsr fs:[rbx]
        assert_eq!(
            plan(&[0x64, 0x0f, 0xae, 0x1b], 64, &regs(0), &s),
            Some(Completion::StoreMxcsr {
                addr: 0x7000_0100,
                next_rip: 4
            })
        );
    }
}
