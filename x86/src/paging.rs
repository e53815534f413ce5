//! Page-table walks: real mode, 32-bit, PAE, 4-level and 5-level paging,
//! over any [`PhysicalMemory`], with a small cache of translations that is
//! dropped whenever CR0, CR3, CR4 or EFER change, or the guest flushes its
//! TLB (INVLPG).

use crate::facts::cr0::PG as CR0_PG;
use crate::facts::cr4::LA57 as CR4_LA57;
use crate::facts::cr4::PAE as CR4_PAE;
use crate::facts::cr4::PSE as CR4_PSE;
use crate::facts::efer::LMA as EFER_LMA;
use crate::facts::pte::ADDR as ADDR_MASK;
use crate::facts::pte::P as PRESENT;
use crate::facts::pte::PS as PAGE_SIZE_BIT;
use crate::registers::SpecialRegisters;

/// A machine's physical memory as a page walk reads it: the one question
/// a walker asks, so that the VMM's guest RAM, an engine's and a test's
/// flat vector all serve.
pub trait PhysicalMemory {
    /// Reads `buf.len()` bytes at physical address `gpa`; false if any of
    /// them is not RAM.
    fn read_physical(&self, gpa: u64, buf: &mut [u8]) -> bool;
}
/// Translations the cache holds: direct-mapped, as a TLB, because it is
/// looked up on every step (the instruction fetch) and a hash map's
/// hashing cost more than the walks it saved.
const CACHE_SLOTS: usize = 1024;

/// A tag no page has (pages are 4 KiB aligned).
const EMPTY: u64 = 1;

/// A cached translation: the linear page, its physical page and access.
#[derive(Clone, Copy, Debug)]
struct Entry {
    page: u64,
    phys: u64,
    access: PageAccess,
}

const EMPTY_ENTRY: Entry = Entry {
    page: EMPTY,
    phys: 0,
    access: ANY_ACCESS,
};

/// The cache slot of linear page `page`: low page-number bits, folded
/// with higher ones so a kernel's and a process's pages at the same low
/// bits tend to part.
fn slot(page: u64) -> usize {
    (((page >> 12) ^ (page >> 24)) as usize) & (CACHE_SLOTS - 1)
}

/// Translates linear addresses with the guest's own page tables.
pub struct Walker {
    key: (u64, u64, u64, u64),
    cache: Box<[Entry; CACHE_SLOTS]>,
}

impl std::fmt::Debug for Walker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Walker").finish_non_exhaustive()
    }
}

impl Default for Walker {
    fn default() -> Self {
        Walker {
            key: (0, 0, 0, 0),
            cache: Box::new([EMPTY_ENTRY; CACHE_SLOTS]),
        }
    }
}

/// What the paging structures allow on a mapped page, all levels
/// combined. Outside 4- and 5-level paging everything is allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageAccess {
    /// Writes are allowed (R/W set at every level).
    pub writable: bool,
    /// User mode may touch it (U/S set at every level).
    pub user: bool,
    /// Instructions may be fetched from it (XD clear at every level).
    pub executable: bool,
    /// The accessed bit is set at every level (a walk through it writes
    /// no paging entry). Only as the tables were when it was walked.
    pub accessed: bool,
}

const ANY_ACCESS: PageAccess = PageAccess {
    writable: true,
    user: true,
    executable: true,
    accessed: true,
};
use crate::facts::pte::A as ACCESSED;
use crate::facts::pte::RW as WRITABLE;
use crate::facts::pte::US as USER;
use crate::facts::pte::XD as NO_EXECUTE;

fn read_u64(cpu: &dyn PhysicalMemory, gpa: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    cpu.read_physical(gpa, &mut b)
        .then(|| u64::from_le_bytes(b))
}

fn read_u32(cpu: &dyn PhysicalMemory, gpa: u64) -> Option<u64> {
    let mut b = [0u8; 4];
    cpu.read_physical(gpa, &mut b)
        .then(|| u64::from(u32::from_le_bytes(b)))
}

