//! The vCPU's registers as the tracer sees them: vtrace's own types, so a
//! monitor needs nothing of KVM's ABI (`kvm_regs`, `kvm_sregs`). The VMM
//! converts at the [`crate::CpuView`] boundary; the types keep `kvm_regs`'
//! and `kvm_sregs`' layouts, so that conversion is a plain copy.

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
    padding: u8,
}

/// The IDT or GDT register.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DescriptorTable {
    /// Linear address of the table.
    pub base: u64,
    /// Its last byte's offset.
    pub limit: u16,
    padding: [u16; 3],
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

impl From<&kvm_sregs> for SpecialRegisters {
    /// A copy: field by field it was some 120 instructions an exit, the
    /// flags being bytes.
    #[inline]
    fn from(s: &kvm_sregs) -> Self {
        // SAFETY: SpecialRegisters is repr(C) and has kvm_sregs' fields,
        // in its order and of its types (same size, alignment and offsets,
        // asserted below), and every bit pattern is a valid value of them
        // all; `s` is a reference, so valid and aligned.
        unsafe { std::ptr::read((s as *const kvm_sregs).cast::<SpecialRegisters>()) }
    }
}

// What makes the copy above sound: every field at KVM's offset.
macro_rules! same_offsets {
    ($ours:ty, $kvm:ty: $($field:ident),+) => {
        $(assert!(std::mem::offset_of!($ours, $field) == std::mem::offset_of!($kvm, $field));)+
    };
}
const _: () = {
    use std::mem::{align_of, size_of};
    assert!(size_of::<SpecialRegisters>() == size_of::<kvm_sregs>());
    assert!(align_of::<SpecialRegisters>() == align_of::<kvm_sregs>());
    assert!(size_of::<Segment>() == size_of::<kvm_segment>());
    assert!(size_of::<DescriptorTable>() == size_of::<kvm_dtable>());
    same_offsets!(Segment, kvm_segment: base, limit, selector, type_, present, dpl, db, s, l, g,
        avl, unusable, padding);
    same_offsets!(DescriptorTable, kvm_dtable: base, limit, padding);
    same_offsets!(SpecialRegisters, kvm_sregs: cs, ds, es, fs, gs, ss, tr, ldt, gdt, idt, cr0,
        cr2, cr3, cr4, cr8, efer, apic_base, interrupt_bitmap);
};

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
    fn system_registers_copy_from_kvm_field_for_field() {
        let mut kvm = kvm_sregs {
            cs: kvm_segment {
                base: 0x1000,
                limit: 0xffff_ffff,
                selector: 0x33,
                type_: 11,
                present: 1,
                dpl: 3,
                db: 0,
                s: 1,
                l: 1,
                g: 1,
                avl: 0,
                unusable: 0,
                padding: 0,
            },
            gdt: kvm_dtable {
                base: 0xffff_8000_0000_1000,
                limit: 0x7f,
                padding: [0; 3],
            },
            cr0: 0x8005_0033,
            cr2: 0xdead_b000,
            cr3: 0x10_0000,
            cr4: 0x6f0,
            cr8: 2,
            efer: 0xd01,
            apic_base: 0xfee0_0900,
            interrupt_bitmap: [0, 8, 0, 0],
            ..Default::default()
        };
        kvm.fs.base = 0x7fff_0000;
        kvm.tr.selector = 0x40;
        kvm.ldt.unusable = 1;
        kvm.idt.limit = 0xfff;
        let s = SpecialRegisters::from(&kvm);
        let cs = (s.cs.base, s.cs.limit, s.cs.selector, s.cs.type_, s.cs.dpl);
        assert_eq!(cs, (0x1000, 0xffff_ffff, 0x33, 11, 3));
        assert_eq!(
            (s.cs.present, s.cs.db, s.cs.s, s.cs.l, s.cs.g),
            (1, 0, 1, 1, 1)
        );
        assert_eq!(
            (s.fs.base, s.tr.selector, s.ldt.unusable),
            (0x7fff_0000, 0x40, 1)
        );
        assert_eq!(
            (s.gdt.base, s.gdt.limit, s.idt.limit),
            (0xffff_8000_0000_1000, 0x7f, 0xfff)
        );
        assert_eq!(
            (s.cr0, s.cr2, s.cr3, s.cr4),
            (0x8005_0033, 0xdead_b000, 0x10_0000, 0x6f0)
        );
        assert_eq!((s.cr8, s.efer, s.apic_base), (2, 0xd01, 0xfee0_0900));
        assert_eq!(s.interrupt_bitmap, [0, 8, 0, 0]);
        assert_eq!((s.code_bits(), s.cpl()), (64, 3));
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
