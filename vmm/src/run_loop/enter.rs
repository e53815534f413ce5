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
            let cpu = self.machine.cpus.on_stage();
            let (exit, before) = match self.steppers.ahead(cpu) {
                // Its step ran already, stepped: collect it, with the
                // witness taken before it ran.
                Some(ahead) => (self.enter_once(), Some(ahead.witness)),
                None => {
                    let before = self.step.stepping.then(|| {
                        self.machine.vcpu.clear_debug_report();
                        self.machine.vcpu.echo_witness()
                    });
                    (self.enter_once(), before)
                }
            };
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
                if self.echo.is_echo(step, may_branch_to_itself) {
                    tracing::trace!("passed over a single-step exit that ran nothing");
                    continue;
                }
            }
            return exit;
        }
    }

    /// One `KVM_RUN`, its exit copied out.
    fn enter_once(&mut self) -> Exit {
        let cpu = self.machine.cpus.on_stage();
        if self.steppers.has(cpu) {
            return self.enter_on_stepper(cpu);
        }
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
        self.settle(&mut exit, entry_rip, completes_mmio_read);
        exit
    }

    /// [`Vm::enter_once`] for a CPU its stepper enters: the step launched
    /// ahead, or one `KVM_RUN` there now.
    fn enter_on_stepper(&mut self, cpu: usize) -> Exit {
        let mut entry_rip = self.machine.vcpu.rip();
        let completes_mmio_read = self.step.mmio_read_pending;
        let (errno, ahead) = self.steppers.run(cpu);
        if let Some(ahead) = ahead {
            entry_rip = ahead.entry_rip;
        }
        let vcpu = &mut self.machine.vcpu;
        vcpu.ran_elsewhere(errno == 0);
        let mut exit = Exit::from_run_page(vcpu.run_page(), errno);
        self.settle(&mut exit, entry_rip, completes_mmio_read);
        exit
    }

    /// What an exit says of the vCPU entered at `entry_rip`: an OUT that
    /// moved RIP completed at its exit; MMIO (and the entry that completed
    /// an MMIO read, `completes_mmio_read`) went through KVM's emulator,
    /// which rewrote RFLAGS without TF.
    pub(super) fn settle(&mut self, exit: &mut Exit, entry_rip: u64, completes_mmio_read: bool) {
        match exit {
            Exit::IoOut { completed, .. } => *completed = self.machine.vcpu.rip() != entry_rip,
            Exit::MmioRead { .. } | Exit::MmioWrite { .. } => self.machine.vcpu.mark_step_stale(),
            _ if completes_mmio_read => self.machine.vcpu.mark_step_stale(),
            _ => {}
        }
    }

    /// Keeps the exit for crash reports.
    pub(super) fn note(&mut self, kind: &'static str, detail: u64) {
        let rip = self.machine.vcpu.rip();
        self.machine.history.record(ExitNote { kind, rip, detail });
    }
}

impl Exit {
    /// The exit another thread's `KVM_RUN` left in `run` (`errno` 0), or
    /// its error. kvm-ioctls reads `kvm_run` only inside `VcpuFd::run`,
    /// on the thread that enters the vCPU; a CPU running in parallel is
    /// entered by a thread that only enters it (see `parallel`), so the
    /// loop reads what it left here, for the exits an untraced guest
    /// makes, as kvm-ioctls does.
    pub(super) fn from_run_page(run: &mut kvm_bindings::kvm_run, errno: i32) -> Exit {
        use kvm_bindings::*;
        match errno {
            0 => {}
            libc::EINTR | libc::EAGAIN => return Exit::Interrupted,
            e => {
                let error = std::io::Error::from_raw_os_error(e);
                return Exit::Other(format!("KVM_RUN failed: {error}"));
            }
        }
        let base = (run as *mut kvm_run).cast::<u8>();
        // SAFETY: each arm reads the union member `exit_reason` names, as
        // KVM filled it; the I/O data lies inside the kvm_run mapping at
        // `data_offset` (KVM's layout, which kvm-ioctls reads the same way).
        unsafe {
            match run.exit_reason {
                KVM_EXIT_IO => {
                    let io = run.__bindgen_anon_1.io;
                    let size = (usize::from(io.size) * io.count as usize).min(8);
                    if u32::from(io.direction) == KVM_EXIT_IO_IN {
                        return Exit::IoIn {
                            port: io.port,
                            size,
                        };
                    }
                    let mut data = [0u8; 8];
                    let from = base.add(io.data_offset as usize);
                    std::ptr::copy_nonoverlapping(from, data.as_mut_ptr(), size);
                    Exit::IoOut {
                        port: io.port,
                        data,
                        size,
                        // Set from RIP by the caller.
                        completed: true,
                    }
                }
                KVM_EXIT_MMIO => {
                    let mmio = &mut run.__bindgen_anon_1.mmio;
                    let len = (mmio.len as usize).min(8);
                    if mmio.is_write != 0 {
                        let mut value = [0u8; 8];
                        value[..len].copy_from_slice(&mmio.data[..len]);
                        Exit::MmioWrite {
                            addr: mmio.phys_addr,
                            size: len as u8,
                            value: u64::from_le_bytes(value),
                        }
                    } else {
                        // Nothing is mapped as MMIO: reads float high.
                        mmio.data[..len].fill(0xff);
                        Exit::MmioRead {
                            addr: mmio.phys_addr,
                            size: len as u8,
                        }
                    }
                }
                KVM_EXIT_HLT => Exit::Halt,
                KVM_EXIT_IRQ_WINDOW_OPEN => Exit::IrqWindow,
                KVM_EXIT_INTR => Exit::Interrupted,
                KVM_EXIT_SHUTDOWN => Exit::Shutdown,
                KVM_EXIT_INTERNAL_ERROR => Exit::InternalError {
                    suberror: run.__bindgen_anon_1.internal.suberror,
                },
                KVM_EXIT_FAIL_ENTRY => Exit::FailEntry {
                    reason: run
                        .__bindgen_anon_1
                        .fail_entry
                        .hardware_entry_failure_reason,
                },
                KVM_EXIT_SYSTEM_EVENT => Exit::SystemEvent {
                    kind: run.__bindgen_anon_1.system_event.type_,
                },
                KVM_EXIT_DEBUG => {
                    let arch = run.__bindgen_anon_1.debug.arch;
                    Exit::Debug {
                        breakpoint: decide::breakpoint_hit(arch.dr6),
                        from_cpu: echo::raised_by_cpu(arch.dr7),
                    }
                }
                other => Exit::Other(format!("exit reason {other}")),
            }
        }
    }

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
