//! A symbol file for gdb made from a kernel image without debug
//! information (a distribution's vmlinuz): the kernel's own symbol table
//! (kallsyms) as ELF symbols, and its ORC unwind tables ([`crate::orc`])
//! as DWARF call frame information. With it gdb names the kernel's
//! routines and variables and unwinds its stacks (`bt`) as it would with a
//! debug vmlinux; types and source lines still need the real one.
//!
//! The file is an `ET_EXEC` ELF for x86-64: one `SHT_NOBITS` section over
//! the kernel's addresses (the symbols' home: gdb reads the code itself
//! from its target), `.debug_frame`, `.symtab`, `.strtab`.

use gimli::write::{
    Address, CallFrameInstruction as Cfi, CommonInformationEntry, DebugFrame, EndianVec,
    Expression, FrameDescriptionEntry, FrameTable,
};
use gimli::{Encoding, Format, Register, RunTimeEndian, X86_64};
use object::elf;
use object::write::elf::{FileHeader, SectionHeader, Sym, Writer};
use object::Endianness;

use crate::orc::{orc_table, OrcEntry, OrcKind, OrcReg};
use crate::symbols::all_kallsyms as all_symbols;
use crate::symbols::SymbolError;

/// Addresses from here up are the kernel's; per-CPU symbols (offsets) and
/// early boot code are left out.
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;

/// A routine's size where the next symbol is farther than this: a guess
/// bounded, rather than one spanning a hole.
const LONGEST_ROUTINE: u64 = 1 << 20;

/// Offsets in a `struct pt_regs` (x86-64) of what an interrupt or system
/// call entry saved there.
const PT_REGS: [(Register, i64); 6] = [
    (X86_64::R15, 0),
    (X86_64::R14, 8),
    (X86_64::R13, 16),
    (X86_64::R12, 24),
    (X86_64::RBP, 32),
    (X86_64::RBX, 40),
];
const PT_REGS_IP: i64 = 128;
const PT_REGS_SP: i64 = 152;
/// In the hardware's interrupt frame alone (RIP, CS, RFLAGS, RSP, SS).
const IRET_SP: i64 = 24;

/// A symbol file, and what went into it.
#[derive(Clone, Debug)]
pub struct GdbSymbols {
    /// The ELF file's bytes.
    pub elf: Vec<u8>,
    /// Routines named.
    pub routines: usize,
    /// Variables named.
    pub variables: usize,
    /// Unwind rules (ORC stretches) described; 0 where the image has none.
    pub unwind_rules: usize,
}

/// A symbol file for the vmlinux ELF `image` (`origin` names it in
/// errors): its kallsyms and, where it has them, its ORC tables.
pub fn gdb_symbol_file(image: &[u8], origin: &str) -> Result<GdbSymbols, SymbolError> {
    let mut symbols: Vec<(u64, String, bool)> = all_symbols(image, origin)?
        .into_iter()
        .filter(|(_, _, addr)| *addr >= KERNEL_HALF)
        .filter_map(|(kind, name, addr)| match kind.to_ascii_lowercase() {
            't' | 'w' => Some((addr, name, true)),
            'd' | 'b' | 'r' | 'v' => Some((addr, name, false)),
            _ => None,
        })
        .collect();
    symbols.sort_by_key(|s| s.0);
    let orc = orc_table(image).unwrap_or_default();
    let frame = debug_frame(&orc)?;
    let elf = write_elf(&symbols, &frame)?;
    Ok(GdbSymbols {
        elf,
        routines: symbols.iter().filter(|s| s.2).count(),
        variables: symbols.iter().filter(|s| !s.2).count(),
        unwind_rules: orc.len(),
    })
}

/// Whether the ELF image carries DWARF of its own (a debug vmlinux):
/// gdb then needs no symbol file made for it.
pub fn has_dwarf(image: &[u8]) -> bool {
    use object::{Object, ObjectSection};
    object::File::parse(image).is_ok_and(|f| {
        [".debug_frame", ".debug_info"]
            .iter()
            .any(|name| f.section_by_name(name).is_some_and(|s| s.size() > 0))
    })
}

fn bad(origin: &str, what: impl std::fmt::Display) -> SymbolError {
    SymbolError::NoSymbols(format!("{origin}: {what}"))
}

