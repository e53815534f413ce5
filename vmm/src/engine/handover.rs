//! A hand-over of the CPU between KVM and the engine: what moves, both
//! ways. The registers go through `vtrace-bochs`'s conversions; what KVM
//! keeps in structures of its own (the x87/SSE state with its abridged tag
//! word, the MSRs a kernel uses, the debug registers, XCR0, the interrupt
//! shadow) is converted here.

use kvm_bindings::{kvm_fpu, kvm_sregs};
use vtrace_bochs::{Fpu, State, BLOCKED_BY_MOV_SS, BLOCKED_BY_STI};
use vtrace_x86::{cr4, Registers, SpecialRegisters};

use crate::error::Result;
use crate::vcpu::Vcpu;

/// KVM's interrupt shadow bits (`KVM_X86_SHADOW_INT_*`).
const KVM_SHADOW_MOV_SS: u8 = 1;
const KVM_SHADOW_STI: u8 = 2;

/// The MSRs that move, by index, with where they live in the engine's
/// state.
const MSRS: [u32; 10] = [
    0xc000_0081, // STAR
    0xc000_0082, // LSTAR
    0xc000_0083, // CSTAR
    0xc000_0084, // FMASK
    0xc000_0102, // KERNEL_GS_BASE
    0x174,       // SYSENTER_CS
    0x175,       // SYSENTER_ESP
    0x176,       // SYSENTER_EIP
    0x277,       // PAT
    0xc000_0103, // TSC_AUX
];

fn msr_slot(m: &mut vtrace_bochs::Msrs, i: usize) -> Option<&mut u64> {
    Some(match i {
        0 => &mut m.star,
        1 => &mut m.lstar,
        2 => &mut m.cstar,
        3 => &mut m.fmask,
        4 => &mut m.kernel_gs_base,
        5 => &mut m.sysenter_cs,
        6 => &mut m.sysenter_esp,
        7 => &mut m.sysenter_eip,
        8 => &mut m.pat,
        9 => &mut m.tsc_aux,
        _ => return None,
    })
}

/// The engine's value of MSR `index`, where it is one that moves.
pub(super) fn engine_msr(state: &State, index: u32) -> Option<u64> {
    let i = MSRS.iter().position(|&m| m == index)?;
    let mut msrs = state.msrs;
    msr_slot(&mut msrs, i).map(|v| *v)
}

/// The tag of an x87 register by its contents, as FXRSTOR rebuilds the
/// full tag word from the abridged one: 00 valid, 01 zero, 10 special.
fn tag_of(st: &[u8; 16]) -> u16 {
    let significand = u64::from_le_bytes([st[0], st[1], st[2], st[3], st[4], st[5], st[6], st[7]]);
    let exponent = u16::from_le_bytes([st[8], st[9]]) & 0x7fff;
    match exponent {
        0x7fff => 0b10,
        0 if significand == 0 => 0b01,
        0 => 0b10,
        _ if significand >> 63 == 0 => 0b10,
        _ => 0b00,
    }
}

/// KVM's x87/SSE state in the engine's form: the abridged tag word (a bit
/// a physical register, set where it is not empty) made full.
pub(super) fn fpu_to_engine(f: &kvm_fpu) -> Fpu {
    let top = (f.fsw >> 11) & 7;
    let mut ftw = 0u16;
    for physical in 0..8u16 {
        // ST(i) is physical register (TOP + i) mod 8.
        let st = usize::from((physical + 8 - top) & 7);
        let tag = match (f.ftwx >> physical) & 1 {
            0 => 0b11,
            _ => tag_of(&f.fpr[st]),
        };
        ftw |= tag << (2 * physical);
    }
    Fpu {
        fcw: f.fcw,
        fsw: f.fsw,
        ftw,
        fop: f.last_opcode,
        fip: f.last_ip,
        fdp: f.last_dp,
        fcs: 0,
        fds: 0,
        mxcsr: f.mxcsr,
        st: f.fpr,
        xmm: f.xmm,
    }
}

/// The engine's x87/SSE state in KVM's form (the tag word abridged).
pub(super) fn fpu_to_kvm(f: &Fpu) -> kvm_fpu {
    let mut ftwx = 0u8;
    for physical in 0..8 {
        if (f.ftw >> (2 * physical)) & 0b11 != 0b11 {
            ftwx |= 1 << physical;
        }
    }
    kvm_fpu {
        fpr: f.st,
        fcw: f.fcw,
        fsw: f.fsw,
        ftwx,
        last_opcode: f.fop,
        last_ip: f.fip,
        last_dp: f.fdp,
        xmm: f.xmm,
        mxcsr: f.mxcsr,
        ..Default::default()
    }
}

/// KVM's interrupt shadow in the engine's bits, and back.
pub(super) fn shadow_to_engine(kvm: u8) -> u32 {
    match kvm {
        s if s & KVM_SHADOW_MOV_SS != 0 => BLOCKED_BY_MOV_SS,
        s if s & KVM_SHADOW_STI != 0 => BLOCKED_BY_STI,
        _ => 0,
    }
}

