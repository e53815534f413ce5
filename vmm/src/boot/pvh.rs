//! The PVH boot protocol: 32-bit protected-mode entry with `hvm_start_info`
//! in EBX, a memory map, the command line and the initrd as module 0.

use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use vm_memory::GuestAddress;

use crate::cpu::entry::EntryState;
use crate::error::{Error, Result};
use crate::memory::{layout, GuestRam};

use super::elf::ElfInfo;
use super::{load_initrd, memory_map, write_cmdline, BootPlan, Image, Initrd};

const XEN_HVM_START_MAGIC: u32 = 0x336e_c578;

/// A PVH kernel loaded, and the machine it boots on.
pub struct Guest<'a> {
    pub kernel: &'a Image,
    pub elf: &'a ElfInfo,
    pub entry: u64,
    pub initrd: Option<&'a Initrd>,
    pub cmdline: &'a str,
    /// CPUs of the machine: above one, the start info points at ACPI
    /// tables whose MADT names them.
    pub cpus: u8,
}

pub fn boot(ram: &GuestRam, guest: &Guest) -> Result<BootPlan> {
    let Guest {
        kernel,
        elf,
        entry,
        initrd,
        cmdline,
        cpus,
    } = *guest;
    write_cmdline(ram, cmdline, layout::CMDLINE_MAX)?;
    let memmap: Vec<hvm_memmap_table_entry> = memory_map(ram)
        .iter()
        .map(|e| hvm_memmap_table_entry {
            addr: e.addr,
            size: e.size,
            type_: e.kind,
            reserved: 0,
        })
        .collect();
    let mut start_info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC,
        version: 1,
        cmdline_paddr: layout::CMDLINE,
        memmap_paddr: layout::PVH_MEMMAP,
        memmap_entries: memmap.len() as u32,
        rsdp_paddr: match cpus {
            0 | 1 => 0,
            n => super::acpi::write(ram, n)?,
        },
        ..Default::default()
    };
    let mut params = BootParams::new(&start_info, GuestAddress(layout::PVH_START_INFO));
    let mut initrd_note = String::new();
    if let Some(initrd) = initrd {
        let (paddr, size) = load_initrd(ram, initrd, elf.phys_end, u64::MAX)?;
        start_info.nr_modules = 1;
        start_info.modlist_paddr = layout::PVH_MODLIST;
        params = BootParams::new(&start_info, GuestAddress(layout::PVH_START_INFO));
        params.set_modules(
            &[hvm_modlist_entry {
                paddr,
                size,
                ..Default::default()
            }],
            GuestAddress(layout::PVH_MODLIST),
        );
        initrd_note = format!(", initrd {size} bytes at {paddr:#x}");
    }
    params.set_sections(&memmap, GuestAddress(layout::PVH_MEMMAP));
    PvhBootConfigurator::write_bootparams(&params, ram).map_err(|source| Error::BootParams {
        protocol: "PVH",
        source,
    })?;
    Ok(BootPlan {
        entry: EntryState::Protected32 {
            entry,
            start_info: layout::PVH_START_INFO,
        },
        description: format!(
            "{}: PVH ELF at {:#x}..{:#x}, entry {entry:#x}{initrd_note}",
            kernel.name, elf.phys_start, elf.phys_end
        ),
    })
}
