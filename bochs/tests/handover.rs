//! A hand-over's registers, as vtrace holds KVM's, go into the engine and
//! come back as they were, hidden parts of the segments included; and the
//! guest runs on from them. Needs the engine's library (see long_mode.rs).

mod common;

use vtrace_bochs::{registers_of, state_of, Machine, Stop};
use vtrace_x86::{DescriptorTable, Registers, Segment, SpecialRegisters};

fn flat(selector: u16, type_: u8, l: u8, db: u8) -> Segment {
    let mut s = Segment::default();
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

#[test]
fn kvms_registers_go_into_the_engine_and_come_back_as_they_were() {
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    // inc rax; hlt
    ram[0x10000..0x10004].copy_from_slice(&[0x48, 0xff, 0xc0, 0xf4]);
    let regs = Registers {
        rax: 41,
        rbx: 0xb0b,
        rsp: 0x80000,
        r15: 0xf15,
        rip: 0x10000,
        rflags: 0x202,
        ..Registers::default()
    };
    let mut null = Segment::default();
    null.unusable = 1;
    let mut gs = flat(0, 0x3, 0, 1);
    gs.base = 0xffff_8880_0000_0000;
    let mut tr = flat(0x18, 0xb, 0, 0);
    (tr.s, tr.g, tr.limit) = (0, 0, 0x67);
    let mut gdt = DescriptorTable::default();
    (gdt.base, gdt.limit) = (common::GDT, 23);
    let sregs = SpecialRegisters {
        cs: flat(0x08, 0xb, 1, 0),
        ss: flat(0x10, 0x3, 0, 1),
        ds: null,
        es: null,
        fs: null,
        ldt: null,
        gs,
        tr,
        gdt,
        cr0: 0x8000_0031,
        cr3: 0x1000,
        cr4: 0x20,
        efer: 0x500,
        apic_base: 0xfee0_0900,
        ..SpecialRegisters::default()
    };

    let mut host = common::Quiet;
    let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
    let state = state_of(&regs, &sregs, machine.state(0));
    machine.set_state(0, &state);
    let (back_regs, back_sregs) = registers_of(&machine.state(0));
    assert_eq!(back_regs, regs);
    assert_eq!(back_sregs, sregs);

    assert_eq!(machine.run(&mut host, 0, 10), (Stop::Halt, 2));
    let (after, _) = registers_of(&machine.state(0));
    assert_eq!((after.rax, after.rip), (42, 0x10004));
}
