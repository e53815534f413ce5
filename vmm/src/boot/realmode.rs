//! Raw 16-bit images: copied to a load address and entered in real mode,
//! like a boot sector.

use vm_memory::{Bytes, GuestAddress};

use crate::cpu::entry::EntryState;
use crate::error::{Error, Result};
use crate::memory::{check_fits, GuestRam};

use super::{BootPlan, Image};

/// Highest address real mode can reach (segment 0xFFFF, offset 0xFFFF).
const REAL_MODE_LIMIT: u64 = 0x10_FFF0;

pub fn load(ram: &GuestRam, image: &Image, load_addr: u64) -> Result<BootPlan> {
    let len = image.bytes.len() as u64;
    if len == 0 {
        return Err(image.format_error("the real-mode image is empty"));
    }
    if load_addr + len > REAL_MODE_LIMIT {
        return Err(image.format_error(format!(
            "a {len}-byte real-mode image at {load_addr:#x} reaches past 1 MiB + 64 KiB, \
             which real mode cannot address"
        )));
    }
    check_fits(
        ram,
        &format!("{} at {load_addr:#x}", image.name),
        load_addr,
        len,
    )?;
    ram.write_slice(&image.bytes, GuestAddress(load_addr))
        .map_err(|source| Error::GuestWrite {
            what: "the real-mode image",
            at: load_addr,
            source,
        })?;
    Ok(BootPlan {
        entry: EntryState::RealMode { load_addr },
        description: format!(
            "{}: {len}-byte real-mode image at {load_addr:#x}",
            image.name
        ),
    })
}
