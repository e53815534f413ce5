//! Loading a guest image into memory and choosing the CPU state to start it
//! in. Three kinds of image: a PVH ELF (the demo OS; also what QEMU and
//! Firecracker boot), a Linux bzImage (or plain vmlinux ELF) through the
//! 64-bit boot protocol, and a raw 16-bit real-mode image.

mod acpi;
mod bzimage;
mod elf;
mod linux;
mod pvh;
mod realmode;

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use linux_loader::loader::{load_cmdline, Cmdline};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::cpu::entry::EntryState;
use crate::error::{Error, Result};
use crate::memory::{layout, GuestRam, EBDA_START, HIGH_MEMORY_START, MMIO_HOLE_START};

/// The largest kernel, initrd or real-mode image read.
pub const MAX_IMAGE: u64 = 2 << 30;

/// Bytes of an image and the name to show for it.
#[derive(Clone, Debug)]
pub struct Image {
    /// A path, or a description such as "built-in demo OS".
    pub name: String,
    /// The file it was read from; `None` for an image built in.
    pub path: Option<PathBuf>,
    /// Its contents.
    pub bytes: Cow<'static, [u8]>,
}

impl Image {
    /// An image built into the binary.
    pub fn embedded(name: &str, bytes: &'static [u8]) -> Image {
        Image {
            name: name.to_string(),
            path: None,
            bytes: Cow::Borrowed(bytes),
        }
    }

    /// An image read from a file; `what` names it in errors ("kernel").
    /// Only regular files of at most [`MAX_IMAGE`] bytes are read: a
    /// device or FIFO would feed the reader without end.
    pub fn from_file(what: &'static str, path: impl Into<PathBuf>) -> Result<Image> {
        use std::io::Read;
        let path = path.into();
        let (file, len) = open_image_file(what, &path)?;
        let mut bytes = Vec::with_capacity(len as usize);
        file.take(MAX_IMAGE)
            .read_to_end(&mut bytes)
            .map_err(|source| Error::ImageUnreadable {
                what,
                path: path.clone(),
                source,
            })?;
        Ok(Image {
            name: path.display().to_string(),
            path: Some(path),
            bytes: Cow::Owned(bytes),
        })
    }

    fn format_error(&self, reason: impl Into<String>) -> Error {
        Error::ImageFormat {
            path: self
                .path
                .clone()
                .unwrap_or_else(|| PathBuf::from(&self.name)),
            reason: reason.into(),
        }
    }
}

/// An initial RAM disk: a file whose size is known at once and whose bytes
/// go from the file straight into guest memory once a place is found for
/// them, so one too large for the kernel or the memory is refused before
/// any of it is read, and none is held twice on the host.
#[derive(Clone, Debug)]
pub struct Initrd {
    /// The file.
    pub path: PathBuf,
    /// Its size when it was opened.
    pub len: u64,
}

impl Initrd {
    /// The initrd at `path`: a regular file of at most [`MAX_IMAGE`] bytes
    /// that can be opened for reading.
    pub fn from_file(path: impl Into<PathBuf>) -> Result<Initrd> {
        let path = path.into();
        let (_, len) = open_image_file("initrd", &path)?;
        Ok(Initrd { len, path })
    }
}

/// Opens the image file `what` at `path`: a regular file (a device or
/// FIFO would feed a reader without end) of at most [`MAX_IMAGE`] bytes;
/// gives it and its length.
fn open_image_file(what: &'static str, path: &Path) -> Result<(std::fs::File, u64)> {
    let unreadable = |source| Error::ImageUnreadable {
        what,
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if !meta.is_file() || meta.len() > MAX_IMAGE {
        return Err(unreadable(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not a regular file of at most {} MiB", MAX_IMAGE >> 20),
        )));
    }
    let file = std::fs::File::open(path).map_err(unreadable)?;
    Ok((file, meta.len()))
}

/// What to boot.
#[derive(Clone, Debug)]
pub enum BootSource {
    /// A PVH ELF, a 64-bit vmlinux ELF or a bzImage, told apart by content.
    Kernel {
        /// The kernel.
        kernel: Image,
        /// The initial RAM disk, if any.
        initrd: Option<Initrd>,
        /// The kernel's command line.
        cmdline: String,
    },
    /// A raw 16-bit image, copied to `load_addr` and entered in real mode.
    RealMode {
        /// The image.
        image: Image,
        /// Where it is copied and entered (CS:IP 0:load_addr).
        load_addr: u64,
    },
}

