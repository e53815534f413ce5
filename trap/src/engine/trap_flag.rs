//! Keeping the tracer's TF out of the guest's sight and giving back what
//! was lent: IA32_FMASK around a SYSCALL, R11 around a SYSRETQ, the TF
//! in a frame pushed while stepping.

use vtrace_storage::CpuMode;
use vtrace_vmm::CpuView;
use vtrace_x86::msr::FMASK as MSR_FMASK;
use vtrace_x86::rflags::TF as RFLAGS_TF;
use vtrace_x86::{Registers, SpecialRegisters};

use super::Engine;

impl Engine {
    /// Gives the guest back the FMASK it wrote, once the SYSCALL that ran
    /// without TF in it is behind: at every exit.
    pub fn restore_fmask(&mut self, cpu: &mut dyn CpuView) {
        if let Some(mask) = self.carried.fmask.take() {
            let written = cpu.write_msr(MSR_FMASK, mask);
            self.wrote(written);
        }
    }

    /// Takes back all TF the engine carried into guest state for an
    /// instruction that will now run unstepped (tracing stopped before
    /// it): left there, TF would raise a #DB the guest never asked for.
    pub fn release(&mut self, cpu: &mut dyn CpuView) {
        self.restore_fmask(cpu);
        if std::mem::take(&mut self.carried.r11) {
            let mut r = cpu.regs();
            r.r11 &= !RFLAGS_TF;
            let written = cpu.write_regs(&r);
            self.wrote(written);
        }
        if let Some(gpa) = self.carried.frame.take() {
            let mut b = [0u8; 1];
            if cpu.read_physical(gpa, &mut b) {
                let written = cpu.write_physical(gpa, &[b[0] & !1]);
                self.wrote(written);
            }
        }
    }

    /// Where stepping rides on RFLAGS.TF, PUSHF pushes it: KVM hides TF
    /// from the registers it reports, but not from the image in guest
    /// memory. The guest must not see the tracer (a later POPF or IRET
    /// would carry TF on into code that never set it), so TF is cleared
    /// there unless the guest's own RFLAGS has it.
    pub(super) fn hide_trap_flag(
        &mut self,
        cpu: &mut dyn CpuView,
        sregs: &SpecialRegisters,
        regs: &Registers,
        size: u8,
    ) {
        const TF: u8 = 1 << 0; // bit 8: in the second byte
        if regs.rflags & RFLAGS_TF != 0 || size < 2 {
            return;
        }
        let Some(gpa) = self.walker.translate(cpu, sregs, regs.rsp.wrapping_add(1)) else {
            return;
        };
        let mut byte = [0u8; 1];
        if cpu.read_physical(gpa, &mut byte) && byte[0] & TF != 0 {
            byte[0] &= !TF;
            let written = cpu.write_physical(gpa, &byte);
            self.wrote(written);
        }
    }

    /// Where stepping rides on TF, a return to user mode (IRETQ, SYSRETQ)
    /// loads RFLAGS from the guest's frame or R11, without the TF KVM set,
    /// and the CPU (as QEMU's SVM showed) then runs user code untrapped.
    /// So TF is put into what the instruction is about to load; the
    /// engine re-arms after it, and KVM keeps TF hidden from the guest's
    /// registers from then on.
    pub(super) fn carry_trap_flag(
        &mut self,
        cpu: &mut dyn CpuView,
        sregs: &SpecialRegisters,
        regs: &Registers,
    ) {
        use iced_x86::Mnemonic;
        let Some(p) = self.pending else {
            return;
        };
        let Some(d) = p.decoded else {
            return;
        };
        if !d.rearm || p.mode != CpuMode::Long64 {
            return;
        }
        match d.insn.mnemonic() {
            // SYSCALL clears the RFLAGS bits FMASK names, TF among them in
            // Linux, and the CPU then runs the kernel's entry untrapped.
            // With TF left out of FMASK for this one instruction, the
            // trap comes at the entry point's first instruction, as it
            // does after SYSENTER; the kernel's copy of RFLAGS in R11
            // loses the tracer's TF at that exit.
            Mnemonic::Syscall if p.cpl == 3 => {
                if let Some(mask) = cpu.read_msr(MSR_FMASK) {
                    if mask & RFLAGS_TF != 0 {
                        let written = cpu.write_msr(MSR_FMASK, mask & !RFLAGS_TF);
                        if self.wrote(written) {
                            self.carried.fmask = Some(mask);
                        }
                    }
                }
            }
            Mnemonic::Sysretq | Mnemonic::Sysret if regs.r11 & RFLAGS_TF == 0 => {
                let mut r = *regs;
                r.r11 |= RFLAGS_TF;
                let written = cpu.write_regs(&r);
                self.carried.r11 = self.wrote(written);
            }
            Mnemonic::Iretq => {
                // The popped RFLAGS' second byte holds TF (bit 8).
                let at = regs.rsp.wrapping_add(17);
                let mut cs = [0u8; 1];
                let to_user = self
                    .walker
                    .read(cpu, sregs, regs.rsp.wrapping_add(8), &mut cs)
                    == 1
                    && cs[0] & 3 == 3;
                if let (true, Some(gpa)) = (to_user, self.walker.translate(cpu, sregs, at)) {
                    let mut b = [0u8; 1];
                    if cpu.read_physical(gpa, &mut b) && b[0] & 1 == 0 {
                        let written = cpu.write_physical(gpa, &[b[0] | 1]);
                        if self.wrote(written) {
                            self.carried.frame = Some(gpa);
                        }
                    }
                }
            }
            _ => {}
        }
    }
}