/// `.debug_frame` with one entry per run of equal ORC rules.
fn debug_frame(orc: &[(u64, OrcEntry)]) -> Result<Vec<u8>, SymbolError> {
    let encoding = Encoding {
        format: Format::Dwarf32,
        version: 4,
        address_size: 8,
    };
    let mut table = FrameTable::default();
    let cie = table.add_cie(CommonInformationEntry::new(encoding, 1, -8, X86_64::RA));
    let mut i = 0;
    while i < orc.len() {
        let (start, rule) = orc[i];
        let mut j = i + 1;
        while j < orc.len() && orc[j].1 == rule {
            j += 1;
        }
        // The last stretch has no end: left undescribed.
        let Some(&(end, _)) = orc.get(j) else {
            break;
        };
        if let Ok(length) = u32::try_from(end.saturating_sub(start)) {
            if length > 0 {
                let mut fde = FrameDescriptionEntry::new(Address::Constant(start), length);
                for instruction in instructions(&rule) {
                    fde.add_instruction(0, instruction);
                }
                table.add_fde(cie, fde);
            }
        }
        i = j;
    }
    let mut frame = DebugFrame(EndianVec::new(RunTimeEndian::Little));
    table
        .write_debug_frame(&mut frame)
        .map_err(|e| bad(".debug_frame", e))?;
    Ok(frame.0.into_vec())
}

/// The DWARF register an ORC rule counts from (a direct one).
fn dwarf_register(reg: OrcReg) -> Option<Register> {
    Some(match reg {
        OrcReg::Sp => X86_64::RSP,
        OrcReg::Bp => X86_64::RBP,
        OrcReg::Di => X86_64::RDI,
        OrcReg::Dx => X86_64::RDX,
        OrcReg::R10 => X86_64::R10,
        OrcReg::R13 => X86_64::R13,
        _ => return None,
    })
}

/// An expression pushing the address `sp_reg`/`sp_offset` name (the
/// caller's stack pointer for a call frame, the saved registers' base for
/// the others), plus `extra`.
fn base(entry: &OrcEntry, extra: i64) -> Option<Expression> {
    let mut e = Expression::new();
    push_base(&mut e, entry, extra)?;
    Some(e)
}

/// The address `base(entry, at)` for `DW_CFA_expression`, which pushes
/// the CFA first (dropped: the rule counts from registers).
fn saved_at(entry: &OrcEntry, at: i64) -> Option<Expression> {
    let mut e = Expression::new();
    e.op(gimli::constants::DW_OP_drop);
    push_base(&mut e, entry, at)?;
    Some(e)
}

fn push_base(e: &mut Expression, entry: &OrcEntry, extra: i64) -> Option<()> {
    let offset = i64::from(entry.sp_offset);
    match entry.sp_reg {
        OrcReg::SpIndirect => {
            e.op_breg(X86_64::RSP, 0);
            e.op_deref();
            e.op_consts(offset + extra);
            e.op(gimli::constants::DW_OP_plus);
        }
        OrcReg::BpIndirect => {
            e.op_breg(X86_64::RBP, offset);
            e.op_deref();
            e.op_consts(extra);
            e.op(gimli::constants::DW_OP_plus);
        }
        reg => e.op_breg(dwarf_register(reg)?, offset + extra),
    }
    Some(())
}

/// The call frame instructions of one ORC rule; where it cannot be said
/// (no rule, the stack's end, a kind not read), the return address is
/// undefined: gdb's backtrace ends there rather than guess.
fn instructions(entry: &OrcEntry) -> Vec<Cfi> {
    let end = || vec![Cfi::Cfa(X86_64::RSP, 8), Cfi::Undefined(X86_64::RA)];
    if entry.end {
        return end();
    }
    let described = match entry.kind {
        OrcKind::Call => call_frame(entry),
        OrcKind::Regs => saved_registers(entry, PT_REGS_IP, PT_REGS_SP, true),
        OrcKind::RegsPartial => saved_registers(entry, 0, IRET_SP, false),
        OrcKind::Other(_) => None,
    };
    described.unwrap_or_else(end)
}

fn call_frame(entry: &OrcEntry) -> Option<Vec<Cfi>> {
    let mut out = vec![match dwarf_register(entry.sp_reg) {
        Some(reg) => Cfi::Cfa(reg, i32::from(entry.sp_offset)),
        None => Cfi::CfaExpression(base(entry, 0)?),
    }];
    out.push(Cfi::Offset(X86_64::RA, -8));
    let bp_offset = i64::from(entry.bp_offset);
    out.push(match entry.bp_reg {
        OrcReg::Undefined => Cfi::SameValue(X86_64::RBP),
        OrcReg::PrevSp => {
            // At the CFA (pushed first) plus the offset.
            let mut e = Expression::new();
            e.op_consts(bp_offset);
            e.op(gimli::constants::DW_OP_plus);
            Cfi::Expression(X86_64::RBP, e)
        }
        OrcReg::Bp => {
            let mut e = Expression::new();
            e.op(gimli::constants::DW_OP_drop);
            e.op_breg(X86_64::RBP, bp_offset);
            Cfi::Expression(X86_64::RBP, e)
        }
        _ => Cfi::Undefined(X86_64::RBP),
    });
    Some(out)
}

