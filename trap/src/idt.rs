//! Reading the guest's interrupt descriptor table: where a vector's handler
//! starts and where the CPU put the exception frame.

use vtrace_storage::CpuMode;
use vtrace_vmm::CpuView;
use vtrace_x86::SpecialRegisters;

use crate::context::cpu_mode;
use vtrace_x86::Walker;

/// A gate: handler address and IST index (long mode; 0 elsewhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gate {
    /// The handler's linear address.
    pub handler: u64,
    /// The interrupt stack table entry it switches to (0: none).
    pub ist: u8,
}

/// The gate for `vector`, if the IDT has a present one.
pub fn gate(
    cpu: &dyn CpuView,
    walker: &mut Walker,
    sregs: &SpecialRegisters,
    vector: u8,
) -> Option<Gate> {
    match cpu_mode(sregs) {
        CpuMode::Real => {
            let mut b = [0u8; 4];
            let base = sregs.idt.base + u64::from(vector) * 4;
            (walker.read(cpu, sregs, base, &mut b) == 4).then(|| Gate {
                handler: vtrace_x86::real_mode_vector(&b),
                ist: 0,
            })
        }
        CpuMode::Long64 | CpuMode::Compat32 => {
            let at = u64::from(vector) * 16;
            if at + 15 > u64::from(sregs.idt.limit) {
                return None;
            }
            let mut b = [0u8; 16];
            if walker.read(cpu, sregs, sregs.idt.base + at, &mut b) != 16 {
                return None;
            }
            let g = vtrace_x86::Gate64::decode(&b);
            g.present.then_some(Gate {
                handler: g.handler,
                ist: g.ist,
            })
        }
        CpuMode::Protected32 | CpuMode::Protected16 => {
            let at = u64::from(vector) * 8;
            if at + 7 > u64::from(sregs.idt.limit) {
                return None;
            }
            let mut b = [0u8; 8];
            if walker.read(cpu, sregs, sregs.idt.base + at, &mut b) != 8 {
                return None;
            }
            // Flat code segments only: the handler's linear address.
            vtrace_x86::gate32_handler(&b).map(|handler| Gate { handler, ist: 0 })
        }
    }
}

/// The error code an exception pushed, read from the frame the CPU built
/// on top of `old_rsp` (the stack pointer when the exception happened).
pub fn error_code(
    cpu: &dyn CpuView,
    walker: &mut Walker,
    sregs: &SpecialRegisters,
    gate: Gate,
    old_rsp: u64,
) -> Option<u32> {
    let slot = match cpu_mode(sregs) {
        CpuMode::Long64 | CpuMode::Compat32 => {
            let top = if gate.ist != 0 {
                let mut b = [0u8; 8];
                let at = sregs.tr.base + vtrace_x86::tss64::IST1 + (u64::from(gate.ist) - 1) * 8;
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
