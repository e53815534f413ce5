//! The one vCPU: creation, sync-register exchange and the few ioctls
//! kvm-ioctls does not wrap (`KVM_INTERRUPT`).

use kvm_bindings::{kvm_fpu, kvm_guest_debug, kvm_interrupt, kvm_regs, kvm_run, kvm_sregs};
use kvm_ioctls::{SyncReg, VcpuExit, VcpuFd, VmFd};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::ioctl::ioctl_with_ref;
use vmm_sys_util::ioctl_iow_nr;

use crate::error::{Error, Result};
use crate::memory::{BadAddress, GuestRam, GuestVirtualMemory, LinearMemory};

/// What the VMM writes into `kvm_run.debug.arch.dr7` before a stepping
/// entry: no DR7 reads as this (bit 10 is fixed at 1). See `cpu::echo`.
pub(crate) const NOT_REPORTED_DR7: u64 = 0;

// kvm-ioctls wraps no KVM_INTERRUPT (it assumes an in-kernel irqchip);
// the number is built from kvm-bindings' KVMIO as KVM's headers do.
ioctl_iow_nr!(KVM_INTERRUPT, kvm_bindings::KVMIO, 0x86, kvm_interrupt);
vmm_sys_util::ioctl_io_nr!(KVM_RUN, kvm_bindings::KVMIO, 0x80);

/// `KVM_RUN` on the vCPU whose descriptor [`Vcpu::raw_parts`] gave, from
/// a thread that only enters it (see `run_loop::parallel`, `steppers`);
/// the errno, 0 for an exit, which the caller reads from `kvm_run`.
///
/// # Safety
///
/// `fd` must be a vCPU's, open for the call, and no other thread may use
/// the vCPU until it returns.
pub(crate) unsafe fn run_raw(fd: std::os::unix::io::RawFd) -> i32 {
    // SAFETY: KVM_RUN takes no argument; the caller vouches for `fd`.
    match unsafe { libc::ioctl(fd, KVM_RUN() as _, 0) } {
        0 => 0,
        _ => std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    }
}

/// The vCPU and the registers KVM hands over at every exit.
///
/// Every register write goes through this type, so the cached sync
/// registers are never stale and the run loop learns that single-stepping
/// must be armed again: on hosts that step with RFLAGS.TF, KVM adds TF only
/// while RIP is where `KVM_SET_GUEST_DEBUG` found it, and a register write
/// that moves RIP (an interrupt delivered by the VMM, an instruction it
/// completed) drops it.
pub struct Vcpu {
    fd: VcpuFd,
    /// Sync registers are only filled by KVM_RUN; before the first exit the
    /// registers come from the ioctls.
    synced: bool,
    /// Registers were written since single-stepping was last armed.
    step_stale: bool,
}

impl Vcpu {
    /// Creates vCPU `id` with registers and system registers synced through
    /// `kvm_run` on every exit (no per-exit GET_REGS/GET_SREGS ioctls).
    pub fn new(vm: &VmFd, id: u8) -> Result<Vcpu> {
        let mut fd = vm
            .create_vcpu(u64::from(id))
            .map_err(Error::kvm("KVM_CREATE_VCPU"))?;
        fd.set_sync_valid_reg(SyncReg::Register);
        fd.set_sync_valid_reg(SyncReg::SystemRegister);
        Ok(Vcpu {
            fd,
            synced: false,
            step_stale: false,
        })
    }

    /// General registers as of the last exit.
    pub fn regs(&mut self) -> kvm_regs {
        if self.synced {
            self.fd.sync_regs_mut().regs
        } else {
            self.fd.get_regs().unwrap_or_default()
        }
    }

    /// System registers as of the last exit.
    pub fn sregs(&mut self) -> kvm_sregs {
        if self.synced {
            self.fd.sync_regs_mut().sregs
        } else {
            self.fd.get_sregs().unwrap_or_default()
        }
    }

    /// [`Vcpu::sregs`] as the monitor reads them, copied straight from
    /// where KVM left them (once per exit).
    #[inline]
    pub fn special_registers(&mut self) -> vtrace_x86::SpecialRegisters {
        if !self.synced {
            return (&self.sregs()).into();
        }
        (&self.fd.sync_regs_mut().sregs).into()
    }