/// A frame of saved registers at the rule's base: the return address at
/// `ip`, the caller's stack pointer at `sp`, and (`full`) the callee-saved
/// registers of a `pt_regs`.
fn saved_registers(entry: &OrcEntry, ip: i64, sp: i64, full: bool) -> Option<Vec<Cfi>> {
    let mut cfa = base(entry, sp)?;
    cfa.op_deref();
    let mut out = vec![
        Cfi::CfaExpression(cfa),
        Cfi::Expression(X86_64::RA, saved_at(entry, ip)?),
    ];
    if full {
        for (reg, at) in PT_REGS {
            out.push(Cfi::Expression(reg, saved_at(entry, at)?));
        }
    } else {
        out.push(Cfi::SameValue(X86_64::RBP));
    }
    Some(out)
}

/// The ELF file: symbols over one `NOBITS` section, and `.debug_frame`.
fn write_elf(symbols: &[(u64, String, bool)], frame: &[u8]) -> Result<Vec<u8>, SymbolError> {
    let (Some(first), Some(last)) = (symbols.first(), symbols.last()) else {
        return Err(bad("kallsyms", "no kernel symbols"));
    };
    let (low, high) = (first.0, last.0.saturating_add(1));
    let mut out = Vec::new();
    let mut w = Writer::new(Endianness::Little, true, &mut out);
    w.reserve_file_header();
    let kernel_name = w.add_section_name(b".kernel");
    let frame_name = w.add_section_name(b".debug_frame");
    let kernel = w.reserve_section_index();
    w.reserve_section_index(); // .debug_frame
    w.reserve_null_symbol_index();
    let names: Vec<_> = symbols
        .iter()
        .map(|s| w.add_string(s.1.as_bytes()))
        .collect();
    for _ in symbols {
        w.reserve_symbol_index(Some(kernel));
    }
    w.reserve_symtab_section_index();
    w.reserve_strtab_section_index();
    w.reserve_shstrtab_section_index();
    let frame_offset = w.reserve(frame.len(), 8);
    w.reserve_symtab();
    w.reserve_strtab();
    w.reserve_shstrtab();
    w.reserve_section_headers();

    w.write_file_header(&FileHeader {
        os_abi: elf::ELFOSABI_NONE,
        abi_version: 0,
        e_type: elf::ET_EXEC,
        e_machine: elf::EM_X86_64,
        e_entry: 0,
        e_flags: 0,
    })
    .map_err(|e| bad("ELF", e))?;
    w.write_align(8);
    w.write(frame);
    w.write_null_symbol();
    for (i, (addr, _, routine)) in symbols.iter().enumerate() {
        let next = symbols[i + 1..]
            .iter()
            .map(|s| s.0)
            .find(|&a| a > *addr)
            .unwrap_or(high);
        let size = match routine {
            true => (next - addr).min(LONGEST_ROUTINE),
            false => 0,
        };
        let kind = if *routine {
            elf::STT_FUNC
        } else {
            elf::STT_OBJECT
        };
        w.write_symbol(&Sym {
            name: Some(names[i]),
            section: Some(kernel),
            st_info: (elf::STB_GLOBAL << 4) | kind,
            st_other: elf::STV_DEFAULT,
            st_shndx: 0,
            st_value: *addr,
            st_size: size,
        });
    }
    w.write_strtab();
    w.write_shstrtab();
    w.write_null_section_header();
    w.write_section_header(&SectionHeader {
        name: Some(kernel_name),
        sh_type: elf::SHT_NOBITS,
        sh_flags: u64::from(elf::SHF_ALLOC | elf::SHF_EXECINSTR | elf::SHF_WRITE),
        sh_addr: low,
        sh_offset: 0,
        sh_size: high - low,
        sh_link: 0,
        sh_info: 0,
        sh_addralign: 16,
        sh_entsize: 0,
    });
    w.write_section_header(&SectionHeader {
        name: Some(frame_name),
        sh_type: elf::SHT_PROGBITS,
        sh_flags: 0,
        sh_addr: 0,
        sh_offset: frame_offset as u64,
        sh_size: frame.len() as u64,
        sh_link: 0,
        sh_info: 0,
        sh_addralign: 8,
        sh_entsize: 0,
    });
    w.write_symtab_section_header(1);
    w.write_strtab_section_header();
    w.write_shstrtab_section_header();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gimli::{BaseAddresses, CfaRule, RegisterRule, UnwindContext, UnwindSection};
    use object::{Object, ObjectSection, ObjectSymbol};

    fn call(sp_reg: OrcReg, sp_offset: i16, bp_reg: OrcReg, bp_offset: i16) -> OrcEntry {
        OrcEntry {
            sp_offset,
            bp_offset,
            sp_reg,
            bp_reg,
            kind: OrcKind::Call,
            end: false,
        }
    }

    /// The unwind row gdb would find for `pc` in `elf`'s `.debug_frame`.
    fn row(elf: &[u8], pc: u64) -> (CfaRule<usize>, RegisterRule<usize>, RegisterRule<usize>) {
        let file = object::File::parse(elf).unwrap();
        let data = file
            .section_by_name(".debug_frame")
            .unwrap()
            .data()
            .unwrap();
        let mut frame = gimli::DebugFrame::new(data, gimli::LittleEndian);
        frame.set_address_size(8);
        let mut ctx = UnwindContext::new();
        let row = frame
            .unwind_info_for_address(
                &BaseAddresses::default(),
                &mut ctx,
                pc,
                gimli::DebugFrame::cie_from_offset,
            )
            .unwrap();
        (
            row.cfa().clone(),
            row.register(X86_64::RA),
            row.register(X86_64::RBP),
        )
    }

    #[test]
    fn orc_rules_become_the_frames_gdb_unwinds_with() {
        let orc = [
            // A routine's first instruction: the return address on top.
            (0x1000, call(OrcReg::Sp, 8, OrcReg::Undefined, 0)),
            // After push rbp; mov rbp, rsp.
            (0x1004, call(OrcReg::Bp, 16, OrcReg::PrevSp, -16)),
            // The stack's end.
            (
                0x1010,
                OrcEntry {
                    end: true,
                    ..call(OrcReg::Undefined, 0, OrcReg::Undefined, 0)
                },
            ),
            (0x1020, call(OrcReg::Sp, 8, OrcReg::Undefined, 0)),
        ];
        let frame = debug_frame(&orc).unwrap();
        let symbols = vec![
            (0x1000, "f".to_string(), true),
            (0x1020, "g".to_string(), true),
        ];
        let elf = write_elf(&symbols, &frame).unwrap();

        let (cfa, ra, bp) = row(&elf, 0x1002);
        assert_eq!(
            cfa,
            CfaRule::RegisterAndOffset {
                register: X86_64::RSP,
                offset: 8
            }
        );
        assert_eq!(ra, RegisterRule::Offset(-8));
        assert_eq!(bp, RegisterRule::SameValue);
        let (cfa, ra, bp) = row(&elf, 0x1008);
        assert_eq!(
            cfa,
            CfaRule::RegisterAndOffset {
                register: X86_64::RBP,
                offset: 16
            }
        );
        assert_eq!(ra, RegisterRule::Offset(-8));
        assert!(matches!(bp, RegisterRule::Expression(_)), "{bp:?}");
        let (_, ra, _) = row(&elf, 0x1010);
        assert_eq!(ra, RegisterRule::Undefined);

        let file = object::File::parse(&*elf).unwrap();
        let f = file.symbols().find(|s| s.name() == Ok("f")).unwrap();
        assert_eq!((f.address(), f.size()), (0x1000, 0x20));
        assert_eq!(file.kind(), object::ObjectKind::Executable);
    }

    #[test]
    fn a_pt_regs_frame_restores_the_interrupted_registers() {
        let regs = OrcEntry {
            kind: OrcKind::Regs,
            ..call(OrcReg::Sp, 0, OrcReg::Undefined, 0)
        };
        let cfi = instructions(&regs);
        // CFA = the saved RSP; RA and RBP where pt_regs keeps them.
        assert!(matches!(cfi[0], Cfi::CfaExpression(_)));
        assert!(matches!(cfi[1], Cfi::Expression(X86_64::RA, _)));
        assert!(cfi
            .iter()
            .any(|c| matches!(c, Cfi::Expression(X86_64::RBP, _))));
        // An ORC number not read ends the backtrace rather than guess.
        let other = OrcEntry {
            kind: OrcKind::Other(3),
            ..regs
        };
        assert!(instructions(&other).contains(&Cfi::Undefined(X86_64::RA)));
    }
}