impl Walker {
    /// Forgets every cached translation.
    pub fn flush(&mut self) {
        self.cache.fill(EMPTY_ENTRY);
    }

    /// Guest-physical address of `linear`, or None if it is not mapped.
    #[inline]
    pub fn translate(
        &mut self,
        cpu: &dyn PhysicalMemory,
        sregs: &SpecialRegisters,
        linear: u64,
    ) -> Option<u64> {
        self.lookup(cpu, sregs, linear).map(|(phys, _)| phys)
    }

    /// What the guest's paging allows at `linear`; None if not mapped.
    #[inline]
    pub fn access(
        &mut self,
        cpu: &dyn PhysicalMemory,
        sregs: &SpecialRegisters,
        linear: u64,
    ) -> Option<PageAccess> {
        self.lookup(cpu, sregs, linear).map(|(_, access)| access)
    }

    /// [`Walker::access`] from the page tables as they are now: the guest
    /// may have widened a page's permissions without flushing its TLB (as
    /// a CPU that then faults spuriously permits), so a cached denial is
    /// never final.
    pub fn access_now(
        &mut self,
        cpu: &dyn PhysicalMemory,
        sregs: &SpecialRegisters,
        linear: u64,
    ) -> Option<PageAccess> {
        let page = linear & !0xfff;
        let entry = &mut self.cache[slot(page)];
        if entry.page == page {
            *entry = EMPTY_ENTRY;
        }
        self.access(cpu, sregs, linear)
    }

    /// A hit is a handful of instructions, inlined where the engine asks
    /// (twice a step); misses and flushes are out of line.
    #[inline]
    fn lookup(
        &mut self,
        cpu: &dyn PhysicalMemory,
        sregs: &SpecialRegisters,
        linear: u64,
    ) -> Option<(u64, PageAccess)> {
        let key = (sregs.cr0, sregs.cr3, sregs.cr4, sregs.efer);
        if key != self.key {
            self.rekey(key);
        }
        let page = linear & !0xfff;
        let entry = &self.cache[slot(page)];
        if entry.page == page {
            return Some((entry.phys | (linear & 0xfff), entry.access));
        }
        self.miss(cpu, sregs, linear)
    }

    #[cold]
    fn rekey(&mut self, key: (u64, u64, u64, u64)) {
        self.key = key;
        self.flush();
    }

    #[inline(never)]
    fn miss(
        &mut self,
        cpu: &dyn PhysicalMemory,
        sregs: &SpecialRegisters,
        linear: u64,
    ) -> Option<(u64, PageAccess)> {
        let page = linear & !0xfff;
        let (phys, access) = walk(cpu, sregs, page)?;
        self.cache[slot(page)] = Entry {
            page,
            phys: phys & !0xfff,
            access,
        };
        Some((phys | (linear & 0xfff), access))
    }

    /// Reads `buf.len()` bytes at `linear`, page by page. Returns how many
    /// bytes could be read before an unmapped page.
    #[inline]
    pub fn read(
        &mut self,
        cpu: &dyn PhysicalMemory,
        sregs: &SpecialRegisters,
        linear: u64,
        buf: &mut [u8],
    ) -> usize {
        // Nearly every read (an instruction, an operand) is inside one
        // page: one translation, one read.
        if (linear & 0xfff) as usize + buf.len() <= 4096 {
            return match self.translate(cpu, sregs, linear) {
                Some(phys) if cpu.read_physical(phys, buf) => buf.len(),
                _ => 0,
            };
        }
        read_pages(cpu, linear, buf, |at| self.translate(cpu, sregs, at))
    }
}