    /// RIP, RSP, RCX and RFLAGS as of the last exit: what a single step
    /// that ran nothing leaves as it was (see `cpu::echo`). Read in place,
    /// twice an exit while stepping.
    #[inline]
    pub(crate) fn echo_witness(&mut self) -> [u64; 4] {
        let witness = |r: &kvm_regs| [r.rip, r.rsp, r.rcx, r.rflags];
        if self.synced {
            witness(&self.fd.sync_regs_mut().regs)
        } else {
            witness(&self.regs())
        }
    }

    /// Before a stepping entry: leaves the debug exit's DR7 as no CPU
    /// reports it, so the exit tells who raised the trap (see
    /// `cpu::echo::raised_by_cpu`). The exit union: KVM rewrites it at the
    /// next exit.
    #[inline]
    pub(crate) fn clear_debug_report(&mut self) {
        self.run_page().__bindgen_anon_1.debug.arch.dr7 = NOT_REPORTED_DR7;
    }

    /// The instruction bytes at RIP: the longest run of up to 15 that
    /// reads (an instruction may end a mapped page), and its length.
    pub(crate) fn code_at_rip(&mut self, ram: &GuestRam) -> ([u8; 15], usize) {
        let rip = self.rip();
        let linear = self.special_registers().cs.base.wrapping_add(rip);
        let memory = self.memory(ram);
        let mut code = [0u8; 15];
        let len = (1..=code.len())
            .rev()
            .find(|&n| memory.read_virtual(linear, &mut code[..n]).is_ok())
            .unwrap_or(0);
        (code, len)
    }

    /// RIP as of the last exit (no ioctl once the vCPU has run).
    pub fn rip(&mut self) -> u64 {
        if self.synced {
            self.fd.sync_regs_mut().regs.rip
        } else {
            self.regs().rip
        }
    }

    /// Writes the general registers.
    pub fn set_regs(&mut self, regs: &kvm_regs) -> Result<()> {
        self.fd.set_regs(regs).map_err(Error::kvm("KVM_SET_REGS"))?;
        self.written();
        Ok(())
    }

    /// Writes the system registers, never an interrupt: only
    /// [`Vcpu::interrupt`] queues one.
    pub fn set_sregs(&mut self, sregs: &kvm_sregs) -> Result<()> {
        // KVM_SET_SREGS queues the vector `interrupt_bitmap` names, and the
        // copy in the sync registers keeps a bit KVM once set there after
        // the interrupt is gone (measured: set while KVM_GET_VCPU_EVENTS
        // reports nothing queued). Written back, such a bit delivered a
        // timer interrupt a second time, by the CPU, with the tracer's TF in
        // the frame it pushed, for the guest to find as a #DB after tracing
        // stopped.
        let mut sregs = *sregs;
        sregs.interrupt_bitmap = [0; 4];
        self.fd
            .set_sregs(&sregs)
            .map_err(Error::kvm("KVM_SET_SREGS"))?;
        self.written();
        Ok(())
    }

    /// The FPU and SSE state.
    pub fn fpu(&self) -> Result<kvm_fpu> {
        self.fd.get_fpu().map_err(Error::kvm("KVM_GET_FPU"))
    }

    /// Writes the FPU and SSE state.
    pub fn set_fpu(&self, fpu: &kvm_fpu) -> Result<()> {
        self.fd.set_fpu(fpu).map_err(Error::kvm("KVM_SET_FPU"))
    }

    /// One model-specific register, or `None` if KVM will not read it.
    pub fn msr(&self, index: u32) -> Option<u64> {
        let mut msrs = kvm_bindings::Msrs::from_entries(&[kvm_bindings::kvm_msr_entry {
            index,
            ..Default::default()
        }])
        .ok()?;
        match self.fd.get_msrs(&mut msrs) {
            Ok(1) => msrs.as_slice().first().map(|e| e.data),
            _ => None,
        }
    }

    /// Writes one model-specific register; false if KVM refused it.
    pub fn set_msr(&self, index: u32, data: u64) -> bool {
        let entry = kvm_bindings::kvm_msr_entry {
            index,
            data,
            ..Default::default()
        };
        kvm_bindings::Msrs::from_entries(&[entry])
            .is_ok_and(|msrs| matches!(self.fd.set_msrs(&msrs), Ok(1)))
    }

