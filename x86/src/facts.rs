//! The architecture's constants: the bits of RFLAGS, the control
//! registers and EFER, page-table entries and page-fault error codes, IDT
//! gates and the 64-bit TSS. Names follow the Intel SDM (and iced-x86's
//! naming where it has one).

/// RFLAGS bits.
pub mod rflags {
    /// Carry.
    pub const CF: u64 = 1;
    /// Parity.
    pub const PF: u64 = 1 << 2;
    /// Auxiliary carry.
    pub const AF: u64 = 1 << 4;
    /// Zero.
    pub const ZF: u64 = 1 << 6;
    /// Sign.
    pub const SF: u64 = 1 << 7;
    /// Trap: a debug exception after each instruction.
    pub const TF: u64 = 1 << 8;
    /// Interrupts enabled.
    pub const IF: u64 = 1 << 9;
    /// String instructions count down.
    pub const DF: u64 = 1 << 10;
    /// Overflow.
    pub const OF: u64 = 1 << 11;
    /// Nested task.
    pub const NT: u64 = 1 << 14;
    /// Resume: the next instruction breakpoint does not fire.
    pub const RF: u64 = 1 << 16;
    /// Alignment check (with CR4.SMAP: user accesses allowed).
    pub const AC: u64 = 1 << 18;
}

/// Debug registers.
pub mod dr {
    /// Address breakpoints a CPU has (DR0-DR3).
    pub const BREAKPOINTS: usize = 4;
}

/// CR0 bits.
pub mod cr0 {
    /// Protected mode.
    pub const PE: u64 = 1;
    /// Extension type (always 1 on modern CPUs).
    pub const ET: u64 = 1 << 4;
    /// Supervisor writes honour read-only pages.
    pub const WP: u64 = 1 << 16;
    /// Paging.
    pub const PG: u64 = 1 << 31;
}

/// CR4 bits.
pub mod cr4 {
    /// 4 MiB pages with 32-bit paging.
    pub const PSE: u64 = 1 << 4;
    /// PAE paging (required for long mode).
    pub const PAE: u64 = 1 << 5;
    /// OS supports FXSAVE/FXRSTOR.
    pub const OSFXSR: u64 = 1 << 9;
    /// OS handles SIMD floating-point exceptions.
    pub const OSXMMEXCPT: u64 = 1 << 10;
    /// Five-level paging.
    pub const LA57: u64 = 1 << 12;
    /// XSAVE and extended states.
    pub const OSXSAVE: u64 = 1 << 18;
    /// Supervisor-mode execution prevention.
    pub const SMEP: u64 = 1 << 20;
    /// Supervisor-mode access prevention.
    pub const SMAP: u64 = 1 << 21;
}

/// IA32_EFER bits.
pub mod efer {
    /// SYSCALL/SYSRET enabled.
    pub const SCE: u64 = 1;
    /// Long mode enabled.
    pub const LME: u64 = 1 << 8;
    /// Long mode active.
    pub const LMA: u64 = 1 << 10;
    /// No-execute pages.
    pub const NXE: u64 = 1 << 11;
}

/// Page-table entry bits (all paging modes, where they exist).
pub mod pte {
    /// Present.
    pub const P: u64 = 1;
    /// Writable.
    pub const RW: u64 = 1 << 1;
    /// User-accessible.
    pub const US: u64 = 1 << 2;
    /// Accessed: the CPU sets it at the first walk through the entry.
    pub const A: u64 = 1 << 5;
    /// A large page (in a directory entry).
    pub const PS: u64 = 1 << 7;
    /// No-execute.
    pub const XD: u64 = 1 << 63;
    /// The physical address bits of a 4 KiB-aligned entry.
    pub const ADDR: u64 = 0x000f_ffff_ffff_f000;
}

/// Page-fault error code bits.
pub mod pf_error {
    /// The page was present (a protection fault).
    pub const P: u32 = 1;
    /// A write.
    pub const W: u32 = 1 << 1;
    /// From user mode.
    pub const U: u32 = 1 << 2;
    /// An instruction fetch.
    pub const I: u32 = 1 << 4;
}