/// How the guest was loaded: its entry state and a line for the user.
#[derive(Clone, Debug)]
pub struct BootPlan {
    pub entry: EntryState,
    pub description: String,
}

/// Kernel command line for a Linux kernel when the user gives none: the
/// serial console (and the early one, so a kernel that stops early still
/// says something), reboot through the keyboard controller, a panic that
/// reboots (a failing kernel ends the run instead of spinning), no PCI, and
/// no local or I/O APIC: a one-CPU machine has neither.
pub const DEFAULT_LINUX_CMDLINE: &str =
    "console=ttyS0 earlyprintk=serial,ttyS0 reboot=k panic=1 pci=off nolapic noapic";

/// [`DEFAULT_LINUX_CMDLINE`] for a machine of several CPUs: each has its
/// local APIC, which Linux needs to start and signal the others, and the
/// I/O APIC routes the PIT's and the serial port's interrupts to them.
pub const DEFAULT_LINUX_SMP_CMDLINE: &str =
    "console=ttyS0 earlyprintk=serial,ttyS0 reboot=k panic=1 pci=off";

/// Added to [`DEFAULT_LINUX_CMDLINE`] with the baseline CPU profile. On some
/// KVM hosts (those that emulate kernel code) CPUID masks only partly reach
/// the guest, and Linux would use instructions the emulator lacks; these
/// switches keep it to what the baseline profile promises. The SSE levels
/// past SSE2 are among them: Linux picks its crypto code by them (the
/// SSSE3 BLAKE2s of the random driver runs `movd xmm, r32`, which KVM's
/// emulator lacks). Linux 6.1 reads at most 127 bytes of `clearcpuid=`.
pub const BASELINE_LINUX_FLAGS: &str = "noxsave nosmap nofsgsbase nopku \
     clearcpuid=popcnt,cx16,movbe,aes,smap,umip,rdtscp,rdpid,pku,fsgsbase,rdrand,\
     pni,pclmulqdq,ssse3,sse4_1,sse4_2,f16c";

/// The command line to give a Linux kernel on a machine of `cpus` CPUs
/// when the user gives none.
pub fn default_linux_cmdline(cpu: crate::CpuProfile, cpus: u8) -> String {
    let base = match cpus {
        0 | 1 => DEFAULT_LINUX_CMDLINE,
        _ => DEFAULT_LINUX_SMP_CMDLINE,
    };
    match cpu {
        crate::CpuProfile::Baseline => format!("{base} {BASELINE_LINUX_FLAGS}"),
        crate::CpuProfile::Host => base.to_string(),
    }
}

/// E820 / PVH memory types.
pub const E820_RAM: u32 = 1;
pub const E820_RESERVED: u32 = 2;

/// One entry of the memory map given to the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryMapEntry {
    pub addr: u64,
    pub size: u64,
    pub kind: u32,
}

/// The guest's memory map: low RAM, the BIOS hole, RAM up to the MMIO hole
/// and RAM above 4 GiB.
pub fn memory_map(ram: &GuestRam) -> Vec<MemoryMapEntry> {
    let mut map = vec![
        MemoryMapEntry {
            addr: 0,
            size: EBDA_START,
            kind: E820_RAM,
        },
        MemoryMapEntry {
            addr: EBDA_START,
            size: HIGH_MEMORY_START - EBDA_START,
            kind: E820_RESERVED,
        },
    ];
    for region in ram.iter() {
        let start = region.start_addr().raw_value().max(HIGH_MEMORY_START);
        let end = region.start_addr().raw_value() + region.len();
        if end > start {
            map.push(MemoryMapEntry {
                addr: start,
                size: end - start,
                kind: E820_RAM,
            });
        }
    }
    map
}