    /// Takes back an external interrupt queued with `KVM_INTERRUPT` that
    /// KVM has not delivered yet (a `KVM_RUN` cut short by a kick before it
    /// entered the guest leaves one behind); returns its vector.
    pub fn take_queued_interrupt(&mut self) -> Result<Option<u8>> {
        let mut events = self
            .fd
            .get_vcpu_events()
            .map_err(Error::kvm("KVM_GET_VCPU_EVENTS"))?;
        if events.interrupt.injected == 0 || events.interrupt.soft != 0 {
            return Ok(None);
        }
        let vector = events.interrupt.nr;
        events.interrupt.injected = 0;
        self.fd
            .set_vcpu_events(&events)
            .map_err(Error::kvm("KVM_SET_VCPU_EVENTS"))?;
        Ok(Some(vector))
    }

    /// The interrupt shadow after the last instruction, as KVM's
    /// `KVM_X86_SHADOW_INT_*` bits (MOV SS 1, STI 2).
    pub fn interrupt_shadow(&self) -> Result<u8> {
        let events = self
            .fd
            .get_vcpu_events()
            .map_err(Error::kvm("KVM_GET_VCPU_EVENTS"))?;
        Ok(events.interrupt.shadow)
    }

    /// Sets the interrupt shadow ([`Vcpu::interrupt_shadow`]'s bits).
    pub fn set_interrupt_shadow(&self, shadow: u8) -> Result<()> {
        let mut events = self
            .fd
            .get_vcpu_events()
            .map_err(Error::kvm("KVM_GET_VCPU_EVENTS"))?;
        events.interrupt.shadow = shadow;
        events.flags = kvm_bindings::KVM_VCPUEVENT_VALID_SHADOW;
        self.fd
            .set_vcpu_events(&events)
            .map_err(Error::kvm("KVM_SET_VCPU_EVENTS"))
    }

    /// DR0-DR3, DR6 and DR7.
    pub fn debug_registers(&self) -> Result<[u64; 6]> {
        let d = self
            .fd
            .get_debug_regs()
            .map_err(Error::kvm("KVM_GET_DEBUGREGS"))?;
        Ok([d.db[0], d.db[1], d.db[2], d.db[3], d.dr6, d.dr7])
    }

    /// Writes DR0-DR3, DR6 and DR7 ([`Vcpu::debug_registers`]'s order).
    pub fn set_debug_registers(&self, dr: [u64; 6]) -> Result<()> {
        let mut d = self
            .fd
            .get_debug_regs()
            .map_err(Error::kvm("KVM_GET_DEBUGREGS"))?;
        d.db = [dr[0], dr[1], dr[2], dr[3]];
        (d.dr6, d.dr7) = (dr[4], dr[5]);
        self.fd
            .set_debug_regs(&d)
            .map_err(Error::kvm("KVM_SET_DEBUGREGS"))
    }

    /// XCR0, or `None` where the host's KVM has no XSAVE.
    pub fn xcr0(&self) -> Option<u64> {
        let xcrs = self.fd.get_xcrs().ok()?;
        let n = (xcrs.nr_xcrs as usize).min(xcrs.xcrs.len());
        xcrs.xcrs[..n].iter().find(|x| x.xcr == 0).map(|x| x.value)
    }

    /// Writes XCR0; false where KVM refused it (or has no XSAVE).
    pub fn set_xcr0(&self, value: u64) -> bool {
        let Ok(mut xcrs) = self.fd.get_xcrs() else {
            return false;
        };
        xcrs.nr_xcrs = 1;
        xcrs.xcrs[0].xcr = 0;
        xcrs.xcrs[0].value = value;
        self.fd.set_xcrs(&xcrs).is_ok()
    }

    /// Takes the vCPU out of KVM's halted state (KVM_SET_MP_STATE).
    pub fn set_runnable(&self) -> Result<()> {
        let state = kvm_bindings::kvm_mp_state {
            mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE,
        };
        self.fd
            .set_mp_state(state)
            .map_err(Error::kvm("KVM_SET_MP_STATE"))
    }

