//! Conversions between vtrace's registers and KVM's, for the VMM: one a
//! field-by-field build, the other a plain copy, as the layouts agree (the
//! assertions below keep them agreeing).

use kvm_bindings::{kvm_dtable, kvm_regs, kvm_segment, kvm_sregs};

use crate::registers::{DescriptorTable, Registers, Segment, SpecialRegisters};

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
    #[inline]
    fn from(r: &kvm_regs) -> Self {
        general_registers!(Registers from r)
    }
}

impl From<&Registers> for kvm_regs {
    #[inline]
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

impl From<&SpecialRegisters> for kvm_sregs {
    /// The copy back (a hand-over from the engine to KVM).
    #[inline]
    fn from(s: &SpecialRegisters) -> Self {
        // SAFETY: as above, the other way round: the layouts agree and
        // every bit pattern is a valid kvm_sregs.
        unsafe { std::ptr::read((s as *const SpecialRegisters).cast::<kvm_sregs>()) }
    }
}

// What makes the copies above sound: every field at KVM's offset.
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
        assert_eq!(kvm_sregs::from(&s), kvm, "and back, as it was");
    }
}