/// Where an initrd of `len` bytes goes: page-aligned, as high as possible
/// below `limit` and below the MMIO hole, above `kernel_end`.
fn place_initrd(ram: &GuestRam, len: u64, kernel_end: u64, limit: u64) -> Result<u64> {
    let ceiling = limit.min(MMIO_HOLE_START);
    let top = crate::memory::low_ram_end(ram).min(ceiling);
    let addr = top.checked_sub(len).map(|a| a & !0xfff);
    match addr {
        Some(a) if a >= kernel_end => Ok(a),
        // Where RAM reaches the ceiling, more of it would not help.
        _ if top == ceiling => Err(Error::InitrdTooLarge {
            len,
            room: ceiling.saturating_sub(kernel_end),
            ceiling,
        }),
        _ => Err(Error::MemoryTooSmall {
            what: format!("the kernel and a {len}-byte initrd"),
            need: kernel_end + len,
            have: crate::memory::ram_size(ram),
        }),
    }
}

/// Writes the NUL-terminated command line at its fixed place; returns its
/// length without the NUL.
fn write_cmdline(ram: &GuestRam, cmdline: &str, max: usize) -> Result<usize> {
    let capacity = max.min(layout::CMDLINE_MAX);
    let rejected = |source| Error::CommandLine {
        source,
        max: capacity.saturating_sub(1),
    };
    let mut line = Cmdline::new(capacity).map_err(rejected)?;
    if !cmdline.is_empty() {
        line.insert_str(cmdline).map_err(rejected)?;
    }
    load_cmdline(ram, GuestAddress(layout::CMDLINE), &line).map_err(Error::CommandLineWrite)?;
    Ok(cmdline.len())
}

/// Reads the initrd high into low memory; returns (address, length).
fn load_initrd(ram: &GuestRam, initrd: &Initrd, kernel_end: u64, limit: u64) -> Result<(u64, u64)> {
    let len = initrd.len;
    let addr = place_initrd(ram, len, kernel_end, limit)?;
    let unreadable = |source| Error::ImageUnreadable {
        what: "initrd",
        path: initrd.path.clone(),
        source,
    };
    let mut file = std::fs::File::open(&initrd.path).map_err(unreadable)?;
    let mut done = 0u64;
    while done < len {
        // A read gives what the file gives at once; go on to the end.
        let at = GuestAddress(addr + done);
        let want = usize::try_from(len - done).unwrap_or(usize::MAX);
        let got = ram
            .read_volatile_from(at, &mut file, want)
            .map_err(|source| match source {
                vm_memory::GuestMemoryError::IOError(e) => unreadable(e),
                source => Error::GuestWrite {
                    what: "the initrd",
                    at: at.raw_value(),
                    source,
                },
            })?;
        if got == 0 {
            return Err(unreadable(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("it ended after {done} of its {len} bytes while being read"),
            )));
        }
        done += got as u64;
    }
    Ok((addr, len))
}

