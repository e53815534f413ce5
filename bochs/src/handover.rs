//! vtrace's own view of a CPU's registers (`vtrace-x86`'s, which KVM's are
//! copied into) and the engine's state, one into the other: what a
//! hand-over between stepping and the engine moves of them.

use vtrace_x86::{DescriptorTable, Registers, Segment as X86Segment, SpecialRegisters};

use crate::{Segment, State};

/// A segment's attributes as the engine keeps them: VMX's access rights
/// (type, S, DPL, P in bits 0-7; AVL, L, D/B, G in bits 12-15). An
/// unusable segment (KVM's null data segments in 64-bit mode) is one not
/// present.
fn to_engine(s: &X86Segment) -> Segment {
    let present = s.present != 0 && s.unusable == 0;
    let bit = |v: u8, at: u16| u16::from(v & 1) << at;
    Segment {
        base: s.base,
        limit: s.limit,
        selector: s.selector,
        attributes: u16::from(s.type_ & 0xf)
            | bit(s.s, 4)
            | (u16::from(s.dpl & 3) << 5)
            | (u16::from(present) << 7)
            | bit(s.avl, 12)
            | bit(s.l, 13)
            | bit(s.db, 14)
            | bit(s.g, 15),
    }
}

/// The inverse of [`to_engine`]: a segment not present is unusable.
fn from_engine(s: &Segment) -> X86Segment {
    let a = s.attributes;
    let bit = |at: u16| ((a >> at) & 1) as u8;
    let mut out = X86Segment::default();
    out.base = s.base;
    out.limit = s.limit;
    out.selector = s.selector;
    out.type_ = (a & 0xf) as u8;
    out.s = bit(4);
    out.dpl = ((a >> 5) & 3) as u8;
    out.present = bit(7);
    out.avl = bit(12);
    out.l = bit(13);
    out.db = bit(14);
    out.g = bit(15);
    out.unusable = u8::from(out.present == 0);
    out
}

/// `base` with the registers `regs` and `sregs` hold: the general
/// registers, RIP, RFLAGS, the segments with their hidden parts, the
/// descriptor tables, the control registers, EFER and IA32_APIC_BASE. The
/// rest of `base` (MSRs, debug, x87 and SSE registers, the activity) stays.
pub fn state_of(regs: &Registers, sregs: &SpecialRegisters, base: State) -> State {
    let mut state = base;
    // RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8-R15: the encoding's order.
    state.gpr = [
        regs.rax, regs.rcx, regs.rdx, regs.rbx, regs.rsp, regs.rbp, regs.rsi, regs.rdi, regs.r8,
        regs.r9, regs.r10, regs.r11, regs.r12, regs.r13, regs.r14, regs.r15,
    ];
    state.rip = regs.rip;
    state.rflags = regs.rflags;
    let segments = [
        &sregs.es, &sregs.cs, &sregs.ss, &sregs.ds, &sregs.fs, &sregs.gs, &sregs.ldt, &sregs.tr,
    ];
    for (to, from) in state.seg.iter_mut().zip(segments) {
        *to = to_engine(from);
    }
    state.gdt_base = sregs.gdt.base;
    state.gdt_limit = sregs.gdt.limit;
    state.idt_base = sregs.idt.base;
    state.idt_limit = sregs.idt.limit;
    state.cr0 = sregs.cr0;
    state.cr2 = sregs.cr2;
    state.cr3 = sregs.cr3;
    state.cr4 = sregs.cr4;
    state.efer = sregs.efer;
    state.msrs.apic_base = sregs.apic_base;
    state
}

/// The general registers, RIP and RFLAGS `state` holds, in vtrace's own
/// view (a host that has the system registers already converts only
/// these).
pub fn general_registers_of(state: &State) -> Registers {
    let g = &state.gpr;
    Registers {
        rax: g[0],
        rcx: g[1],
        rdx: g[2],
        rbx: g[3],
        rsp: g[4],
        rbp: g[5],
        rsi: g[6],
        rdi: g[7],
        r8: g[8],
        r9: g[9],
        r10: g[10],
        r11: g[11],
        r12: g[12],
        r13: g[13],
        r14: g[14],
        r15: g[15],
        rip: state.rip,
        rflags: state.rflags,
    }
}

