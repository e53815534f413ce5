//! Entering the guest: one `KVM_RUN` to the next exit that ran something,
//! the exit copied out of `kvm_run` so the VM can be used while serving it.

use kvm_ioctls::VcpuExit;

use crate::cpu::echo;
use crate::diagnostics::ExitNote;
use crate::vm::Vm;

use super::decide;

/// An exit, copied out of `kvm_run` so the VM can be used while serving it.
pub(super) enum Exit {
    IoIn {
        port: u16,
        size: usize,
    },
    IoOut {
        port: u16,
        data: [u8; 8],
        size: usize,
        /// RIP moved past the instruction before the exit (this host's
        /// emulator); else it completes on the next entry, which steps it
        /// (KVM's fast path on VT-x/AMD-V).
        completed: bool,
    },
    MmioRead {
        addr: u64,
        size: u8,
    },
    MmioWrite {
        addr: u64,
        size: u8,
        value: u64,
    },
    Halt,
    IrqWindow,
    Interrupted,
    Shutdown,
    InternalError {
        suberror: u32,
    },
    FailEntry {
        reason: u64,
    },
    SystemEvent {
        kind: u32,
    },
    Debug {
        breakpoint: bool,
        /// The CPU's #DB reached KVM (else KVM synthesized the trap after
        /// an instruction it completed; see `echo`).
        from_cpu: bool,
    },
    Other(String),
}

impl Vm {
    /// Runs the vCPU until its next exit, passing over single-step exits
    /// that ran nothing (see [`echo`]).
    pub(super) fn enter(&mut self) -> Exit {
        loop {
            let before = self.step.stepping.then(|| {
                self.machine.vcpu.clear_debug_report();
                self.machine.vcpu.echo_witness()
            });
            let exit = self.enter_once();
            if let (
                Exit::Debug {
                    breakpoint: false,
                    from_cpu,
                },
                Some(before),
            ) = (&exit, before)
            {
                let step = echo::StepExit {
                    from_cpu: *from_cpu,
                    unchanged: self.machine.vcpu.echo_witness() == before,
                };
                let machine = &mut self.machine;
                let may_branch_to_itself = || {
                    let (code, len) = machine.vcpu.code_at_rip(&machine.ram);
                    let rip = machine.vcpu.rip();
                    let bits = machine.vcpu.special_registers().code_bits();
                    echo::may_branch_to_itself(&code[..len], bits, rip)
                };
                if self.step.echo.is_echo(step, may_branch_to_itself) {
                    tracing::trace!("passed over a single-step exit that ran nothing");
                    continue;
                }
            }
            return exit;
        }
    }

    /// One `KVM_RUN`, its exit copied out.
    fn enter_once(&mut self) -> Exit {
        let entry_rip = self.machine.vcpu.rip();
        let completes_mmio_read = self.step.mmio_read_pending;
        let exit = match self.machine.vcpu.run() {
            Ok(VcpuExit::IoIn(port, data)) => Exit::IoIn {
                port,
                size: data.len(),
            },
            Ok(VcpuExit::IoOut(port, data)) => {
                let mut buf = [0u8; 8];
                let size = data.len().min(8);
                buf[..size].copy_from_slice(&data[..size]);
                Exit::IoOut {
                    port,
                    data: buf,
                    size,
                    completed: true,
                }
            }
            Ok(VcpuExit::MmioRead(addr, data)) => {
                // Nothing is mapped as MMIO: reads float high.
                data.fill(0xff);
                Exit::MmioRead {
                    addr,
                    size: data.len() as u8,
                }
            }
            Ok(VcpuExit::MmioWrite(addr, data)) => {
                let mut value = [0u8; 8];
                let n = data.len().min(8);
                value[..n].copy_from_slice(&data[..n]);
                Exit::MmioWrite {
                    addr,
                    size: data.len() as u8,
                    value: u64::from_le_bytes(value),
                }
            }
            Ok(VcpuExit::Hlt) => Exit::Halt,
            Ok(VcpuExit::IrqWindowOpen) => Exit::IrqWindow,
            Ok(VcpuExit::Shutdown) => Exit::Shutdown,
            Ok(VcpuExit::InternalError) => {
                // SAFETY: KVM_EXIT_INTERNAL_ERROR makes `internal` the live
                // member of the exit union.
                let suberror = unsafe {
                    self.machine
                        .vcpu
                        .run_page()
                        .__bindgen_anon_1
                        .internal
                        .suberror
                };
                Exit::InternalError { suberror }
            }
            Ok(VcpuExit::FailEntry(reason, _)) => Exit::FailEntry { reason },
            Ok(VcpuExit::SystemEvent(kind, _)) => Exit::SystemEvent { kind },
            Ok(VcpuExit::Debug(arch)) => Exit::Debug {
                breakpoint: decide::breakpoint_hit(arch.dr6),
                from_cpu: echo::raised_by_cpu(arch.dr7),
            },
            Ok(VcpuExit::Intr) => Exit::Interrupted,
            Ok(other) => Exit::Other(format!("{other:?}")),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Exit::Interrupted,
            Err(e) => Exit::Other(format!("KVM_RUN failed: {e}")),
        };
        let mut exit = exit;
        match &mut exit {
            Exit::IoOut { completed, .. } => *completed = self.machine.vcpu.rip() != entry_rip,
            // KVM's emulator ran the access and rewrote RFLAGS without TF.
            Exit::MmioRead { .. } | Exit::MmioWrite { .. } => self.machine.vcpu.mark_step_stale(),
            _ if completes_mmio_read => self.machine.vcpu.mark_step_stale(),
            _ => {}
        }
        exit
    }

    /// Keeps the exit for crash reports.
    pub(super) fn note(&mut self, kind: &'static str, detail: u64) {
        let rip = self.machine.vcpu.rip();
        self.machine.history.record(ExitNote { kind, rip, detail });
    }
}

impl Exit {
    /// Whether the next entry completes this exit's instruction (an IN, an
    /// MMIO read, an OUT on KVM's fast path): RIP must not move under it.
    pub(super) fn completes_on_next_entry(&self) -> bool {
        matches!(
            self,
            Exit::IoIn { .. }
                | Exit::MmioRead { .. }
                | Exit::IoOut {
                    completed: false,
                    ..
                }
        )
    }
}
