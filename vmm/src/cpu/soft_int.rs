//! Delivering a software interrupt (INT3, INT n, INTO) through the guest's
//! IDT in the VMM, as the CPU would. Where kernel code runs in KVM's
//! instruction emulator, the emulator refuses these instructions outside
//! real mode; Linux runs an INT3 self-test early in boot. The same delivery
//! is what a tracer needs on VT-x/AMD-V hosts to keep stepping into
//! handlers, so it is written once, here.
//!
//! Covered: IA-32e mode, from CPL 0 in 64-bit code or from CPL 3 (64-bit
//! or compatibility code) to a CPL 0 handler, with interrupt and trap
//! gates, with and without an IST stack; from CPL 3 the stack switches to
//! the TSS's RSP0 and SS becomes the null selector, as the CPU does.
//! Anything else is reported, not guessed.

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};

use crate::memory::LinearMemory;
use vtrace_x86::{efer, tss64, Gate64};

/// Why a software interrupt could not be delivered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SoftIntError {
    #[error("the CPU is not in IA-32e mode at CPL 0 (64-bit code) or CPL 3")]
    UnsupportedMode,
    #[error("vector {0} lies beyond the IDT limit")]
    BeyondIdt(u8),
    #[error("the IDT gate for vector {0} is not present or not an interrupt/trap gate")]
    BadGate(u8),
    #[error("guest address {0:#x} is not mapped")]
    Unmapped(u64),
}

fn read_u64(mem: &dyn LinearMemory, addr: u64) -> Result<u64, SoftIntError> {
    let mut b = [0u8; 8];
    mem.read(addr, &mut b).map_err(SoftIntError::Unmapped)?;
    Ok(u64::from_le_bytes(b))
}

/// Segment register contents for a 64-bit code selector from the GDT.
fn code_segment(
    mem: &dyn LinearMemory,
    sregs: &kvm_sregs,
    selector: u16,
) -> Result<kvm_segment, SoftIntError> {
    let d = read_u64(mem, sregs.gdt.base + u64::from(selector & !7))?;
    let flags = (d >> 40) as u16;
    Ok(kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: (flags & 0xf) as u8,
        present: ((flags >> 7) & 1) as u8,
        dpl: ((flags >> 5) & 3) as u8,
        db: 0,
        s: 1,
        l: 1,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    })
}

/// Delivers `vector` with `return_rip` as the saved RIP. On success `regs`
/// (and `sregs`, if CS changed) hold the handler's entry state; the caller
/// writes them back to the vCPU. Returns whether `sregs` changed.
pub fn deliver(
    mem: &dyn LinearMemory,
    regs: &mut kvm_regs,
    sregs: &mut kvm_sregs,
    vector: u8,
    return_rip: u64,
) -> Result<bool, SoftIntError> {
    deliver_with_error_code(mem, regs, sregs, vector, return_rip, None)
}

