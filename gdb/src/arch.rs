//! x86-64 as a whole machine for gdb: the general, segment, x87 and SSE
//! registers gdb knows, the FS and GS bases, and the control registers,
//! any of which may be unavailable (a trace does not know them all).

use gdbstub::arch::{Arch, Registers};

/// The target description gdb reads: gdb's own `i386` features (it checks
/// their register names and order) and vtrace's system registers.
const TARGET_XML: &str = include_str!("target.xml");

/// x86-64, whole machine (gdbstub's `Arch`).
#[derive(Debug)]
pub enum X86_64Machine {}

impl Arch for X86_64Machine {
    type Usize = u64;
    type Registers = RegisterFile;
    type BreakpointKind = usize;
    type RegId = ();

    fn target_description_xml() -> Option<&'static str> {
        Some(TARGET_XML)
    }
}

/// A register of [`RegisterFile`], by its place in the target description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reg {
    /// A general register, by its x86 encoding number (RAX 0 .. R15 15).
    Gpr(usize),
    /// RIP.
    Rip,
    /// RFLAGS (gdb shows its low 32 bits, `eflags`).
    Eflags,
    /// CS, SS, DS, ES, FS, GS: 0 to 5.
    Segment(usize),
    /// FS base.
    FsBase,
    /// GS base.
    GsBase,
    /// CR0.
    Cr0,
    /// CR2.
    Cr2,
    /// CR3.
    Cr3,
    /// CR4.
    Cr4,
    /// CR8.
    Cr8,
    /// EFER.
    Efer,
}

/// gdb's order of the general registers, as x86 encoding numbers.
const GDB_GPR_ORDER: [usize; 16] = [0, 3, 1, 2, 6, 7, 5, 4, 8, 9, 10, 11, 12, 13, 14, 15];

/// Sizes in bytes of the registers, in the target description's order.
const SIZES: [usize; REGISTERS] = {
    let mut sizes = [8; REGISTERS];
    let mut i = 17;
    // eflags, six segments
    while i < 24 {
        sizes[i] = 4;
        i += 1;
    }
    // st0..st7
    while i < 32 {
        sizes[i] = 10;
        i += 1;
    }
    // x87 control
    while i < 40 {
        sizes[i] = 4;
        i += 1;
    }
    // xmm0..xmm15
    while i < 56 {
        sizes[i] = 16;
        i += 1;
    }
    sizes[56] = 4; // mxcsr
    sizes
};

/// Registers in the target description.
const REGISTERS: usize = 65;

impl Reg {
    /// Its place in the target description.
    fn slot(self) -> usize {
        match self {
            Reg::Gpr(n) => GDB_GPR_ORDER.iter().position(|&g| g == n).unwrap_or(0),
            Reg::Rip => 16,
            Reg::Eflags => 17,
            Reg::Segment(n) => 18 + n.min(5),
            Reg::FsBase => 57,
            Reg::GsBase => 58,
            Reg::Cr0 => 59,
            Reg::Cr2 => 60,
            Reg::Cr3 => 61,
            Reg::Cr4 => 62,
            Reg::Cr8 => 63,
            Reg::Efer => 64,
        }
    }
}

/// Every register of [`X86_64Machine`], each known or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterFile {
    values: Vec<Option<u128>>,
}

impl Default for RegisterFile {
    fn default() -> Self {
        RegisterFile {
            values: vec![None; REGISTERS],
        }
    }
}

impl RegisterFile {
    /// Sets `reg` (`None`: unavailable).
    pub fn set(&mut self, reg: Reg, value: Option<u64>) {
        self.values[reg.slot()] = value.map(u128::from);
    }

    /// `reg`, where known.
    pub fn get(&self, reg: Reg) -> Option<u64> {
        self.values[reg.slot()].map(|v| v as u64)
    }
}

impl Registers for RegisterFile {
    type ProgramCounter = u64;

    fn pc(&self) -> u64 {
        self.get(Reg::Rip).unwrap_or(0)
    }

    fn gdb_serialize(&self, mut write_byte: impl FnMut(Option<u8>)) {
        for (value, &size) in self.values.iter().zip(SIZES.iter()) {
            let bytes = value.map(u128::to_le_bytes);
            for i in 0..size {
                write_byte(bytes.map(|b| b[i]));
            }
        }
    }

    fn gdb_deserialize(&mut self, bytes: &[u8]) -> Result<(), ()> {
        let mut at = 0;
        for (value, &size) in self.values.iter_mut().zip(SIZES.iter()) {
            let Some(raw) = bytes.get(at..at + size) else {
                return Err(());
            };
            let mut le = [0u8; 16];
            le[..size].copy_from_slice(raw);
            *value = Some(u128::from_le_bytes(le));
            at += size;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_and_the_sizes_agree() {
        let regs = TARGET_XML.matches("<reg ").count();
        assert_eq!(regs, REGISTERS);
        let bits: Vec<usize> = TARGET_XML
            .split("bitsize=\"")
            .skip(1)
            .filter_map(|s| s.split('"').next()?.parse().ok())
            .collect();
        let bytes: Vec<usize> = bits.iter().map(|b| b / 8).collect();
        assert_eq!(bytes, SIZES.to_vec());
    }

    #[test]
    fn unknown_registers_go_out_as_unavailable() {
        let mut file = RegisterFile::default();
        file.set(Reg::Gpr(3), Some(0x1122)); // rbx: gdb's second
        file.set(Reg::Rip, Some(0xffff_ffff_8100_0000));
        let mut out = Vec::new();
        file.gdb_serialize(|b| out.push(b));
        assert_eq!(out.len(), SIZES.iter().sum::<usize>());
        assert_eq!(out[0], None, "rax unknown");
        assert_eq!(&out[8..10], &[Some(0x22), Some(0x11)]);
        assert_eq!(out[16 * 8], Some(0));
        assert_eq!(out[16 * 8 + 7], Some(0xff));
        assert_eq!(file.pc(), 0xffff_ffff_8100_0000);
    }
}