/// Walks of the page tables as they are now, no cache (whether a walk
/// would set an accessed bit is the tables' of this moment, and another
/// CPU may have changed them since a [`Walker`] cached a translation),
/// but each linear page walked once in one look at memory that nothing
/// changes meanwhile: whether a step may run beside another CPU's reads
/// the fetch's page again for the next instruction. Dropped after the
/// look.
#[derive(Debug)]
pub struct WalksNow {
    /// The pages walked so far, as [`Walker`]'s cache keeps them.
    seen: [Entry; 4],
    /// Where the next walk is kept (the oldest goes).
    next: usize,
}

impl Default for WalksNow {
    fn default() -> Self {
        WalksNow {
            seen: [EMPTY_ENTRY; 4],
            next: 0,
        }
    }
}

impl WalksNow {
    /// The physical address of `linear` and what paging allows there;
    /// from this look's walks where it walked the page.
    pub fn walk(
        &mut self,
        cpu: &dyn PhysicalMemory,
        sregs: &SpecialRegisters,
        linear: u64,
    ) -> Option<(u64, PageAccess)> {
        let page = linear & !0xfff;
        if let Some(e) = self.seen.iter().find(|e| e.page == page) {
            return Some((e.phys | (linear & 0xfff), e.access));
        }
        let (phys, access) = walk(cpu, sregs, linear)?;
        self.seen[self.next] = Entry {
            page,
            phys: phys & !0xfff,
            access,
        };
        self.next = (self.next + 1) % self.seen.len();
        Some((phys, access))
    }

    /// [`Walker::read`] through this look's walks; how many bytes could
    /// be read.
    pub fn read(
        &mut self,
        cpu: &dyn PhysicalMemory,
        sregs: &SpecialRegisters,
        linear: u64,
        buf: &mut [u8],
    ) -> usize {
        read_pages(cpu, linear, buf, |at| {
            self.walk(cpu, sregs, at).map(|(phys, _)| phys)
        })
    }
}

/// Reads `buf.len()` bytes at `linear`, page by page, each page's
/// physical address from `translate`; how many could be read before a
/// page that is not mapped or not RAM.
fn read_pages(
    cpu: &dyn PhysicalMemory,
    linear: u64,
    buf: &mut [u8],
    mut translate: impl FnMut(u64) -> Option<u64>,
) -> usize {
    let mut done = 0;
    while done < buf.len() {
        let at = linear.wrapping_add(done as u64);
        let Some(phys) = translate(at) else {
            break;
        };
        let n = ((4096 - (at & 0xfff)) as usize).min(buf.len() - done);
        if !cpu.read_physical(phys, &mut buf[done..done + n]) {
            break;
        }
        done += n;
    }
    done
}

