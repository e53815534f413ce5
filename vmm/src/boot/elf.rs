//! What vtrace needs to know of an ELF kernel before loading it: its class,
//! where its segments land, and whether it has a PVH entry note. Loading
//! itself is linux-loader's.

use std::io::Cursor;

use linux_loader::loader::{elf::Elf, elf::PvhBootCapability, KernelLoader};

use vm_memory::GuestAddress;

use crate::error::Result;
use crate::memory::{check_fits, GuestRam, HIGH_MEMORY_START};

use super::Image;

/// Facts about an ELF kernel image.
#[derive(Clone, Debug)]
pub struct ElfInfo {
    pub entry: u64,
    /// Lowest and one-past-highest physical address of its PT_LOAD segments.
    pub phys_start: u64,
    pub phys_end: u64,
}

/// An ELF kernel in guest memory.
#[derive(Clone, Debug)]
pub struct LoadedElf {
    pub info: ElfInfo,
    /// PVH entry from the XEN_ELFNOTE_PHYS32_ENTRY note, if present.
    pub pvh_entry: Option<u64>,
}

impl ElfInfo {
    /// Reads the header and program headers. The error is a reason for the
    /// user.
    pub fn parse(bytes: &[u8]) -> std::result::Result<ElfInfo, String> {
        use object::read::elf::{ElfFile64, FileHeader, ProgramHeader};
        if bytes.get(4) == Some(&1) {
            return Err("it is a 32-bit ELF; vtrace boots 64-bit ELF kernels".into());
        }
        let file = ElfFile64::<object::Endianness>::parse(bytes)
            .map_err(|e| format!("its ELF headers cannot be read: {e}"))?;
        let (header, endian) = (file.elf_header(), file.endian());
        if header.e_machine(endian) != object::elf::EM_X86_64 {
            return Err("it is an ELF for another architecture than x86-64".into());
        }
        let (mut start, mut end) = (u64::MAX, 0u64);
        for ph in file.elf_program_headers() {
            if ph.p_type(endian) != object::elf::PT_LOAD {
                continue;
            }
            let paddr = ph.p_paddr(endian);
            start = start.min(paddr);
            end = end.max(
                paddr
                    .checked_add(ph.p_memsz(endian))
                    .ok_or("a loadable segment runs past the end of memory")?,
            );
        }
        if end == 0 {
            return Err("it has no loadable segments".into());
        }
        Ok(ElfInfo {
            entry: header.e_entry(endian),
            phys_start: start,
            phys_end: end,
        })
    }

    /// Loads the segments into RAM at their physical addresses (through
    /// linux-loader, which also finds the PVH note).
    pub fn load(self, ram: &GuestRam, image: &Image) -> Result<LoadedElf> {
        if self.phys_start < HIGH_MEMORY_START {
            return Err(image.format_error(format!(
                "it loads at {:#x}, below 1 MiB, where vtrace keeps boot structures",
                self.phys_start
            )));
        }
        check_fits(
            ram,
            &format!(
                "{} (loads at {:#x}..{:#x})",
                image.name, self.phys_start, self.phys_end
            ),
            self.phys_start,
            self.phys_end - self.phys_start,
        )?;
        let loaded = Elf::load(
            ram,
            None,
            &mut Cursor::new(&image.bytes[..]),
            Some(GuestAddress(HIGH_MEMORY_START)),
        )
        .map_err(|e| image.format_error(format!("linux-loader could not load it: {e}")))?;
        let pvh_entry = match loaded.pvh_boot_cap {
            PvhBootCapability::PvhEntryPresent(addr) => Some(addr.0),
            _ => None,
        };
        Ok(LoadedElf {
            info: self,
            pvh_entry,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64-bit ELF header with one PT_LOAD program header.
    fn elf(class: u8, machine: u16, paddr: u64, memsz: u64) -> Vec<u8> {
        let mut b = vec![0u8; 64 + 56];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = class;
        b[5] = 1; // little-endian
        b[6] = 1; // version
        b[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        b[18..20].copy_from_slice(&machine.to_le_bytes());
        b[20..24].copy_from_slice(&1u32.to_le_bytes());
        b[24..32].copy_from_slice(&0x100_0000u64.to_le_bytes()); // entry
        b[32..40].copy_from_slice(&64u64.to_le_bytes()); // phoff
        b[52..54].copy_from_slice(&64u16.to_le_bytes()); // ehsize
        b[54..56].copy_from_slice(&56u16.to_le_bytes()); // phentsize
        b[56..58].copy_from_slice(&1u16.to_le_bytes()); // phnum
        let ph = &mut b[64..];
        ph[..4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        ph[24..32].copy_from_slice(&paddr.to_le_bytes());
        ph[40..48].copy_from_slice(&memsz.to_le_bytes());
        b
    }

    #[test]
    fn reads_entry_and_load_range() {
        let info = ElfInfo::parse(&elf(2, 62, 0x100_0000, 0x2000)).unwrap();
        assert_eq!(info.entry, 0x100_0000);
        assert_eq!((info.phys_start, info.phys_end), (0x100_0000, 0x100_2000));
    }

    #[test]
    fn says_why_an_elf_cannot_be_booted() {
        let why = |b: &[u8]| ElfInfo::parse(b).unwrap_err();
        assert!(why(&elf(1, 62, 0, 1)).contains("32-bit"));
        assert!(why(&elf(2, 183, 0x100_0000, 1)).contains("another architecture"));
        assert!(why(&elf(2, 62, u64::MAX, 2)).contains("past the end"));
        assert!(why(&elf(2, 62, 0x100_0000, 0x10)[..80]).contains("cannot be read"));
        let mut none = elf(2, 62, 0x100_0000, 1);
        none[64] = 0; // PT_NULL
        assert!(why(&none).contains("no loadable segments"));
    }
}
