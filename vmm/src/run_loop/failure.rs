//! What stops the guest for good, and the one failure the VMM mends: an
//! instruction KVM's emulator refused, which the VMM completes itself
//! where it can (see `cpu::unemulated`).

use crate::cpu::unemulated;
use crate::diagnostics::CrashReport;
use crate::error::Result;
use crate::vm::Vm;
use vtrace_x86::SpecialRegisters;

impl Vm {
    /// Where KVM's emulator gave up on an instruction the VMM can complete
    /// itself (see `cpu::unemulated`), does so: `Some` with the vector of
    /// the interrupt the completion delivered through the guest's IDT, if
    /// any (INT n, INT3); the guest goes on as if the CPU had run it.
    /// `None` where the VMM cannot complete it (the caller reports the
    /// emulation failure).
    pub(super) fn complete_unemulated(&mut self) -> Result<Option<Option<u8>>> {
        let (code, len) = self.machine.vcpu.code_at_rip(&self.machine.ram);
        if len == 0 {
            return Ok(None);
        }
        let mut regs = self.machine.vcpu.regs();
        let mut sregs = self.machine.vcpu.sregs();
        let memory = self.machine.vcpu.memory(&self.machine.ram);
        let bitness = SpecialRegisters::from(&sregs).code_bits();
        let Some(plan) = unemulated::plan(&code[..len], bitness, &regs, &sregs) else {
            return Ok(None);
        };
        let mut fpu = self.machine.vcpu.fpu()?;
        let (cs_before, fpu_before) = (sregs.cs, (fpu.mxcsr, fpu.fsw));
        let vector = match unemulated::complete(plan, &memory, &mut regs, &mut sregs, &mut fpu) {
            Ok(vector) => vector,
            Err(e) => {
                tracing::debug!("{plan:?} not completed: {e}");
                return Ok(None);
            }
        };
        if sregs.cs != cs_before {
            self.machine.vcpu.set_sregs(&sregs)?;
        }
        if (fpu.mxcsr, fpu.fsw) != fpu_before {
            self.machine.vcpu.set_fpu(&fpu)?;
        }
        self.machine.vcpu.set_regs(&regs)?;
        self.machine.completed_by_vmm += 1;
        tracing::debug!("completed {plan:?}; guest continues at {:#x}", regs.rip);
        Ok(Some(vector))
    }

    pub(super) fn crash_report(&mut self, hint: Option<String>) -> CrashReport {
        let mut code = vec![0u8; 15];
        let (regs, sregs, code) = match self.engine.as_ref().filter(|e| e.holds()) {
            // KVM's registers are stale while the engine holds the CPU.
            Some(engine) => {
                let (regs, sregs) = (*engine.regs(), *engine.sregs());
                let linear = sregs.cs.base.wrapping_add(regs.rip);
                let memory = crate::engine::EngineMemory::new(&self.machine.ram, sregs);
                let code =
                    crate::memory::GuestVirtualMemory::read_virtual(&memory, linear, &mut code)
                        .ok()
                        .map(|()| code);
                (regs, sregs, code)
            }
            None => {
                let regs = self.machine.vcpu.regs();
                let sregs = self.machine.vcpu.sregs();
                let linear = sregs.cs.base.wrapping_add(regs.rip);
                let memory = self.machine.vcpu.memory(&self.machine.ram);
                let code =
                    crate::memory::GuestVirtualMemory::read_virtual(&memory, linear, &mut code)
                        .ok()
                        .map(|()| code);
                ((&regs).into(), (&sregs).into(), code)
            }
        };
        CrashReport {
            regs,
            sregs,
            code,
            recent_exits: self.machine.history.recent(),
            hint,
            rip_named: None,
        }
    }
}
