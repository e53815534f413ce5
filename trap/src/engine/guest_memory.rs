//! Guest memory read for the tracer's other parts (captures, probes, the
//! task watch), through the engine's walker and its cached translations.

use vtrace_vmm::CpuView;

use super::Engine;

impl Engine {
    /// Reads guest memory at linear address `linear` through the guest's
    /// paging as it stands; false unless every byte was read.
    pub fn read_linear(&mut self, cpu: &mut dyn CpuView, linear: u64, buf: &mut [u8]) -> bool {
        let sregs = cpu.sregs();
        self.walker.read(&*cpu, &sregs, linear, buf) == buf.len()
    }

    /// Reads kernel memory at linear address `linear`, as
    /// [`Engine::read_linear`] does; where the running address space does
    /// not map it (Linux's page-table isolation leaves user mode only the
    /// entry code), through the kernel's own page tables, which Linux keeps
    /// in the page below the user's (the user's CR3 has bit 12 set, and
    /// PCID bits). False unless every byte was read.
    pub fn read_kernel(&mut self, cpu: &mut dyn CpuView, linear: u64, buf: &mut [u8]) -> bool {
        let sregs = cpu.sregs();
        if self.walker.read(&*cpu, &sregs, linear, buf) == buf.len() {
            return true;
        }
        /// Bit 12 (PTI's user half), the PCID and the no-flush bit.
        const USER_CR3_BITS: u64 = 0x1fff | 1 << 63;
        if sregs.cr3 & 0x1000 == 0 {
            return false;
        }
        let mut kernel = sregs;
        kernel.cr3 &= !USER_CR3_BITS;
        self.walker.read(&*cpu, &kernel, linear, buf) == buf.len()
    }

    /// Reads guest memory at linear address `linear` up to the first page
    /// that is not present; returns how many bytes were read.
    pub fn read_linear_prefix(
        &mut self,
        cpu: &mut dyn CpuView,
        linear: u64,
        buf: &mut [u8],
    ) -> usize {
        let sregs = cpu.sregs();
        self.walker.read(&*cpu, &sregs, linear, buf)
    }
}
