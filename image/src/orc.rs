//! The Linux kernel's ORC unwind tables (`.orc_unwind_ip`, `.orc_unwind`):
//! for every stretch of its code, where the caller's stack pointer, return
//! address and frame pointer are. The kernel unwinds its own stacks with
//! them; a debugger without the kernel's DWARF can too.
//!
//! | section | entry |
//! |---|---|
//! | `.orc_unwind_ip` | `s32`: the stretch's first address, relative to the entry's own |
//! | `.orc_unwind` | 6 bytes: `s16 sp_offset`, `s16 bp_offset`, then bit fields `sp_reg:4`, `bp_reg:4`, `type:2`, `end:1` |
//!
//! The layout and the numbers below are those of Linux 6.1 to 6.3
//! (`arch/x86/include/asm/orc_types.h`); 6.4 renumbered the types, which
//! [`OrcKind`] leaves unread rather than misread.

use object::{Object, ObjectSection};

/// A register an [`OrcEntry`] counts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrcReg {
    /// None: the stretch has no unwind information.
    Undefined,
    /// The caller's stack pointer (the frame pointer's rule only).
    PrevSp,
    /// RDX.
    Dx,
    /// RDI.
    Di,
    /// RBP.
    Bp,
    /// RSP.
    Sp,
    /// R10.
    R10,
    /// R13.
    R13,
    /// The value at RBP + offset.
    BpIndirect,
    /// The value at RSP, plus the offset.
    SpIndirect,
    /// Another number: not read.
    Other(u8),
}

impl OrcReg {
    fn from_bits(bits: u8) -> OrcReg {
        match bits {
            0 => OrcReg::Undefined,
            1 => OrcReg::PrevSp,
            2 => OrcReg::Dx,
            3 => OrcReg::Di,
            4 => OrcReg::Bp,
            5 => OrcReg::Sp,
            6 => OrcReg::R10,
            7 => OrcReg::R13,
            8 => OrcReg::BpIndirect,
            9 => OrcReg::SpIndirect,
            n => OrcReg::Other(n),
        }
    }
}

/// What kind of frame a stretch of code has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrcKind {
    /// A call frame: the return address is just below the caller's stack
    /// pointer.
    Call,
    /// A full `struct pt_regs` (an interrupt or system-call entry) at the
    /// computed address.
    Regs,
    /// Only the hardware's interrupt frame (RIP, CS, RFLAGS, RSP, SS).
    RegsPartial,
    /// Another number: not read.
    Other(u8),
}

/// One stretch's unwind rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrcEntry {
    /// Added to `sp_reg`'s value.
    pub sp_offset: i16,
    /// Where RBP was saved, from `bp_reg`.
    pub bp_offset: i16,
    /// What the caller's stack pointer counts from.
    pub sp_reg: OrcReg,
    /// What the saved RBP counts from.
    pub bp_reg: OrcReg,
    /// The frame's kind.
    pub kind: OrcKind,
    /// The stack ends here (a task's first frame).
    pub end: bool,
}

impl OrcEntry {
    /// Decodes one 6-byte entry.
    fn parse(bytes: [u8; 6]) -> OrcEntry {
        OrcEntry {
            sp_offset: i16::from_le_bytes([bytes[0], bytes[1]]),
            bp_offset: i16::from_le_bytes([bytes[2], bytes[3]]),
            sp_reg: OrcReg::from_bits(bytes[4] & 0xf),
            bp_reg: OrcReg::from_bits(bytes[4] >> 4),
            kind: match bytes[5] & 0x3 {
                0 => OrcKind::Call,
                1 => OrcKind::Regs,
                2 => OrcKind::RegsPartial,
                n => OrcKind::Other(n),
            },
            end: bytes[5] & 0x4 != 0,
        }
    }
}

/// The ORC table of the vmlinux ELF `image`: each stretch's first address
/// and its rule, sorted by address (a stretch runs to the next one's
/// start). `None` where the image has no such tables, or they disagree in
/// length.
pub fn orc_table(image: &[u8]) -> Option<Vec<(u64, OrcEntry)>> {
    let file = object::File::parse(image).ok()?;
    let ips = file.section_by_name(".orc_unwind_ip")?;
    let entries = file.section_by_name(".orc_unwind")?;
    let (base, ip_bytes) = (ips.address(), ips.data().ok()?);
    let entry_bytes = entries.data().ok()?;
    if ip_bytes.len() % 4 != 0 || entry_bytes.len() / 6 != ip_bytes.len() / 4 {
        return None;
    }
    let mut table: Vec<(u64, OrcEntry)> = ip_bytes
        .chunks_exact(4)
        .zip(entry_bytes.chunks_exact(6))
        .zip(0u64..)
        .filter_map(|((ip, e), i)| {
            let relative = i32::from_le_bytes(ip.try_into().ok()?);
            let at = base.checked_add(i.checked_mul(4)?)?;
            let ip = at.wrapping_add_signed(i64::from(relative));
            Some((ip, OrcEntry::parse(e.try_into().ok()?)))
        })
        .collect();
    table.sort_by_key(|(ip, _)| *ip);
    Some(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_decodes_its_bit_fields() {
        // sp = rsp + 8 at a routine's first instruction: a call frame.
        let e = OrcEntry::parse([8, 0, 0, 0, 0x05, 0x00]);
        assert_eq!(e.sp_offset, 8);
        assert_eq!(e.sp_reg, OrcReg::Sp);
        assert_eq!(e.bp_reg, OrcReg::Undefined);
        assert_eq!(e.kind, OrcKind::Call);
        assert!(!e.end);
        // After `push rbp; mov rbp, rsp`: sp = rbp + 16, rbp saved at
        // prev_sp - 16.
        let e = OrcEntry::parse([16, 0, 0xf0, 0xff, 0x14, 0x00]);
        assert_eq!((e.sp_reg, e.sp_offset), (OrcReg::Bp, 16));
        assert_eq!((e.bp_reg, e.bp_offset), (OrcReg::PrevSp, -16));
        // A task's last frame: pt_regs, the end of the stack.
        let e = OrcEntry::parse([0, 0, 0, 0, 0x05, 0x05]);
        assert_eq!(e.kind, OrcKind::Regs);
        assert!(e.end);
    }
}
