//! The vCPU's registers as the tracer sees them: vtrace's own types, so a
//! monitor needs nothing of KVM's ABI (`kvm_regs`, `kvm_sregs`). The VMM
//! converts at the [`crate::CpuView`] boundary; the general registers keep
//! `kvm_regs`' layout, so that conversion is a plain copy.

use iced_x86::Register;
use kvm_bindings::{kvm_dtable, kvm_regs, kvm_segment, kvm_sregs};

use super::{cr0, efer};

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
/// loaded), as far as a tracer uses it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    /// Base address.
    pub base: u64,
    /// Limit, in bytes.
    pub limit: u32,
    /// The visible selector.
    pub selector: u16,
    /// Descriptor privilege level.
    pub dpl: u8,
    /// The L bit: 64-bit code (CS only).
    pub l: bool,
    /// The D/B bit: 32-bit default operand size (CS) or stack (SS).
    pub db: bool,
}

/// The IDT or GDT register.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DescriptorTable {
    /// Linear address of the table.
    pub base: u64,
    /// Its last byte's offset.
    pub limit: u16,
}

/// The system registers a tracer reads: segments, descriptor tables,
/// control registers and EFER.
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
    pub gdt: DescriptorTable,
    pub idt: DescriptorTable,
    pub cr0: u64,
    pub cr2: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub efer: u64,
}

impl SpecialRegisters {
    /// Code size of the mode CS is in: 16, 32 or 64 bits (what a decoder
    /// needs).
    pub fn code_bits(&self) -> u32 {
        if self.efer & efer::LMA != 0 && self.cs.l {
            64
        } else if self.cr0 & cr0::PE != 0 && self.cs.db {
            32
        } else {
            16
        }
    }

    /// The current privilege level (0 in real mode).
    pub fn cpl(&self) -> u8 {
        if self.cr0 & cr0::PE == 0 {
            0
        } else {
            (self.cs.selector & 3) as u8
        }
    }
}

/// Builds `$to` from `$from` field by field: the general registers have
/// the same names on both sides.
macro_rules! general_registers {
    ($to:ident from $from:ident) => {
        $to {
            rax: $from.rax,
            rbx: $from.rbx,
            rcx: $from.rcx,
            rdx: $from.rdx,
            rsi: $from.rsi,
            rdi: $from.rdi,
            rsp: $from.rsp,
            rbp: $from.rbp,
            r8: $from.r8,
            r9: $from.r9,
            r10: $from.r10,
            r11: $from.r11,
            r12: $from.r12,
            r13: $from.r13,
            r14: $from.r14,
            r15: $from.r15,
            rip: $from.rip,
            rflags: $from.rflags,
        }
    };
}

impl From<&kvm_regs> for Registers {
    fn from(r: &kvm_regs) -> Self {
        general_registers!(Registers from r)
    }
}

impl From<&Registers> for kvm_regs {
    fn from(r: &Registers) -> Self {
        general_registers!(kvm_regs from r)
    }
}

impl From<&kvm_segment> for Segment {
    fn from(s: &kvm_segment) -> Self {
        Segment {
            base: s.base,
            limit: s.limit,
            selector: s.selector,
            dpl: s.dpl,
            l: s.l != 0,
            db: s.db != 0,
        }
    }
}

impl From<&kvm_dtable> for DescriptorTable {
    fn from(t: &kvm_dtable) -> Self {
        DescriptorTable {
            base: t.base,
            limit: t.limit,
        }
    }
}

impl From<&kvm_sregs> for SpecialRegisters {
    fn from(s: &kvm_sregs) -> Self {
        SpecialRegisters {
            cs: (&s.cs).into(),
            ds: (&s.ds).into(),
            es: (&s.es).into(),
            fs: (&s.fs).into(),
            gs: (&s.gs).into(),
            ss: (&s.ss).into(),
            tr: (&s.tr).into(),
            gdt: (&s.gdt).into(),
            idt: (&s.idt).into(),
            cr0: s.cr0,
            cr2: s.cr2,
            cr3: s.cr3,
            cr4: s.cr4,
            efer: s.efer,
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
    fn kvm_registers_convert_both_ways() {
        let kvm = kvm_regs {
            rax: 1,
            r15: 15,
            rip: 0x1000,
            rflags: 0x202,
            ..Default::default()
        };
        let ours = Registers::from(&kvm);
        assert_eq!(
            (ours.rax, ours.r15, ours.rip, ours.rflags),
            (1, 15, 0x1000, 0x202)
        );
        assert_eq!(kvm_regs::from(&ours), kvm);
    }

    #[test]
    fn modes_and_privilege_from_the_system_registers() {
        let mut s = SpecialRegisters::default();
        assert_eq!((s.code_bits(), s.cpl()), (16, 0), "real mode");
        s.cs.selector = 3;
        assert_eq!(s.cpl(), 0, "real mode has no privilege levels");
        s.cr0 = cr0::PE;
        s.cs.db = true;
        assert_eq!((s.code_bits(), s.cpl()), (32, 3));
        s.efer = efer::LMA | efer::LME;
        s.cs.l = true;
        assert_eq!(s.code_bits(), 64);
    }
}
