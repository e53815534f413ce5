//! Guest physical memory and the fixed places boot structures go.
//!
//! RAM is anonymous `MAP_NORESERVE` memory (vm-memory's default), so a guest
//! given 4 GiB costs the host only the pages it touches. Above 3 GiB the
//! address space has a hole (where real machines put device memory); RAM
//! asked for beyond that starts again at 4 GiB.

use vm_memory::{Address, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::error::{Error, Result};

/// The guest's RAM.
pub type GuestRam = GuestMemoryMmap<()>;

/// Start of the hole below 4 GiB.
pub const MMIO_HOLE_START: u64 = 0xC000_0000;
/// End of that hole.
pub const MMIO_HOLE_END: u64 = 0x1_0000_0000;
/// End of conventional memory; from here to 1 MiB is BIOS/EBDA territory.
pub const EBDA_START: u64 = 0x9_FC00;
/// Start of high memory.
pub const HIGH_MEMORY_START: u64 = 0x10_0000;

/// Where the VMM puts its boot structures (all below 640 KiB, unused by the
/// images vtrace loads: the demo OS and Linux load at 1 MiB or above).
pub mod layout {
    /// Boot GDT for protected- and long-mode entries.
    pub const BOOT_GDT: u64 = 0x500;
    /// An empty IDT, so a stray early interrupt shuts down loudly.
    pub const BOOT_IDT: u64 = 0x520;
    /// PVH `hvm_start_info`.
    pub const PVH_START_INFO: u64 = 0x6000;
    /// PVH module list (the initrd).
    pub const PVH_MODLIST: u64 = 0x6040;
    /// PVH memory map.
    pub const PVH_MEMMAP: u64 = 0x6100;
    /// Linux `boot_params` ("zero page").
    pub const ZERO_PAGE: u64 = 0x7000;
    /// Top of the stack a 64-bit Linux entry starts on.
    pub const BOOT_STACK_TOP: u64 = 0x8ff0;
    /// PML4 of the identity map for the 64-bit Linux entry.
    pub const PML4: u64 = 0x9000;
    /// Its PDPT.
    pub const PDPT: u64 = 0xa000;
    /// Its page directory (1 GiB in 2 MiB pages).
    pub const PD: u64 = 0xb000;
    /// Kernel command line.
    pub const CMDLINE: u64 = 0x2_0000;
    /// Longest command line vtrace passes.
    pub const CMDLINE_MAX: usize = 4096;
}

/// The RAM region at guest-physical 0, where nearly every read the
/// tracer makes lands (instructions, page tables, stacks), as a host
/// address: vm-memory's volatile slices cost some 90 instructions a read,
/// and the engine reads twice a step.
#[derive(Clone, Copy)]
pub(crate) struct LowRam {
    host: *const u8,
    len: u64,
}

impl LowRam {
    /// `ram`'s region at 0, if it has one.
    pub(crate) fn of(ram: &GuestRam) -> Option<Self> {
        let region = ram.find_region(GuestAddress(0))?;
        (region.start_addr() == GuestAddress(0)).then(|| LowRam {
            host: region.as_ptr(),
            len: region.len(),
        })
    }

    /// The whole region as bytes, for the engine's CPU, which reads and
    /// writes guest RAM as the vCPU does.
    ///
    /// # Safety
    /// The `GuestRam` this was taken from must outlive the slice, and
    /// nothing may use the slice while another access to the region
    /// (the vCPU's, the VMM's) is under way.
    pub(crate) unsafe fn as_mut_slice(&self) -> &'static mut [u8] {
        // SAFETY: the region is one mapping of `len` bytes from `host`;
        // the caller vouches for its life and for the accesses.
        unsafe { std::slice::from_raw_parts_mut(self.host.cast_mut(), self.len as usize) }
    }

    /// Copies the bytes at `gpa` into `buf`; false if they are not all in
    /// the region.
    ///
    /// # Safety
    /// The `GuestRam` this was taken from must still be alive (its
    /// regions are mapped for as long as it lives, and never move).
    pub(crate) unsafe fn read(&self, gpa: u64, buf: &mut [u8]) -> bool {
        match gpa.checked_add(buf.len() as u64) {
            Some(end) if end <= self.len => {
                // SAFETY: [gpa, end) lies inside the region's mapping,
                // alive as the caller promises; `buf` is the caller's own
                // memory, so they do not overlap. Nothing writes guest
                // memory meanwhile: the vCPU is stopped at this exit, and
                // the VMM's own writes run on the vCPU thread too.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.host.add(gpa as usize),
                        buf.as_mut_ptr(),
                        buf.len(),
                    )
                };
                true
            }
            _ => false,
        }
    }
}

/// A contiguous stretch of RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RamRange {
    pub start: u64,
    pub size: u64,
}

impl RamRange {
    /// One past the last byte.
    #[cfg(test)]
    pub fn end(&self) -> u64 {
        self.start + self.size
    }
}

/// The RAM ranges for `size` bytes of guest memory, split around the hole.
pub fn ram_ranges(size: u64) -> Vec<RamRange> {
    if size <= MMIO_HOLE_START {
        vec![RamRange { start: 0, size }]
    } else {
        vec![
            RamRange {
                start: 0,
                size: MMIO_HOLE_START,
            },
            RamRange {
                start: MMIO_HOLE_END,
                size: size - MMIO_HOLE_START,
            },
        ]
    }
}