/// Loads `source` into `ram` for a machine of `cpus` CPUs and says how to
/// enter it.
pub fn load(ram: &GuestRam, source: &BootSource, cpus: u8) -> Result<BootPlan> {
    // Where a guest has no way to learn of more CPUs, or no way to use them.
    let one_cpu_only = |image: &Image, what: &'static str| match cpus {
        0 | 1 => Ok(()),
        cpus => Err(Error::SeveralCpus {
            path: image
                .path
                .clone()
                .unwrap_or_else(|| PathBuf::from(&image.name)),
            what,
            cpus,
        }),
    };
    match source {
        BootSource::RealMode { image, load_addr } => {
            one_cpu_only(image, "a real-mode image")?;
            realmode::load(ram, image, *load_addr)
        }
        BootSource::Kernel {
            kernel,
            initrd,
            cmdline,
        } => {
            let bytes: &[u8] = &kernel.bytes;
            if bytes.starts_with(b"\x7fELF") {
                let elf = elf::ElfInfo::parse(bytes)
                    .map_err(|r| kernel.format_error(r))?
                    .load(ram, kernel)?;
                match elf.pvh_entry {
                    Some(entry) => {
                        let guest = pvh::Guest {
                            kernel,
                            elf: &elf.info,
                            entry,
                            initrd: initrd.as_ref(),
                            cmdline,
                            cpus,
                        };
                        pvh::boot(ram, &guest)
                    }
                    None => linux::boot(
                        ram,
                        linux::LoadedKernel {
                            entry: elf.info.entry,
                            end: elf.info.phys_end,
                            header: None,
                            description: format!(
                                "{}: 64-bit ELF at {:#x}..{:#x}, Linux boot protocol entry {:#x}",
                                kernel.name, elf.info.phys_start, elf.info.phys_end, elf.info.entry
                            ),
                        },
                        initrd.as_ref(),
                        cmdline,
                        cpus,
                    ),
                }
            } else if vtrace_image::bzimage::is_bzimage(bytes) {
                bzimage::load(ram, kernel, initrd.as_ref(), cmdline, cpus)
            } else {
                Err(kernel.format_error(
                    "it is neither an ELF kernel (PVH or 64-bit vmlinux) nor a Linux bzImage \
                     (no ELF magic, no \"HdrS\" at 0x202); for a raw 16-bit image use --real-mode",
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_ram;

    #[test]
    fn memory_map_covers_ram_around_holes() {
        let ram = create_guest_ram(4 << 30).unwrap();
        let map = memory_map(&ram);
        let ram_total: u64 = map
            .iter()
            .filter(|e| e.kind == E820_RAM)
            .map(|e| e.size)
            .sum();
        assert_eq!(ram_total, (4 << 30) - (HIGH_MEMORY_START - EBDA_START));
        assert_eq!(map.last().unwrap().addr, 1 << 32);
    }

    #[test]
    fn initrd_goes_high_but_not_over_the_kernel() {
        let ram = create_guest_ram(64 << 20).unwrap();
        let at = place_initrd(&ram, 0x1800, 0x200000, u64::MAX).unwrap();
        assert_eq!(at, (64 << 20) - 0x2000);
        assert!(matches!(
            place_initrd(&ram, 63 << 20, 0x200000, u64::MAX),
            Err(Error::MemoryTooSmall { .. })
        ));
        // Past the kernel's initrd limit, more memory would not help, and
        // the error says so rather than asking for more.
        assert!(matches!(
            place_initrd(&ram, 48 << 20, 0x200000, 32 << 20),
            Err(Error::InitrdTooLarge { .. })
        ));
    }

    #[test]
    fn an_initrd_is_placed_before_it_is_read_and_read_whole() {
        let ram = create_guest_ram(64 << 20).unwrap();
        // Too large: refused without opening the file (which is not there).
        let absent = Initrd {
            path: "/nonexistent/initrd".into(),
            len: 2000 << 20,
        };
        assert!(matches!(
            load_initrd(&ram, &absent, 0x200000, 32 << 20),
            Err(Error::InitrdTooLarge { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("initrd");
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let initrd = Initrd::from_file(&path).unwrap();
        let (at, len) = load_initrd(&ram, &initrd, 0x200000, u64::MAX).unwrap();
        assert_eq!(len, bytes.len() as u64);
        let mut back = vec![0u8; bytes.len()];
        ram.read_slice(&mut back, GuestAddress(at)).unwrap();
        assert_eq!(back, bytes);
        // A file that shrank since it was opened is said to have.
        std::fs::write(&path, &bytes[..1000]).unwrap();
        let short = load_initrd(&ram, &initrd, 0x200000, u64::MAX).unwrap_err();
        assert!(
            short
                .to_string()
                .contains("ended after 1000 of its 300000 bytes"),
            "{short}"
        );
    }

    #[test]
    fn unknown_format_is_reported() {
        let ram = create_guest_ram(16 << 20).unwrap();
        let source = BootSource::Kernel {
            kernel: Image::embedded("junk", b"not a kernel at all"),
            initrd: None,
            cmdline: String::new(),
        };
        match load(&ram, &source, 1) {
            Err(Error::ImageFormat { reason, .. }) => assert!(reason.contains("neither")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn several_cpus_boot_pvh_kernels_only() {
        let ram = create_guest_ram(16 << 20).unwrap();
        let real = BootSource::RealMode {
            image: Image::embedded("boot sector", &[0xf4; 16]),
            load_addr: 0x7c00,
        };
        assert!(load(&ram, &real, 1).is_ok());
        match load(&ram, &real, 2) {
            Err(e @ Error::SeveralCpus { what, cpus: 2, .. }) => {
                assert_eq!(what, "a real-mode image");
                assert!(e.to_string().contains("--cpus 1"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}
