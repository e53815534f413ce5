//! Reading the guest's interrupt descriptor table: where a vector's handler
//! starts and where the CPU put the exception frame.

use kvm_bindings::kvm_sregs;
use vtrace_storage::CpuMode;
use vtrace_vmm::CpuView;

use crate::context::cpu_mode;
use crate::walker::Walker;

/// Exceptions for which the CPU pushes an error code.
pub fn has_error_code(vector: u8) -> bool {
    matches!(vector, 8 | 10..=14 | 17 | 21 | 29 | 30)
}

/// A gate: handler address and IST index (long mode; 0 elsewhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gate {
    pub handler: u64,
    pub ist: u8,
}

/// The gate for `vector`, if the IDT has a present one.
pub fn gate(cpu: &dyn CpuView, walker: &mut Walker, sregs: &kvm_sregs, vector: u8) -> Option<Gate> {
    match cpu_mode(sregs) {
        CpuMode::Real => {
            let mut b = [0u8; 4];
            let base = sregs.idt.base + u64::from(vector) * 4;
            (walker.read(cpu, sregs, base, &mut b) == 4).then(|| {
                let off = u64::from(u16::from_le_bytes([b[0], b[1]]));
                let seg = u64::from(u16::from_le_bytes([b[2], b[3]]));
                Gate {
                    handler: (seg << 4) + off,
                    ist: 0,
                }
            })
        }
        CpuMode::Long64 | CpuMode::Compat32 => {
            let at = u64::from(vector) * 16;
            if at + 15 > u64::from(sregs.idt.limit) {
                return None;
            }
            let mut b = [0u8; 16];
            if walker.read(cpu, sregs, sregs.idt.base + at, &mut b) != 16 || b[5] & 0x80 == 0 {
                return None;
            }
            let lo = u64::from(u16::from_le_bytes([b[0], b[1]]));
            let mid = u64::from(u16::from_le_bytes([b[6], b[7]]));
            let hi = u64::from(u32::from_le_bytes([b[8], b[9], b[10], b[11]]));
            Some(Gate {
                handler: lo | mid << 16 | hi << 32,
                ist: b[4] & 7,
            })
        }
        CpuMode::Protected32 | CpuMode::Protected16 => {
            let at = u64::from(vector) * 8;
            if at + 7 > u64::from(sregs.idt.limit) {
                return None;
            }
            let mut b = [0u8; 8];
            if walker.read(cpu, sregs, sregs.idt.base + at, &mut b) != 8 || b[5] & 0x80 == 0 {
                return None;
            }
            let lo = u64::from(u16::from_le_bytes([b[0], b[1]]));
            let hi = u64::from(u16::from_le_bytes([b[6], b[7]]));
            // Flat code segments only: the handler's linear address.
            Some(Gate {
                handler: lo | hi << 16,
                ist: 0,
            })
        }
    }
}

/// The error code an exception pushed, read from the frame the CPU built
/// on top of `old_rsp` (the stack pointer when the exception happened).
pub fn error_code(
    cpu: &dyn CpuView,
    walker: &mut Walker,
    sregs: &kvm_sregs,
    gate: Gate,
    old_rsp: u64,
) -> Option<u32> {
    let slot = match cpu_mode(sregs) {
        CpuMode::Long64 | CpuMode::Compat32 => {
            let top = if gate.ist != 0 {
                let mut b = [0u8; 8];
                let at = sregs.tr.base + 0x24 + (u64::from(gate.ist) - 1) * 8;
                (walker.read(cpu, sregs, at, &mut b) == 8).then(|| u64::from_le_bytes(b))?
            } else {
                old_rsp
            };
            (top & !0xf) - 48
        }
        // Same privilege: EFLAGS, CS, EIP, error code.
        _ => old_rsp.wrapping_sub(16) & 0xffff_ffff,
    };
    let mut b = [0u8; 4];
    (walker.read(cpu, sregs, slot, &mut b) == 4).then(|| u32::from_le_bytes(b))
}
