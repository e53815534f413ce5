//! The Linux 64-bit boot protocol: `boot_params` (the "zero page") with the
//! setup header, e820 map, command line and initrd; entry in long mode with
//! RSI pointing at it.

use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use vm_memory::GuestAddress;

use crate::cpu::entry::EntryState;
use crate::error::LayoutFault;
use crate::error::{Error, Result};
use crate::memory::{layout, GuestRam};

use super::{load_initrd, memory_map, write_cmdline, BootPlan, Initrd};

const HDRS_MAGIC: u32 = 0x5372_6448;
const LOADED_HIGH: u8 = 0x01;
const CAN_USE_HEAP: u8 = 0x80;
/// Highest initrd address when the header does not say (protocol < 2.03).
const DEFAULT_INITRD_ADDR_MAX: u64 = 0x37ff_ffff;

/// A kernel already in memory, waiting for its boot parameters.
pub struct LoadedKernel {
    /// 64-bit entry point.
    pub entry: u64,
    /// One past the last byte the kernel may use (initrd goes above).
    pub end: u64,
    /// Setup header from the bzImage, if the kernel came from one.
    pub header: Option<setup_header>,
    /// How it got there, for the user.
    pub description: String,
}

/// Writes `boot_params` (and the ACPI tables of a machine of `cpus` CPUs)
/// and returns the plan to enter `kernel`.
pub fn boot(
    ram: &GuestRam,
    kernel: LoadedKernel,
    initrd: Option<&Initrd>,
    cmdline: &str,
    cpus: u8,
) -> Result<BootPlan> {
    let mut params = boot_params::default();
    if let Some(header) = kernel.header {
        params.hdr = header;
    }
    let hdr = &mut params.hdr;
    hdr.boot_flag = 0xaa55;
    hdr.header = HDRS_MAGIC;
    hdr.type_of_loader = 0xff;
    hdr.loadflags |= LOADED_HIGH | CAN_USE_HEAP;
    hdr.heap_end_ptr = 0xfe00;
    if hdr.kernel_alignment == 0 {
        hdr.kernel_alignment = 0x100_0000;
    }
    let cmdline_max = match hdr.cmdline_size {
        0 => layout::CMDLINE_MAX,
        n => (n as usize).saturating_add(1),
    };
    write_cmdline(ram, cmdline, cmdline_max)?;
    hdr.cmd_line_ptr = layout::CMDLINE as u32;
    hdr.cmdline_size = cmdline.len() as u32 + 1;

    let mut initrd_note = String::new();
    if let Some(initrd) = initrd {
        let limit = match hdr.initrd_addr_max {
            0 => DEFAULT_INITRD_ADDR_MAX,
            n => u64::from(n),
        } + 1;
        let (addr, len) = load_initrd(ram, initrd, kernel.end, limit)?;
        hdr.ramdisk_image = addr as u32;
        hdr.ramdisk_size = len as u32;
        initrd_note = format!(", initrd {len} bytes at {addr:#x}");
    }

    let map = memory_map(ram);
    if map.len() > params.e820_table.len() {
        return Err(Error::BootLayout(LayoutFault::MemoryMap(map.len())));
    }
    for (slot, e) in params.e820_table.iter_mut().zip(&map) {
        *slot = boot_e820_entry {
            addr: e.addr,
            size: e.size,
            r#type: e.kind,
        };
    }
    params.e820_entries = map.len() as u8;
    params.acpi_rsdp_addr = super::acpi::write(ram, cpus)?;

    LinuxBootConfigurator::write_bootparams(
        &BootParams::new(&params, GuestAddress(layout::ZERO_PAGE)),
        ram,
    )
    .map_err(|source| Error::BootParams {
        protocol: "Linux",
        source,
    })?;
    Ok(BootPlan {
        entry: EntryState::Long64 {
            entry: kernel.entry,
            boot_params: layout::ZERO_PAGE,
        },
        description: format!("{}{initrd_note}", kernel.description),
    })
}
