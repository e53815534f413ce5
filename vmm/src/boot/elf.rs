//! What vtrace needs to know of an ELF kernel before loading it: its class,
//! where its segments land, and whether it has a PVH entry note. Loading
//! itself is linux-loader's.

use std::io::Cursor;

use linux_loader::loader::{elf::Elf, elf::PvhBootCapability, KernelLoader};

use vm_memory::GuestAddress;

use crate::error::Result;
use crate::memory::{check_fits, GuestRam, HIGH_MEMORY_START};

use super::Image;

const PT_LOAD: u32 = 1;

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

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(off..off.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(off..off.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(off..off.checked_add(8)?)?.try_into().ok()?,
    ))
}

impl ElfInfo {
    /// Reads the header and program headers. The error is a reason for the
    /// user.
    pub fn parse(bytes: &[u8]) -> std::result::Result<ElfInfo, String> {
        if bytes.get(4) != Some(&2) {
            return Err("it is a 32-bit ELF; vtrace boots 64-bit ELF kernels".into());
        }
        if u16_at(bytes, 18) != Some(62) {
            return Err("it is an ELF for another architecture than x86-64".into());
        }
        let truncated = || "its ELF program headers are truncated".to_string();
        let entry = u64_at(bytes, 24).ok_or_else(truncated)?;
        let phoff = u64_at(bytes, 32).ok_or_else(truncated)? as usize;
        let phentsize = usize::from(u16_at(bytes, 54).ok_or_else(truncated)?);
        let phnum = usize::from(u16_at(bytes, 56).ok_or_else(truncated)?);
        let (mut start, mut end) = (u64::MAX, 0u64);
        for i in 0..phnum {
            let ph = phoff
                .checked_add(i.checked_mul(phentsize).ok_or_else(truncated)?)
                .ok_or_else(truncated)?;
            if u32_at(bytes, ph).ok_or_else(truncated)? != PT_LOAD {
                continue;
            }
            let paddr = u64_at(bytes, ph.saturating_add(24)).ok_or_else(truncated)?;
            let memsz = u64_at(bytes, ph.saturating_add(40)).ok_or_else(truncated)?;
            start = start.min(paddr);
            end = end.max(paddr.checked_add(memsz).ok_or_else(truncated)?);
        }
        if end == 0 {
            return Err("it has no loadable segments".into());
        }
        Ok(ElfInfo {
            entry,
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
