//! Booting Linux bzImages (the file itself is read by
//! `vtrace_image::bzimage`). The compressed payload is decompressed on the host when
//! its format allows (gzip, zstd, LZ4, XZ, LZMA, bzip2) and the vmlinux
//! inside is entered directly; otherwise (LZO) the bzImage is loaded whole
//! and decompresses itself.

use std::borrow::Cow;
use std::io::Cursor;

use linux_loader::loader::{bzimage::BzImage, KernelLoader};
use vm_memory::GuestAddress;
use vtrace_image::bzimage::{payload, read_header, version_string};
use vtrace_image::decompress::{decompress, Compression};

use crate::error::Result;
use crate::memory::{check_fits, GuestRam, HIGH_MEMORY_START};

use super::elf::ElfInfo;
use super::linux::{self, LoadedKernel};
use super::{BootPlan, Image, Initrd};

/// The 64-bit entry point sits 0x200 bytes into the protected-mode kernel.
const STARTUP_64_OFFSET: u64 = 0x200;
/// xloadflags bit: the kernel has a 64-bit entry point.
const XLF_KERNEL_64: u16 = 0x1;

pub fn load(
    ram: &GuestRam,
    kernel: &Image,
    initrd: Option<&Initrd>,
    cmdline: &str,
    cpus: u8,
) -> Result<BootPlan> {
    let bytes: &[u8] = &kernel.bytes;
    let header =
        read_header(bytes).ok_or_else(|| kernel.format_error("its setup header is truncated"))?;
    if header.version < 0x020c || header.xloadflags & XLF_KERNEL_64 == 0 {
        return Err(kernel.format_error(format!(
            "it is a bzImage of boot protocol {}.{:02} without a 64-bit entry point; \
             vtrace needs protocol 2.12 or later on an x86-64 kernel",
            header.version >> 8,
            header.version & 0xff
        )));
    }
    let version = version_string(bytes, &header).unwrap_or_else(|| "unknown version".into());
    let payload = payload(bytes, &header)
        .ok_or_else(|| kernel.format_error("its compressed payload lies outside the file"))?;
    let compression = Compression::detect(payload);

    match decompress(payload, compression) {
        Some(Ok(vmlinux)) if vmlinux.starts_with(b"\x7fELF") => {
            let size = vmlinux.len();
            let inner = Image {
                name: format!("{} (vmlinux inside)", kernel.name),
                path: kernel.path.clone(),
                bytes: Cow::Owned(vmlinux),
            };
            let elf = ElfInfo::parse(&inner.bytes)
                .map_err(|r| kernel.format_error(format!("the vmlinux inside: {r}")))?
                .load(ram, &inner)?;
            linux::boot(
                ram,
                LoadedKernel {
                    entry: elf.info.entry,
                    end: elf.info.phys_end,
                    header: Some(header),
                    description: format!(
                        "{}: Linux {version}; {} payload decompressed on the host ({} MiB), \
                         64-bit entry {:#x}",
                        kernel.name,
                        compression.name(),
                        size >> 20,
                        elf.info.entry
                    ),
                },
                initrd,
                cmdline,
                cpus,
            )
        }
        Some(Ok(_)) => {
            Err(kernel.format_error("its payload does not decompress to an ELF vmlinux"))
        }
        Some(Err(e)) => Err(kernel.format_error(format!(
            "its {} payload does not decompress: {e}",
            compression.name()
        ))),
        None => {
            let init_size = u64::from(header.init_size);
            check_fits(
                ram,
                &format!(
                    "{} (needs {init_size} bytes from {HIGH_MEMORY_START:#x} to decompress)",
                    kernel.name
                ),
                HIGH_MEMORY_START,
                init_size,
            )?;
            let loaded = BzImage::load(
                ram,
                None,
                &mut Cursor::new(bytes),
                Some(GuestAddress(HIGH_MEMORY_START)),
            )
            .map_err(|e| kernel.format_error(format!("linux-loader could not load it: {e}")))?;
            let load = loaded.kernel_load.0;
            linux::boot(
                ram,
                LoadedKernel {
                    entry: load + STARTUP_64_OFFSET,
                    end: load + init_size,
                    header: loaded.setup_header.or(Some(header)),
                    description: format!(
                        "{}: Linux {version}; {} payload, decompressed by the kernel itself \
                         (slow where kernel code is emulated)",
                        kernel.name,
                        compression.name()
                    ),
                },
                initrd,
                cmdline,
                cpus,
            )
        }
    }
}