pub(super) fn shadow_to_kvm(engine: u32) -> u8 {
    match engine {
        s if s & BLOCKED_BY_MOV_SS != 0 => KVM_SHADOW_MOV_SS,
        s if s & BLOCKED_BY_STI != 0 => KVM_SHADOW_STI,
        _ => 0,
    }
}

/// The vCPU's whole state in KVM, over `base` (the engine's own state,
/// for what KVM does not hold).
pub(super) fn from_kvm(vcpu: &mut Vcpu, base: State) -> Result<State> {
    let regs: Registers = (&vcpu.regs()).into();
    let sregs = vcpu.special_registers();
    let mut state = vtrace_bochs::state_of(&regs, &sregs, base);
    state.fpu = fpu_to_engine(&vcpu.fpu()?);
    for (i, &index) in MSRS.iter().enumerate() {
        if let (Some(value), Some(slot)) = (vcpu.msr(index), msr_slot(&mut state.msrs, i)) {
            *slot = value;
        }
    }
    state.dr = vcpu.debug_registers()?;
    if sregs.cr4 & cr4::OSXSAVE != 0 {
        state.xcr0 = vcpu.xcr0().unwrap_or(1);
    }
    state.interruptibility = shadow_to_engine(vcpu.interrupt_shadow()?);
    // The VMM waits out a HLT itself: a CPU it enters is running.
    state.activity = vtrace_bochs::Activity::Active as u32;
    Ok(state)
}

/// The engine's state back into KVM.
pub(super) fn to_kvm(state: &State, vcpu: &mut Vcpu) -> Result<()> {
    let (regs, sregs): (Registers, SpecialRegisters) = vtrace_bochs::registers_of(state);
    vcpu.set_sregs(&kvm_sregs::from(&sregs))?;
    vcpu.set_regs(&(&regs).into())?;
    vcpu.set_fpu(&fpu_to_kvm(&state.fpu))?;
    let mut msrs = state.msrs;
    for (i, &index) in MSRS.iter().enumerate() {
        if let Some(value) = msr_slot(&mut msrs, i) {
            if !vcpu.set_msr(index, *value) {
                tracing::debug!(
                    "KVM refused MSR {index:#x} = {:#x} at the hand-over",
                    *value
                );
            }
        }
    }
    vcpu.set_debug_registers(state.dr)?;
    if sregs.cr4 & cr4::OSXSAVE != 0 && !vcpu.set_xcr0(state.xcr0) {
        tracing::debug!("KVM refused XCR0 = {:#x} at the hand-over", state.xcr0);
    }
    vcpu.set_interrupt_shadow(shadow_to_kvm(state.interruptibility))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(significand: u64, exponent: u16) -> [u8; 16] {
        let mut r = [0u8; 16];
        r[..8].copy_from_slice(&significand.to_le_bytes());
        r[8..10].copy_from_slice(&exponent.to_le_bytes());
        r
    }

    #[test]
    fn the_abridged_tag_word_is_made_full_by_what_each_register_holds() {
        // TOP = 6: ST(0) is physical 6, ST(1) physical 7, ST(2) physical 0.
        let mut f = kvm_fpu {
            fsw: 6 << 11,
            ftwx: 0b1100_0001,
            ..Default::default()
        };
        f.fpr[0] = st(1 << 63, 0x3fff); // 1.0: valid
        f.fpr[1] = st(0, 0); // zero
        f.fpr[2] = st(1 << 63, 0x7fff); // infinity: special
        let e = fpu_to_engine(&f);
        // Physical 0 special, 1-5 empty, 6 valid, 7 zero.
        assert_eq!(e.ftw, 0b01_00_11_11_11_11_11_10);
        assert_eq!(fpu_to_kvm(&e), f, "abridged again, it is as it was");
    }

    #[test]
    fn a_denormal_or_unnormal_register_is_special() {
        assert_eq!(tag_of(&st(1, 0)), 0b10, "denormal");
        assert_eq!(tag_of(&st(1, 0x3fff)), 0b10, "unnormal: no integer bit");
        assert_eq!(tag_of(&st(1 << 63, 0x3fff)), 0b00);
    }

    #[test]
    fn shadows_map_both_ways() {
        for (kvm, engine) in [
            (0, 0),
            (KVM_SHADOW_STI, BLOCKED_BY_STI),
            (KVM_SHADOW_MOV_SS, BLOCKED_BY_MOV_SS),
        ] {
            assert_eq!(shadow_to_engine(kvm), engine);
            assert_eq!(shadow_to_kvm(engine), kvm);
        }
    }

    #[test]
    fn the_msrs_that_move_are_read_where_the_engine_keeps_them() {
        let mut state = State::default();
        state.msrs.lstar = 0xffff_ffff_8100_0040;
        state.msrs.tsc_aux = 3;
        assert_eq!(engine_msr(&state, 0xc000_0082), Some(0xffff_ffff_8100_0040));
        assert_eq!(engine_msr(&state, 0xc000_0103), Some(3));
        assert_eq!(engine_msr(&state, 0x10), None, "the TSC is not one");
    }
}
