//! The whole state a hand-over moves, into the engine and back: MSRs,
//! debug registers, XCR0, x87 and SSE registers read back as given, and
//! the guest's instructions see them. Needs the engine's library (see
//! long_mode.rs).

mod common;

use vtrace_bochs::{Machine, Msrs, Stop};

/// 1.0 as an 80-bit register: significand 1 << 63, exponent 0x3fff.
const ONE: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0x80, 0xff, 0x3f, 0, 0, 0, 0, 0, 0];

#[test]
fn the_whole_state_goes_in_reads_back_and_is_what_the_guest_sees() {
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    #[rustfmt::skip]
    let code = [
        0x66, 0x49, 0x0f, 0x7e, 0xd8,             // movq r8, xmm3
        0xb9, 0x82, 0x00, 0x00, 0xc0,             // mov ecx, 0xc0000082 (LSTAR)
        0x0f, 0x32,                               // rdmsr
        0x41, 0x89, 0xc1,                         // mov r9d, eax
        0x41, 0x0f, 0x21, 0xfa,                   // mov r10, dr7
        0xdb, 0x3c, 0x25, 0x00, 0x00, 0x02, 0x00, // fstp tword [0x20000]
        0xf4,                                     // hlt
    ];
    ram[0x10000..0x10000 + code.len()].copy_from_slice(&code);
    let mut host = common::Quiet;
    let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
    let mut state = common::long_mode(machine.state(0), 0x10000, 0x80000);
    state.msrs = Msrs {
        star: 0x0023_0010_0000_0000,
        lstar: 0xffff_ffff_8100_0040,
        cstar: 0xffff_ffff_8100_0080,
        fmask: 0x4_7700,
        kernel_gs_base: 0xffff_8880_0000_1000,
        sysenter_cs: 0x10,
        sysenter_esp: 0x9000,
        sysenter_eip: 0xffff_ffff_8100_00c0,
        pat: 0x0007_0406_0007_0406,
        apic_base: 0xfee0_0900,
        tsc_aux: 3,
    };
    state.dr = [0x1234, 0x5678, 0x9abc, 0xdef0, 0xffff_0ff0, 0x400];
    state.xcr0 = 1;
    // SSE instructions need CR4.OSFXSR.
    state.cr4 |= 0x200;
    state.fpu.fcw = 0x37f;
    state.fpu.ftw = 0xfffc;
    state.fpu.mxcsr = 0x1f80;
    state.fpu.st[0] = ONE;
    state.fpu.xmm[3] = *b"vtrace engine!!!";
    machine.set_state(0, &state);
    let back = machine.state(0);
    assert_eq!(back.msrs, state.msrs);
    assert_eq!(back.dr, state.dr);
    assert_eq!(back.xcr0, 1);
    assert_eq!(back.fpu, state.fpu);
    assert_eq!(back.seg, state.seg);
    assert_eq!(
        (back.gdt_base, back.idt_base),
        (state.gdt_base, state.idt_base)
    );

    assert_eq!(machine.run(&mut host, 0, 100), (Stop::Halt, 7));
    let after = machine.state(0);
    assert_eq!(after.gpr[8].to_le_bytes(), *b"vtrace e", "movq r8, xmm3");
    assert_eq!(after.gpr[9], 0x8100_0040, "rdmsr of LSTAR");
    assert_eq!(after.gpr[10], 0x400, "mov r10, dr7");
    // fstp popped ST(0): TOP moved to 1, R0 is empty.
    assert_eq!((after.fpu.fsw >> 11) & 7, 1);
    assert_eq!(after.fpu.ftw, 0xffff);

    // The core alone moves the registers and leaves the rest as it is.
    let mut core = vtrace_bochs::State::default();
    machine.read_core(0, &mut core);
    assert_eq!(
        (core.gpr, core.rip, core.seg),
        (after.gpr, after.rip, after.seg)
    );
    assert_eq!(
        core.msrs.apic_base, 0xfee0_0900,
        "IA32_APIC_BASE is the core's"
    );
    assert_eq!(core.fpu, vtrace_bochs::Fpu::default(), "not read");
    core.gpr[8] = 88;
    machine.set_core(0, &core);
    let set = machine.state(0);
    assert_eq!(set.gpr[8], 88);
    assert_eq!(
        (set.fpu, set.dr, set.msrs.lstar),
        (after.fpu, after.dr, after.msrs.lstar),
        "kept"
    );
    drop(machine);
    // (Without CR4.OSFXSR the movq is #UD, and with no IDT the CPU shuts
    // down: a triple fault is a stop of its own; see exceptions.rs.)
    assert_eq!(&ram[0x20000..0x2000a], &ONE[..10], "fstp stored 1.0");
}
