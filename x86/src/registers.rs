//! A CPU's registers as vtrace's tracer, debugger and engines see them:
//! vtrace's own types, so that none of them needs KVM's ABI. The types keep
//! `kvm_regs`' and `kvm_sregs`' layouts, so that the VMM's conversion (the
//! `kvm` feature) is a plain copy.

use iced_x86::Register;

use crate::facts::{cr0, efer};

/// The general registers, RIP and RFLAGS.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // The registers' own names.
pub struct Registers {
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rsp: u64,
    pub rbp: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
    pub rip: u64,
    pub rflags: u64,
}

impl Registers {
    /// The value of general register `reg` (or RIP) at its width, named
    /// as iced-x86 names operands; `None` for other registers. The high
    /// byte registers (AH...) read as their full register's low byte: no
    /// address or branch target is ever made of them.
    #[inline]
    pub fn value(&self, reg: Register) -> Option<u64> {
        let v = match reg.full_register() {
            Register::RAX => self.rax,
            Register::RBX => self.rbx,
            Register::RCX => self.rcx,
            Register::RDX => self.rdx,
            Register::RSI => self.rsi,
            Register::RDI => self.rdi,
            Register::RBP => self.rbp,
            Register::RSP => self.rsp,
            Register::R8 => self.r8,
            Register::R9 => self.r9,
            Register::R10 => self.r10,
            Register::R11 => self.r11,
            Register::R12 => self.r12,
            Register::R13 => self.r13,
            Register::R14 => self.r14,
            Register::R15 => self.r15,
            Register::RIP => self.rip,
            _ => return None,
        };
        let bits = reg.size() * 8;
        Some(if bits >= 64 {
            v
        } else {
            v & ((1u64 << bits) - 1)
        })
    }
}

/// A segment register with its hidden part (the descriptor the CPU
/// loaded). It keeps `kvm_segment`'s layout, flags as bytes (1 set, 0
/// clear), so that the conversion at every exit is a plain copy: with
/// `bool` flags it was some 180 instructions an exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    /// Base address.
    pub base: u64,
    /// Limit, in bytes.
    pub limit: u32,
    /// The visible selector.
    pub selector: u16,
    /// The descriptor's type field.
    pub type_: u8,
    /// The P bit.
    pub present: u8,
    /// Descriptor privilege level.
    pub dpl: u8,
    /// The D/B bit: 32-bit default operand size (CS) or stack (SS).
    pub db: u8,
    /// The S bit: a code or data segment, not a system one.
    pub s: u8,
    /// The L bit: 64-bit code (CS only).
    pub l: u8,
    /// The G bit: the limit counts 4 KiB units.
    pub g: u8,
    /// The AVL bit.
    pub avl: u8,
    /// The segment is unusable (a null selector was loaded).
    pub unusable: u8,
    pub(crate) padding: u8,
}

/// The IDT or GDT register.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DescriptorTable {
    /// Linear address of the table.
    pub base: u64,
    /// Its last byte's offset.
    pub limit: u16,
    pub(crate) padding: [u16; 3],
}

/// The system registers: segments, descriptor tables, control registers
/// and EFER, in `kvm_sregs`' layout (see [`Segment`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)] // The registers' own names.
pub struct SpecialRegisters {
    pub cs: Segment,
    pub ds: Segment,
    pub es: Segment,
    pub fs: Segment,
    pub gs: Segment,
    pub ss: Segment,
    pub tr: Segment,
    pub ldt: Segment,
    pub gdt: DescriptorTable,
    pub idt: DescriptorTable,
    pub cr0: u64,
    pub cr2: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub cr8: u64,
    pub efer: u64,
    pub apic_base: u64,
    /// Interrupts KVM has pending (one bit a vector).
    pub interrupt_bitmap: [u64; 4],
}

impl SpecialRegisters {
    /// Code size of the mode CS is in: 16, 32 or 64 bits (what a decoder
    /// needs).
    #[inline]
    pub fn code_bits(&self) -> u32 {
        if self.efer & efer::LMA != 0 && self.cs.l != 0 {
            64
        } else if self.cr0 & cr0::PE != 0 && self.cs.db != 0 {
            32
        } else {
            16
        }
    }

    /// The current privilege level (0 in real mode).
    #[inline]
    pub fn cpl(&self) -> u8 {
        if self.cr0 & cr0::PE == 0 {
            0
        } else {
            (self.cs.selector & 3) as u8
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_register_reads_at_its_width() {
        let regs = Registers {
            rax: 0x1122_3344_5566_7788,
            rip: 0x40_1000,
            ..Default::default()
        };
        assert_eq!(regs.value(Register::RAX), Some(0x1122_3344_5566_7788));
        assert_eq!(regs.value(Register::EAX), Some(0x5566_7788));
        assert_eq!(regs.value(Register::AX), Some(0x7788));
        assert_eq!(regs.value(Register::RIP), Some(0x40_1000));
        assert_eq!(regs.value(Register::XMM0), None);
    }

    #[test]
    fn modes_and_privilege_from_the_system_registers() {
        let mut s = SpecialRegisters::default();
        assert_eq!((s.code_bits(), s.cpl()), (16, 0), "real mode");
        s.cs.selector = 3;
        assert_eq!(s.cpl(), 0, "real mode has no privilege levels");
        s.cr0 = cr0::PE;
        s.cs.db = 1;
        assert_eq!((s.code_bits(), s.cpl()), (32, 3));
        s.efer = efer::LMA | efer::LME;
        s.cs.l = 1;
        assert_eq!(s.code_bits(), 64);
    }
}