/// Smallest memory vtrace accepts: the first 1 MiB, where the boot
/// structures live (whether the image fits is checked when it is loaded).
pub const MIN_MEMORY: u64 = 1 << 20;
/// Largest memory vtrace accepts (the 4-level identity maps and e820 code
/// are written for this much; more is not useful for tracing).
pub const MAX_MEMORY: u64 = 64 << 30;

/// Reserves guest RAM (lazily: nothing is touched here).
pub fn create_guest_ram(size: u64) -> Result<GuestRam> {
    if size < MIN_MEMORY {
        return Err(Error::MemorySize(size, "vtrace needs at least 1 MiB"));
    }
    if size > MAX_MEMORY {
        return Err(Error::MemorySize(size, "vtrace allows at most 64 GiB"));
    }
    if !size.is_multiple_of(4096) {
        return Err(Error::MemorySize(size, "it must be a multiple of 4 KiB"));
    }
    let ranges: Vec<(GuestAddress, usize)> = ram_ranges(size)
        .iter()
        .map(|r| (GuestAddress(r.start), r.size as usize))
        .collect();
    GuestRam::from_ranges(&ranges).map_err(Error::Reserve)
}

/// Total RAM in bytes.
pub fn ram_size(ram: &GuestRam) -> u64 {
    ram.iter().map(|r| r.len()).sum()
}

/// One past the highest RAM address below the 4 GiB hole.
pub fn low_ram_end(ram: &GuestRam) -> u64 {
    ram.iter()
        .map(|r| r.start_addr().raw_value() + r.len())
        .filter(|end| *end <= MMIO_HOLE_START)
        .max()
        .unwrap_or(0)
}

/// Checks that `[start, start + len)` is RAM, or says what needed it.
pub fn check_fits(ram: &GuestRam, what: &str, start: u64, len: u64) -> Result<()> {
    let end = start.saturating_add(len);
    let fits = len == 0
        || ram.address_in_range(GuestAddress(end - 1)) && ram.address_in_range(GuestAddress(start));
    let contiguous = ram.iter().any(|r| {
        r.start_addr().raw_value() <= start && end <= r.start_addr().raw_value() + r.len()
    });
    if fits && contiguous {
        Ok(())
    } else {
        Err(Error::MemoryTooSmall {
            what: what.to_string(),
            need: end,
            have: ram_size(ram),
        })
    }
}

/// Reads guest memory by guest-virtual address, through the guest's current
/// page tables. Implemented over KVM for the VM and by tests directly.
pub trait GuestVirtualMemory {
    /// Fills `buf` from `gva`; fails if any byte is not mapped to RAM.
    fn read_virtual(&self, gva: u64, buf: &mut [u8]) -> std::result::Result<(), BadAddress>;
}

/// A guest-virtual address that does not translate to guest RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadAddress(pub u64);

/// Guest memory by linear address, for the IDT, TSS, GDT and stack.
pub trait LinearMemory {
    /// Fills `buf` from linear address `addr`; the address that failed.
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::result::Result<(), u64>;
    /// Writes `data` at linear address `addr`; the address that failed.
    fn write(&self, addr: u64, data: &[u8]) -> std::result::Result<(), u64>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_memory_is_one_range() {
        assert_eq!(
            ram_ranges(256 << 20),
            vec![RamRange {
                start: 0,
                size: 256 << 20
            }]
        );
    }

    #[test]
    fn large_memory_skips_the_hole() {
        let r = ram_ranges(4 << 30);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].end(), MMIO_HOLE_START);
        assert_eq!(r[1].start, MMIO_HOLE_END);
        assert_eq!(r[0].size + r[1].size, 4 << 30);
    }

    #[test]
    fn rejects_sizes_out_of_range() {
        assert!(matches!(create_guest_ram(4096), Err(Error::MemorySize(..))));
        assert!(matches!(
            create_guest_ram((2 << 20) + 1),
            Err(Error::MemorySize(..))
        ));
    }

    #[test]
    fn check_fits_reports_need() {
        let ram = create_guest_ram(4 << 20).unwrap();
        assert!(check_fits(&ram, "x", 0x100000, 0x1000).is_ok());
        match check_fits(&ram, "kernel", 0x300000, 0x200000) {
            Err(Error::MemoryTooSmall { need, .. }) => assert_eq!(need, 0x500000),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn low_ram_reads_what_vm_memory_reads_and_nothing_past_the_region() {
        use vm_memory::Bytes;
        let ram = create_guest_ram(4 << 20).unwrap();
        ram.write_slice(&[1, 2, 3, 4, 5], GuestAddress(0x1ffe))
            .unwrap();
        let last = (4u64 << 20) - 2;
        ram.write_slice(&[0xaa, 0xbb], GuestAddress(last)).unwrap();
        let low = LowRam::of(&ram).unwrap();
        // SAFETY: `ram` outlives every call.
        let read = |gpa: u64, buf: &mut [u8]| unsafe { low.read(gpa, buf) };
        let mut buf = [0u8; 5];
        assert!(read(0x1ffe, &mut buf));
        assert_eq!(buf, [1, 2, 3, 4, 5], "across a page");
        let mut two = [0u8; 2];
        assert!(read(last, &mut two));
        assert_eq!(two, [0xaa, 0xbb], "the region's last bytes");
        let mut three = [0u8; 3];
        assert!(!read(last, &mut three), "one byte past");
        assert!(!read(u64::MAX - 1, &mut three), "wraps");
    }
}
