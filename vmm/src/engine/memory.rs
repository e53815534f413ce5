//! Guest memory by linear address while the engine holds the CPU: KVM's
//! page walk (`KVM_TRANSLATE`) would use KVM's stale registers, so the
//! guest's page tables are walked in software with the engine's.

use std::cell::RefCell;

use vm_memory::{Bytes, GuestAddress};
use vtrace_x86::{PhysicalMemory, SpecialRegisters, Walker};

use crate::memory::{BadAddress, GuestRam, GuestVirtualMemory, LinearMemory};

/// Guest RAM by guest-physical address.
pub(crate) struct Ram<'a>(pub(crate) &'a GuestRam);

impl PhysicalMemory for Ram<'_> {
    fn read_physical(&self, gpa: u64, buf: &mut [u8]) -> bool {
        self.0.read_slice(buf, GuestAddress(gpa)).is_ok()
    }
}

/// Linear addresses through the engine's page tables (a walker for one
/// delivery or hypercall: nothing it caches outlives it).
pub(crate) struct EngineMemory<'a> {
    ram: &'a GuestRam,
    sregs: SpecialRegisters,
    walker: RefCell<Walker>,
    /// What was written through it, as (guest-physical, length), for the
    /// engine to drop what it decoded there.
    written: RefCell<Vec<(u64, u64)>>,
}

impl<'a> EngineMemory<'a> {
    /// Guest memory as the CPU with `sregs` sees it.
    pub(crate) fn new(ram: &'a GuestRam, sregs: SpecialRegisters) -> Self {
        EngineMemory {
            ram,
            sregs,
            walker: RefCell::new(Walker::default()),
            written: RefCell::new(Vec::new()),
        }
    }

    /// What was written through it, as (guest-physical, length).
    pub(crate) fn written(self) -> Vec<(u64, u64)> {
        self.written.into_inner()
    }

    /// Calls `each(gpa, offset, len)` for the pieces of `[addr, addr +
    /// len)`, page by page; the linear address that does not translate.
    fn pages(
        &self,
        addr: u64,
        len: usize,
        mut each: impl FnMut(u64, usize, usize) -> bool,
    ) -> Result<(), u64> {
        let mut done = 0usize;
        while done < len {
            let at = addr.checked_add(done as u64).ok_or(addr)?;
            let gpa = self
                .walker
                .borrow_mut()
                .translate(&Ram(self.ram), &self.sregs, at)
                .ok_or(at)?;
            let n = ((4096 - (at & 0xfff)) as usize).min(len - done);
            if !each(gpa, done, n) {
                return Err(at);
            }
            done += n;
        }
        Ok(())
    }
}

impl LinearMemory for EngineMemory<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), u64> {
        let len = buf.len();
        self.pages(addr, len, |gpa, at, n| {
            self.ram
                .read_slice(&mut buf[at..at + n], GuestAddress(gpa))
                .is_ok()
        })
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), u64> {
        self.pages(addr, data.len(), |gpa, at, n| {
            self.written.borrow_mut().push((gpa, n as u64));
            self.ram
                .write_slice(&data[at..at + n], GuestAddress(gpa))
                .is_ok()
        })
    }
}

impl GuestVirtualMemory for EngineMemory<'_> {
    fn read_virtual(&self, gva: u64, buf: &mut [u8]) -> Result<(), BadAddress> {
        LinearMemory::read(self, gva, buf).map_err(BadAddress)
    }
}