    /// Sets the CPUID the guest sees.
    pub fn set_cpuid(&self, cpuid: &kvm_bindings::CpuId) -> Result<()> {
        self.fd
            .set_cpuid2(cpuid)
            .map_err(Error::kvm("KVM_SET_CPUID2"))
    }

    /// Configures single-stepping and hardware breakpoints; this also arms
    /// the trap flag again where stepping rides on it.
    pub fn set_guest_debug(&mut self, debug: &kvm_guest_debug) -> Result<()> {
        self.fd
            .set_guest_debug(debug)
            .map_err(Error::kvm("KVM_SET_GUEST_DEBUG"))?;
        self.step_stale = false;
        Ok(())
    }

    /// Whether registers were written since stepping was last armed.
    pub fn step_stale(&self) -> bool {
        self.step_stale
    }

    /// Marks the trap flag as possibly lost: KVM emulated the instruction
    /// at this exit (MMIO), which rewrites RFLAGS without it.
    pub fn mark_step_stale(&mut self) {
        self.step_stale = true;
    }

    fn written(&mut self) {
        // The cached copy is what KVM had before the write.
        self.synced = false;
        self.step_stale = true;
    }

    /// Runs the vCPU until its next exit.
    pub fn run(&mut self) -> std::result::Result<VcpuExit<'_>, kvm_ioctls::Error> {
        let result = self.fd.run();
        self.synced = result.is_ok();
        result
    }

    /// What another thread needs to enter this vCPU itself (see
    /// `run_loop::parallel`): the vCPU's file descriptor and its `kvm_run`
    /// mapping, both alive as long as the vCPU.
    pub(crate) fn raw_parts(&mut self) -> (std::os::unix::io::RawFd, *mut kvm_run) {
        use std::os::unix::io::AsRawFd;
        let run: *mut kvm_run = self.fd.get_kvm_run();
        (self.fd.as_raw_fd(), run)
    }

    /// Another thread entered the vCPU ([`run_raw`] with [`Vcpu::raw_parts`]);
    /// `ok` where it returned an exit, which filled the sync registers.
    pub(crate) fn ran_elsewhere(&mut self, ok: bool) {
        self.synced = ok;
    }

    /// Clears `kvm_run.immediate_exit` after a kick.
    pub fn clear_immediate_exit(&mut self) {
        self.fd.set_kvm_immediate_exit(0);
    }

    /// Guest-virtual memory through KVM's page walk.
    pub fn memory<'a>(&'a self, ram: &'a GuestRam) -> TranslatedMemory<'a> {
        TranslatedMemory {
            vcpu: &self.fd,
            ram,
        }
    }

    /// The shared `kvm_run` page.
    pub fn run_page(&mut self) -> &mut kvm_run {
        self.fd.get_kvm_run()
    }

    /// Injects an external interrupt (user-space irqchip).
    pub fn interrupt(&self, vector: u8) -> Result<()> {
        let irq = kvm_interrupt {
            irq: u32::from(vector),
        };
        // SAFETY: KVM_INTERRUPT reads one kvm_interrupt from a valid reference.
        let ret = unsafe { ioctl_with_ref(&self.fd, KVM_INTERRUPT(), &irq) };
        if ret == 0 {
            Ok(())
        } else {
            Err(Error::Kvm {
                call: "KVM_INTERRUPT",
                source: kvm_ioctls::Error::last(),
            })
        }
    }

    /// Writes the result of a pending MMIO read exit (the bytes land in the
    /// destination on the next `KVM_RUN`).
    pub fn complete_mmio_read(&mut self, data: &[u8]) {
        let run = self.fd.get_kvm_run();
        // SAFETY: only called right after a KVM_EXIT_MMIO read exit, so the
        // `mmio` member of the union is the live one; its data is 8 bytes.
        unsafe {
            let mmio = &mut run.__bindgen_anon_1.mmio;
            let len = (mmio.len as usize).min(data.len()).min(mmio.data.len());
            mmio.data[..len].copy_from_slice(&data[..len]);
        }
    }

    /// Writes the result of a pending `IN` exit (the bytes land in the
    /// guest's register on the next `KVM_RUN`).
    pub fn complete_io_in(&mut self, data: &[u8]) {
        let run = self.fd.get_kvm_run();
        // SAFETY: only called right after a KVM_EXIT_IO exit, so the `io`
        // member of the union is the live one; the data area lies inside the
        // kvm_run mapping at data_offset, size*count bytes long (the same
        // computation kvm-ioctls uses to hand out the slice).
        unsafe {
            let io = run.__bindgen_anon_1.io;
            let len = (usize::from(io.size) * io.count as usize).min(data.len());
            let base = (run as *mut kvm_run)
                .cast::<u8>()
                .add(io.data_offset as usize);
            std::ptr::copy_nonoverlapping(data.as_ptr(), base, len);
        }
    }
}