/// [`deliver`] for an exception: `error_code`, where the vector has one,
/// is pushed below the frame, as the CPU does.
pub fn deliver_with_error_code(
    mem: &dyn LinearMemory,
    regs: &mut kvm_regs,
    sregs: &mut kvm_sregs,
    vector: u8,
    return_rip: u64,
    error_code: Option<u32>,
) -> Result<bool, SoftIntError> {
    use vtrace_x86::rflags::{IF, NT, RF, TF};
    let cpl = sregs.cs.dpl;
    if sregs.efer & efer::LMA == 0 || !((cpl == 0 && sregs.cs.l == 1) || cpl == 3) {
        return Err(SoftIntError::UnsupportedMode);
    }
    let gate_at = u64::from(vector) * 16;
    if gate_at + 15 > u64::from(sregs.idt.limit) {
        return Err(SoftIntError::BeyondIdt(vector));
    }
    let mut raw = [0u8; 16];
    mem.read(sregs.idt.base + gate_at, &mut raw)
        .map_err(SoftIntError::Unmapped)?;
    let gate = Gate64::decode(&raw);
    if !gate.usable() {
        return Err(SoftIntError::BadGate(vector));
    }
    let (handler, selector, ist) = (gate.handler, gate.selector, u64::from(gate.ist));

    let target = code_segment(mem, sregs, selector)?;
    if target.dpl != 0 {
        return Err(SoftIntError::UnsupportedMode);
    }
    let mut rsp = if ist != 0 {
        read_u64(mem, sregs.tr.base + tss64::IST1 + (ist - 1) * 8)?
    } else if cpl == 3 {
        read_u64(mem, sregs.tr.base + tss64::RSP0)?
    } else {
        regs.rsp
    };
    rsp &= !0xf;
    let frame = [
        return_rip,
        u64::from(sregs.cs.selector),
        regs.rflags,
        regs.rsp,
        u64::from(sregs.ss.selector),
    ];
    let bytes: Vec<u8> = error_code
        .map(u64::from)
        .iter()
        .chain(frame.iter())
        .flat_map(|v| v.to_le_bytes())
        .collect();
    rsp -= bytes.len() as u64;
    mem.write(rsp, &bytes).map_err(SoftIntError::Unmapped)?;

    let mut sregs_changed = false;
    if selector != sregs.cs.selector || cpl != 0 {
        sregs.cs = target;
        sregs_changed = true;
    }
    if cpl != 0 {
        // A privilege change loads SS with the null selector (its DPL is
        // the new CPL, which is what SVM takes the CPL from).
        sregs.ss = kvm_segment {
            selector: 0,
            base: 0,
            limit: 0,
            type_: 0,
            present: 0,
            dpl: 0,
            db: 0,
            s: 0,
            l: 0,
            g: 0,
            avl: 0,
            unusable: 1,
            padding: 0,
        };
    }
    regs.rsp = rsp;
    regs.rip = handler;
    regs.rflags &= !(TF | NT | RF);
    if gate.kind == 0xe {
        regs.rflags &= !IF;
    }
    Ok(sregs_changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Flat memory from address 0.
    struct Flat(RefCell<Vec<u8>>);
    impl LinearMemory for Flat {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), u64> {
            let m = self.0.borrow();
            let src = m
                .get(addr as usize..addr as usize + buf.len())
                .ok_or(addr)?;
            buf.copy_from_slice(src);
            Ok(())
        }
        fn write(&self, addr: u64, data: &[u8]) -> Result<(), u64> {
            let mut m = self.0.borrow_mut();
            let dst = m
                .get_mut(addr as usize..addr as usize + data.len())
                .ok_or(addr)?;
            dst.copy_from_slice(data);
            Ok(())
        }
    }

    fn gate(handler: u64, selector: u16, ist: u8, kind: u8) -> [u8; 16] {
        let lo = (handler & 0xffff)
            | (u64::from(selector) << 16)
            | (u64::from(ist) << 32)
            | (u64::from(0x80 | kind) << 40)
            | ((handler & 0xffff_0000) << 32);
        let hi = handler >> 32;
        let mut g = [0u8; 16];
        g[..8].copy_from_slice(&lo.to_le_bytes());
        g[8..].copy_from_slice(&hi.to_le_bytes());
        g
    }

    fn long_mode() -> (kvm_regs, kvm_sregs) {
        let mut sregs = kvm_sregs {
            efer: 0x500,
            ..Default::default()
        };
        sregs.cs.l = 1;
        sregs.cs.selector = 0x10;
        sregs.ss.selector = 0x18;
        sregs.idt.base = 0x1000;
        sregs.idt.limit = 0xfff;
        sregs.tr.base = 0x3000;
        let regs = kvm_regs {
            rsp: 0x8008,
            rflags: 0x246 | 1 << 8,
            ..Default::default()
        };
        (regs, sregs)
    }

    #[test]
    fn from_user_mode_the_stack_switches_to_rsp0_and_ss_becomes_null() {
        let mem = Flat(RefCell::new(vec![0; 0x10000]));
        mem.write(0x1000 + 14 * 16, &gate(0xffff_ffff_8100_2000, 0x10, 0, 0xe))
            .unwrap();
        // Kernel code descriptor at 0x10: present, DPL 0, 64-bit.
        mem.write(0x10, &0x00af_9b00_0000_ffffu64.to_le_bytes())
            .unwrap();
        mem.write(0x3004, &0xa000u64.to_le_bytes()).unwrap();
        let (mut regs, mut sregs) = long_mode();
        sregs.cs.selector = 0x33;
        sregs.cs.dpl = 3;
        sregs.ss.selector = 0x2b;
        sregs.ss.dpl = 3;
        regs.rsp = 0x7777;
        let changed =
            deliver_with_error_code(&mem, &mut regs, &mut sregs, 14, 0x40_1000, Some(6)).unwrap();
        assert!(changed);
        assert_eq!((sregs.cs.selector, sregs.cs.dpl), (0x10, 0));
        assert_eq!(
            (sregs.ss.selector, sregs.ss.dpl, sregs.ss.unusable),
            (0, 0, 1)
        );
        assert_eq!(regs.rsp, 0xa000 - 48, "RSP0, error code and five slots");
        let mut frame = [0u8; 48];
        mem.read(regs.rsp, &mut frame).unwrap();
        let slot = |i: usize| u64::from_le_bytes(frame[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(
            [slot(0), slot(1), slot(2), slot(4), slot(5)],
            [6, 0x40_1000, 0x33, 0x7777, 0x2b]
        );
    }

    #[test]
    fn int3_through_an_interrupt_gate() {
        let mem = Flat(RefCell::new(vec![0; 0x10000]));
        mem.write(0x1000 + 3 * 16, &gate(0xffff_ffff_8100_1234, 0x10, 0, 0xe))
            .unwrap();
        let (mut regs, mut sregs) = long_mode();
        let changed = deliver(&mem, &mut regs, &mut sregs, 3, 0x4001).unwrap();
        assert!(!changed);
        assert_eq!(regs.rip, 0xffff_ffff_8100_1234);
        assert_eq!(regs.rsp, 0x8000 - 40, "aligned to 16, then five slots");
        assert_eq!(regs.rflags & (1 << 9 | 1 << 8), 0, "IF and TF cleared");
        let mut frame = [0u8; 40];
        mem.read(regs.rsp, &mut frame).unwrap();
        let slot = |i: usize| u64::from_le_bytes(frame[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(
            [slot(0), slot(1), slot(2), slot(3), slot(4)],
            [0x4001, 0x10, 0x346, 0x8008, 0x18]
        );
    }

    #[test]
    fn ist_stack_and_trap_gate() {
        let mem = Flat(RefCell::new(vec![0; 0x10000]));
        mem.write(0x1000 + 0x80 * 16, &gate(0x5000, 0x10, 2, 0xf))
            .unwrap();
        mem.write(0x3000 + 0x24 + 8, &0xa000u64.to_le_bytes())
            .unwrap();
        let (mut regs, mut sregs) = long_mode();
        deliver(&mem, &mut regs, &mut sregs, 0x80, 0x4002).unwrap();
        assert_eq!(regs.rsp, 0xa000 - 40);
        assert_ne!(regs.rflags & (1 << 9), 0, "a trap gate keeps IF");
    }

    #[test]
    fn refuses_what_it_does_not_model() {
        let mem = Flat(RefCell::new(vec![0; 0x10000]));
        let (mut regs, mut sregs) = long_mode();
        assert_eq!(
            deliver(&mem, &mut regs, &mut sregs, 3, 0),
            Err(SoftIntError::BadGate(3))
        );
        sregs.idt.limit = 15;
        assert_eq!(
            deliver(&mem, &mut regs, &mut sregs, 3, 0),
            Err(SoftIntError::BeyondIdt(3))
        );
        sregs.efer = 0;
        assert_eq!(
            deliver(&mem, &mut regs, &mut sregs, 3, 0),
            Err(SoftIntError::UnsupportedMode)
        );
    }
}