/// Model-specific registers, by index.
pub mod msr {
    /// IA32_FMASK: RFLAGS bits SYSCALL clears.
    pub const FMASK: u32 = 0xc000_0084;
    /// IA32_KERNEL_GS_BASE: the GS base SWAPGS exchanges with GS's own.
    pub const KERNEL_GS_BASE: u32 = 0xc000_0102;
}

/// Offsets in the 64-bit TSS.
pub mod tss64 {
    /// RSP0: the stack for entries into ring 0.
    pub const RSP0: u64 = 4;
    /// IST1; IST n is at `IST1 + (n - 1) * 8`.
    pub const IST1: u64 = 0x24;
}

/// Exceptions for which the CPU pushes an error code.
pub fn has_error_code(vector: u8) -> bool {
    matches!(vector, 8 | 10..=14 | 17 | 21 | 29 | 30)
}

/// A 64-bit mode IDT gate (16 bytes), decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gate64 {
    /// The handler's offset.
    pub handler: u64,
    /// Its code segment selector.
    pub selector: u16,
    /// Interrupt stack table index (0: none).
    pub ist: u8,
    /// Gate type: 0xE interrupt, 0xF trap.
    pub kind: u8,
    /// The present bit.
    pub present: bool,
}

impl Gate64 {
    /// Decodes the 16 bytes of a gate.
    pub fn decode(b: &[u8; 16]) -> Gate64 {
        let lo = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        let hi = u64::from(u32::from_le_bytes([b[8], b[9], b[10], b[11]]));
        Gate64 {
            handler: (lo & 0xffff) | ((lo >> 32) & 0xffff_0000) | (hi << 32),
            selector: ((lo >> 16) & 0xffff) as u16,
            ist: ((lo >> 32) & 7) as u8,
            kind: ((lo >> 40) & 0xf) as u8,
            present: (lo >> 47) & 1 == 1,
        }
    }

    /// An interrupt or trap gate, present.
    pub fn usable(&self) -> bool {
        self.present && (self.kind == 0xe || self.kind == 0xf)
    }
}

/// A protected-mode (32-bit) IDT gate's handler offset, if present.
pub fn gate32_handler(b: &[u8; 8]) -> Option<u64> {
    (b[5] & 0x80 != 0).then(|| {
        u64::from(u16::from_le_bytes([b[0], b[1]]))
            | u64::from(u16::from_le_bytes([b[6], b[7]])) << 16
    })
}

/// A real-mode interrupt vector (offset, segment): the handler's linear
/// address.
pub fn real_mode_vector(b: &[u8; 4]) -> u64 {
    let offset = u64::from(u16::from_le_bytes([b[0], b[1]]));
    let segment = u64::from(u16::from_le_bytes([b[2], b[3]]));
    (segment << 4) + offset
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_64_bit_gate_decodes() {
        // Handler 0xffff_ffff_8123_4567, selector 0x10, IST 2, interrupt
        // gate, present, DPL 0.
        let mut b = [0u8; 16];
        b[0..2].copy_from_slice(&0x4567u16.to_le_bytes());
        b[2..4].copy_from_slice(&0x10u16.to_le_bytes());
        b[4] = 2;
        b[5] = 0x8e;
        b[6..8].copy_from_slice(&0x8123u16.to_le_bytes());
        b[8..12].copy_from_slice(&0xffff_ffffu32.to_le_bytes());
        let g = Gate64::decode(&b);
        assert_eq!(
            g,
            Gate64 {
                handler: 0xffff_ffff_8123_4567,
                selector: 0x10,
                ist: 2,
                kind: 0xe,
                present: true
            }
        );
        assert!(g.usable());
        b[5] = 0x0e;
        assert!(!Gate64::decode(&b).usable(), "not present");
    }

    #[test]
    fn real_and_protected_mode_vectors() {
        assert_eq!(real_mode_vector(&[0x34, 0x12, 0x00, 0xf0]), 0xf1234);
        assert_eq!(
            gate32_handler(&[0x78, 0x56, 8, 0, 0, 0x8e, 0x34, 0x12]),
            Some(0x1234_5678)
        );
        assert_eq!(
            gate32_handler(&[0x78, 0x56, 8, 0, 0, 0x0e, 0x34, 0x12]),
            None
        );
    }
}