impl TranslatedMemory<'_> {
    /// Writes `data` at guest-virtual `gva`, page by page.
    pub fn write_virtual(&self, gva: u64, data: &[u8]) -> std::result::Result<(), BadAddress> {
        let mut done = 0usize;
        while done < data.len() {
            let addr = gva.checked_add(done as u64).ok_or(BadAddress(gva))?;
            let t = self
                .vcpu
                .translate_gva(addr)
                .map_err(|_| BadAddress(addr))?;
            if t.valid == 0 || t.writeable == 0 {
                return Err(BadAddress(addr));
            }
            let n = ((4096 - (addr & 0xfff)) as usize).min(data.len() - done);
            self.ram
                .write_slice(&data[done..done + n], GuestAddress(t.physical_address))
                .map_err(|_| BadAddress(addr))?;
            done += n;
        }
        Ok(())
    }
}

impl LinearMemory for TranslatedMemory<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::result::Result<(), u64> {
        self.read_virtual(addr, buf).map_err(|e| e.0)
    }
    fn write(&self, addr: u64, data: &[u8]) -> std::result::Result<(), u64> {
        self.write_virtual(addr, data).map_err(|e| e.0)
    }
}

/// Guest-virtual memory through KVM's own page walk (`KVM_TRANSLATE`).
pub struct TranslatedMemory<'a> {
    vcpu: &'a VcpuFd,
    ram: &'a GuestRam,
}

impl GuestVirtualMemory for TranslatedMemory<'_> {
    fn read_virtual(&self, gva: u64, buf: &mut [u8]) -> std::result::Result<(), BadAddress> {
        let mut done = 0usize;
        while done < buf.len() {
            let addr = gva.checked_add(done as u64).ok_or(BadAddress(gva))?;
            let t = self
                .vcpu
                .translate_gva(addr)
                .map_err(|_| BadAddress(addr))?;
            if t.valid == 0 {
                return Err(BadAddress(addr));
            }
            let in_page = (4096 - (addr & 0xfff)) as usize;
            let n = in_page.min(buf.len() - done);
            self.ram
                .read_slice(&mut buf[done..done + n], GuestAddress(t.physical_address))
                .map_err(|_| BadAddress(addr))?;
            done += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vcpu_on_kvm() -> Option<(VmFd, Vcpu)> {
        let kvm = kvm_ioctls::Kvm::new().ok()?;
        let vm = kvm.create_vm().ok()?;
        let vcpu = Vcpu::new(&vm, 0).ok()?;
        Some((vm, vcpu))
    }

    fn queued(vcpu: &Vcpu) -> Option<u8> {
        let events = vcpu.fd.get_vcpu_events().unwrap();
        (events.interrupt.injected != 0).then_some(events.interrupt.nr)
    }

    /// KVM queues the vector a written `interrupt_bitmap` names (the raw
    /// ioctl shows it); registers written through `Vcpu` never do.
    #[test]
    fn writing_system_registers_queues_no_interrupt() {
        let Some((_vm, mut vcpu)) = vcpu_on_kvm() else {
            return;
        };
        let mut sregs = vcpu.sregs();
        sregs.interrupt_bitmap[0] = 1 << 32;
        vcpu.fd.set_sregs(&sregs).unwrap();
        assert_eq!(queued(&vcpu), Some(32), "KVM_SET_SREGS itself queues");
        assert_eq!(vcpu.take_queued_interrupt().unwrap(), Some(32));
        assert_eq!(queued(&vcpu), None);

        vcpu.set_sregs(&sregs).unwrap();
        assert_eq!(queued(&vcpu), None, "Vcpu::set_sregs queued a vector");
    }
}