/// The registers `state` holds, in vtrace's own view (CR8 and the pending
/// interrupt bitmap are the host's local APIC's, so zero here).
pub fn registers_of(state: &State) -> (Registers, SpecialRegisters) {
    let regs = general_registers_of(state);
    let table = |base, limit| {
        let mut t = DescriptorTable::default();
        t.base = base;
        t.limit = limit;
        t
    };
    let s = |i: usize| from_engine(&state.seg[i]);
    let sregs = SpecialRegisters {
        es: s(0),
        cs: s(1),
        ss: s(2),
        ds: s(3),
        fs: s(4),
        gs: s(5),
        ldt: s(6),
        tr: s(7),
        gdt: table(state.gdt_base, state.gdt_limit),
        idt: table(state.idt_base, state.idt_limit),
        cr0: state.cr0,
        cr2: state.cr2,
        cr3: state.cr3,
        cr4: state.cr4,
        cr8: 0,
        efer: state.efer,
        apic_base: state.msrs.apic_base,
        interrupt_bitmap: [0; 4],
    };
    (regs, sregs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(selector: u16, type_: u8, l: u8, db: u8) -> X86Segment {
        let mut s = X86Segment::default();
        s.limit = u32::MAX;
        s.selector = selector;
        s.type_ = type_;
        s.present = 1;
        s.s = 1;
        s.l = l;
        s.db = db;
        s.g = 1;
        s
    }

    /// A 64-bit kernel's registers, as KVM gives them.
    fn kernel() -> (Registers, SpecialRegisters) {
        let regs = Registers {
            rax: 1,
            rcx: 2,
            rdx: 3,
            rbx: 4,
            rsp: 5,
            rbp: 6,
            rsi: 7,
            rdi: 8,
            r8: 9,
            r15: 16,
            rip: 0xffff_ffff_8100_0000,
            rflags: 0x246,
            ..Registers::default()
        };
        // A null data segment in 64-bit mode: unusable.
        let mut null = X86Segment::default();
        null.unusable = 1;
        let mut gs = segment(0, 0x3, 0, 1);
        gs.base = 0xffff_8880_0000_0000;
        let mut tr = segment(0x40, 0xb, 0, 0);
        (tr.s, tr.g, tr.limit) = (0, 0, 0x4087);
        let table = |base, limit| {
            let mut t = DescriptorTable::default();
            (t.base, t.limit) = (base, limit);
            t
        };
        let sregs = SpecialRegisters {
            cs: segment(0x10, 0xb, 1, 0),
            ss: segment(0x18, 0x3, 0, 1),
            ds: null,
            es: null,
            fs: null,
            gs,
            tr,
            ldt: null,
            gdt: table(0xffff_fe00_0000_1000, 0x7f),
            idt: table(0xffff_fe00_0000_0000, 0xfff),
            cr0: 0x8005_0033,
            cr3: 0x1_0000,
            cr4: 0x3606e0,
            efer: 0xd01,
            apic_base: 0xfee0_0900,
            ..SpecialRegisters::default()
        };
        (regs, sregs)
    }

    #[test]
    fn registers_go_into_the_engine_in_its_order_and_come_back_as_they_were() {
        let (regs, sregs) = kernel();
        let state = state_of(&regs, &sregs, State::default());
        assert_eq!(&state.gpr[..9], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(state.gpr[15], 16);
        // ES, CS, SS, DS, FS, GS, LDTR, TR.
        assert_eq!(state.seg[1].attributes, 0xa09b, "a 64-bit code segment");
        assert_eq!(state.seg[2].attributes, 0xc093, "flat data");
        assert_eq!(state.seg[3].attributes & 0x80, 0, "unusable: not present");
        assert_eq!(state.seg[7].attributes, 0x008b, "a busy 64-bit TSS");
        assert_eq!(state.msrs.apic_base, 0xfee0_0900);
        assert_eq!(registers_of(&state), (regs, sregs));
    }

    #[test]
    fn what_the_registers_do_not_hold_stays_as_it_was() {
        let (regs, sregs) = kernel();
        let mut base = State::default();
        base.msrs.lstar = 0xffff_ffff_8100_0040;
        base.fpu.mxcsr = 0x1f80;
        base.activity = 1;
        let state = state_of(&regs, &sregs, base);
        assert_eq!(
            (state.msrs.lstar, state.fpu.mxcsr, state.activity),
            (0xffff_ffff_8100_0040, 0x1f80, 1)
        );
    }
}