/// One walk, no cache.
fn walk(
    cpu: &dyn PhysicalMemory,
    sregs: &SpecialRegisters,
    linear: u64,
) -> Option<(u64, PageAccess)> {
    if sregs.cr0 & CR0_PG == 0 {
        return Some((linear & 0xffff_ffff, ANY_ACCESS));
    }
    if sregs.efer & EFER_LMA != 0 {
        let levels = if sregs.cr4 & CR4_LA57 != 0 { 5 } else { 4 };
        let mut table = sregs.cr3 & ADDR_MASK;
        let mut access = ANY_ACCESS;
        for level in (1..=levels).rev() {
            let shift = 12 + 9 * (level - 1);
            let entry = read_u64(cpu, table + ((linear >> shift) & 0x1ff) * 8)?;
            if entry & PRESENT == 0 {
                return None;
            }
            access.writable &= entry & WRITABLE != 0;
            access.user &= entry & USER != 0;
            access.executable &= entry & NO_EXECUTE == 0;
            access.accessed &= entry & ACCESSED != 0;
            if (level == 2 || level == 3) && entry & PAGE_SIZE_BIT != 0 {
                let size = 1u64 << shift;
                let phys = (entry & ADDR_MASK & !(size - 1)) | (linear & (size - 1));
                return Some((phys, access));
            }
            table = entry & ADDR_MASK;
        }
        return Some((table | (linear & 0xfff), access));
    }
    if sregs.cr4 & CR4_PAE != 0 {
        let pdpte = read_u64(cpu, (sregs.cr3 & 0xffff_ffe0) + ((linear >> 30) & 3) * 8)?;
        if pdpte & PRESENT == 0 {
            return None;
        }
        let pde = read_u64(cpu, (pdpte & ADDR_MASK) + ((linear >> 21) & 0x1ff) * 8)?;
        if pde & PRESENT == 0 {
            return None;
        }
        if pde & PAGE_SIZE_BIT != 0 {
            let phys = (pde & ADDR_MASK & !0x1f_ffff) | (linear & 0x1f_ffff);
            return Some((phys, ANY_ACCESS));
        }
        let pte = read_u64(cpu, (pde & ADDR_MASK) + ((linear >> 12) & 0x1ff) * 8)?;
        return (pte & PRESENT != 0).then_some(((pte & ADDR_MASK) | (linear & 0xfff), ANY_ACCESS));
    }
    let pde = read_u32(
        cpu,
        (sregs.cr3 & 0xffff_f000) + ((linear >> 22) & 0x3ff) * 4,
    )?;
    if pde & PRESENT == 0 {
        return None;
    }
    if pde & PAGE_SIZE_BIT != 0 && sregs.cr4 & CR4_PSE != 0 {
        // 4 MiB page; bits 13..20 extend the address above 4 GiB (PSE-36).
        let high = ((pde >> 13) & 0xff) << 32;
        return Some((
            high | (pde & 0xffc0_0000) | (linear & 0x3f_ffff),
            ANY_ACCESS,
        ));
    }
    let pte = read_u32(cpu, (pde & 0xffff_f000) + ((linear >> 12) & 0x3ff) * 4)?;
    (pte & PRESENT != 0).then_some(((pte & 0xffff_f000) | (linear & 0xfff), ANY_ACCESS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Physical memory as a flat vector.
    struct FlatCpu {
        mem: RefCell<Vec<u8>>,
        sregs: SpecialRegisters,
    }

    impl FlatCpu {
        fn new(size: usize) -> FlatCpu {
            FlatCpu {
                mem: RefCell::new(vec![0; size]),
                sregs: SpecialRegisters::default(),
            }
        }
        fn put(&self, gpa: u64, bytes: &[u8]) {
            self.mem.borrow_mut()[gpa as usize..gpa as usize + bytes.len()].copy_from_slice(bytes);
        }
        fn put_u64(&self, gpa: u64, v: u64) {
            self.put(gpa, &v.to_le_bytes());
        }
    }

    impl PhysicalMemory for FlatCpu {
        fn read_physical(&self, gpa: u64, buf: &mut [u8]) -> bool {
            let m = self.mem.borrow();
            match m.get(gpa as usize..gpa as usize + buf.len()) {
                Some(src) => {
                    buf.copy_from_slice(src);
                    true
                }
                None => false,
            }
        }
    }

    /// Long mode, the first 2 MiB identity-mapped by one 2 MiB page whose
    /// entries are not yet accessed.
    fn machine() -> FlatCpu {
        let mut cpu = FlatCpu::new(0x20_0000);
        cpu.put_u64(0x1000, 0x2000 | 3);
        cpu.put_u64(0x2000, 0x3000 | 3);
        cpu.put_u64(0x3000, 0x83);
        cpu.sregs.cr0 = 0x8000_0011;
        cpu.sregs.cr3 = 0x1000;
        cpu.sregs.cr4 = 0x20;
        cpu.sregs.efer = 0x500;
        cpu
    }

    #[test]
    fn four_level_with_4k_and_2m_pages() {
        let cpu = FlatCpu::new(0x20_0000);
        let mut s = SpecialRegisters {
            cr0: CR0_PG | 1,
            cr3: 0x1000,
            cr4: CR4_PAE,
            efer: EFER_LMA | 0x100,
            ..Default::default()
        };
        // 0xffff_8000_0040_3123 -> PML4[256] -> PDPT[0] -> PD[2] -> PT[3]
        let la = 0xffff_8000_0040_3123u64;
        cpu.put_u64(0x1000 + 256 * 8, 0x2000 | 3);
        cpu.put_u64(0x2000, 0x3000 | 3);
        cpu.put_u64(0x3000 + 2 * 8, 0x4000 | 3);
        cpu.put_u64(0x4000 + 3 * 8, 0x7000 | 3);
        // A 2 MiB page at PD[3].
        cpu.put_u64(0x3000 + 3 * 8, 0x20_0000 | 0x83);
        let mut w = Walker::default();
        assert_eq!(w.translate(&cpu, &s, la), Some(0x7123));
        assert_eq!(
            w.translate(&cpu, &s, 0xffff_8000_0060_0010),
            Some(0x20_0010)
        );
        assert_eq!(w.translate(&cpu, &s, 0x1000), None, "PML4[0] not present");
        // The cache goes with a CR3 change.
        s.cr3 = 0x9000;
        assert_eq!(w.translate(&cpu, &s, la), None);
    }

    #[test]
    fn a_look_walks_each_page_once_and_sees_the_tables_of_its_moment() {
        let cpu = machine();
        let s = cpu.sregs;
        let mut look = WalksNow::default();
        let (phys, access) = look.walk(&cpu, &s, 0x1234).unwrap();
        assert_eq!(phys, 0x1234);
        assert!(!access.accessed, "the test machine's entries are not");
        // The 2 MiB page goes elsewhere, every entry accessed now: this
        // look keeps its walk, with each address's own offset; a new look
        // walks the tables anew.
        cpu.put_u64(0x1000, 0x2000 | 0x23);
        cpu.put_u64(0x2000, 0x3000 | 0x23);
        cpu.put_u64(0x3000, 0x20_0000 | 0xa3);
        assert_eq!(look.walk(&cpu, &s, 0x1ffc).map(|w| w.0), Some(0x1ffc));
        let mut b = [0u8; 8];
        // Its next page is walked now: to 0x20_2000, past the test RAM.
        assert_eq!(look.read(&cpu, &s, 0x1ffc, &mut b), 4);
        let (phys, access) = WalksNow::default().walk(&cpu, &s, 0x1234).unwrap();
        assert_eq!(phys, 0x20_1234);
        assert!(access.accessed);
        assert_eq!(look.walk(&cpu, &s, 0x20_1000), None, "beyond the map");
    }

    #[test]
    fn real_mode_and_32_bit_paging() {
        let cpu = FlatCpu::new(0x10_0000);
        let mut w = Walker::default();
        let real = SpecialRegisters::default();
        assert_eq!(w.translate(&cpu, &real, 0x7c00), Some(0x7c00));
        let s = SpecialRegisters {
            cr0: CR0_PG | 1,
            cr3: 0x1000,
            cr4: CR4_PSE,
            ..Default::default()
        };
        cpu.put(0x1000 + 4, &(0x2000u32 | 3).to_le_bytes()); // PDE[1]
        cpu.put(0x2000 + 5 * 4, &(0x9000u32 | 3).to_le_bytes()); // PTE[5]
        cpu.put(0x1000 + 8, &(0x0040_0000u32 | 0x83).to_le_bytes()); // PDE[2]: 4 MiB
        assert_eq!(w.translate(&cpu, &s, 0x0040_5abc), Some(0x9abc));
        assert_eq!(w.translate(&cpu, &s, 0x0080_0010), Some(0x0040_0010));
    }

    #[test]
    fn reads_across_a_page_boundary() {
        let cpu = FlatCpu::new(0x10_000);
        cpu.put(0x1ffe, &[1, 2, 3, 4]);
        let mut w = Walker::default();
        let mut buf = [0u8; 4];
        assert_eq!(
            w.read(&cpu, &SpecialRegisters::default(), 0x1ffe, &mut buf),
            4
        );
        assert_eq!(buf, [1, 2, 3, 4]);
    }
}
