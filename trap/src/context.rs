//! The CPU mode and privilege a step runs in, from the system registers.

use vtrace_storage::CpuMode;
use vtrace_x86::SpecialRegisters;

use vtrace_x86::cr0::PE as CR0_PE;
use vtrace_x86::efer::LMA as EFER_LMA;

/// Mode of the code segment as the CPU would decode with it.
pub fn cpu_mode(sregs: &SpecialRegisters) -> CpuMode {
    if sregs.cr0 & CR0_PE == 0 {
        CpuMode::Real
    } else if sregs.efer & EFER_LMA != 0 {
        if sregs.cs.l != 0 {
            CpuMode::Long64
        } else {
            CpuMode::Compat32
        }
    } else if sregs.cs.db != 0 {
        CpuMode::Protected32
    } else {
        CpuMode::Protected16
    }
}

/// Linear address of CS:IP.
pub fn linear_pc(sregs: &SpecialRegisters, rip: u64) -> u64 {
    match cpu_mode(sregs) {
        CpuMode::Long64 => rip,
        CpuMode::Real => (sregs.cs.base + (rip & 0xffff)) & 0xf_ffff,
        _ => sregs.cs.base.wrapping_add(rip) & 0xffff_ffff,
    }
}
