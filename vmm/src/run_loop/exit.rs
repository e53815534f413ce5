//! Entering the guest and serving what it exits for: port and MMIO
//! access, HLT, debug exits, hypercalls, and the failures KVM reports.

use std::sync::mpsc::Receiver;

use kvm_ioctls::VcpuExit;
use vtrace_guest::status;

use crate::console;
use crate::cpu::{echo, unemulated};
use crate::devices::hypercall::{Hypercall, HypercallOutcome};
use crate::diagnostics::{emulator_hint, CrashReport, ExitNote};
use crate::error::{Error, Result};
use crate::monitor::{Directive, ExitView, Monitor};
use crate::vm::Vm;
use crate::x86::SpecialRegisters;

use super::{GuestExit, Next, Wake};

const KVM_INTERNAL_ERROR_EMULATION: u32 = 1;

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
                // DR6 bits 0-3: a hardware breakpoint matched; BS (14): a step.
                breakpoint: arch.dr6 & 0xf != 0 && arch.dr6 & (1 << 14) == 0,
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
            _ => {}
        }
        exit
    }

    pub(super) fn note(&mut self, kind: &'static str, detail: u64) {
        let rip = self.machine.vcpu.rip();
        self.machine.history.record(ExitNote { kind, rip, detail });
    }

    pub(super) fn serve(
        &mut self,
        exit: Exit,
        rx: &Receiver<Wake>,
        monitor: &mut dyn Monitor,
        irqs: &mut [u64; 16],
    ) -> Result<Next> {
        match exit {
            Exit::IoIn { port, size } => {
                self.note("io-in", u64::from(port));
                if port == vtrace_guest::PORT && size == 4 {
                    return self.hypercall(monitor);
                }
                let mut data = [0u8; 8];
                let now = self.machine.clock.now();
                self.machine
                    .devices
                    .pio_read(port, &mut data[..size.min(8)], now);
                self.machine.vcpu.complete_io_in(&data[..size.min(8)]);
                let value = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
                self.tell(
                    monitor,
                    ExitView::IoIn {
                        port,
                        size: size as u8,
                        value,
                    },
                );
            }
            Exit::IoOut {
                port,
                data,
                size,
                completed,
            } => {
                self.note("io-out", u64::from(port));
                // Devices see the time after the OUT on every host; where
                // it completes on the next entry, that exit's step is
                // already counted here.
                self.machine.clock.step();
                self.step.out_counted = !completed;
                let now = self.machine.clock.now();
                self.machine.devices.pio_write(port, &data[..size], now);
                let value = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
                self.tell(
                    monitor,
                    ExitView::IoOut {
                        port,
                        size: size as u8,
                        value,
                        completed,
                    },
                );
            }
            Exit::MmioRead { addr, size } => {
                self.note("mmio", addr);
                let view = ExitView::Mmio {
                    addr,
                    size,
                    write: false,
                    value: u64::MAX >> (64 - 8 * u32::from(size.clamp(1, 8))),
                };
                self.tell(monitor, view);
            }
            Exit::MmioWrite { addr, size, value } => {
                self.note("mmio", addr);
                let view = ExitView::Mmio {
                    addr,
                    size,
                    write: true,
                    value,
                };
                self.tell(monitor, view);
            }
            Exit::Halt => {
                self.note("hlt", 0);
                let directive = self.tell(monitor, ExitView::Halt);
                if self.step.stepping {
                    if directive != Directive::Halt {
                        // The monitor saw no HLT run (see ExitView::Halt).
                        self.machine.vcpu.set_runnable()?;
                        return Ok(Next::Continue);
                    }
                    self.machine.clock.steps(monitor.instructions_at_exit());
                }
                return self.halt(rx, monitor, irqs);
            }
            Exit::IrqWindow => self.note("irq-window", 0),
            Exit::Interrupted => {
                self.machine.vcpu.clear_immediate_exit();
                self.tell(monitor, ExitView::Interrupted);
            }
            Exit::Debug { breakpoint, .. } => {
                self.note("debug", 0);
                let directive = self.tell(monitor, ExitView::Debug { breakpoint });
                if !breakpoint {
                    let counted = u64::from(std::mem::take(&mut self.step.out_counted));
                    self.machine
                        .clock
                        .steps(monitor.instructions_at_exit().saturating_sub(counted));
                }
                if breakpoint {
                    // An instruction breakpoint fires before the instruction:
                    // RF lets it run once without firing again.
                    let mut regs = self.machine.vcpu.regs();
                    regs.rflags |= 1 << 16;
                    self.machine.vcpu.set_regs(&regs)?;
                }
                match directive {
                    Directive::Halt => return self.halt(rx, monitor, irqs),
                    Directive::ReArm => self.rearm()?,
                    Directive::Continue => {}
                }
            }
            Exit::Shutdown => {
                self.note("shutdown", 0);
                return Err(Error::GuestShutdown(Box::new(self.crash_report(None))));
            }
            Exit::InternalError { suberror } => {
                self.note("internal", u64::from(suberror));
                if suberror == KVM_INTERNAL_ERROR_EMULATION {
                    if let Some(vector) = self.complete_unemulated()? {
                        self.machine.clock.step();
                        self.tell(monitor, ExitView::CompletedByVmm { vector });
                        return Ok(Next::Continue);
                    }
                }
                if suberror == KVM_INTERNAL_ERROR_EMULATION {
                    let mut report = self.crash_report(None);
                    report.hint = Some(emulator_hint(report.decoded().as_ref()));
                    return Err(Error::EmulationFailure(Box::new(report)));
                }
                return Err(Error::GuestFailure {
                    reason: format!("KVM stopped the guest: internal error, suberror {suberror}"),
                    report: Box::new(self.crash_report(None)),
                });
            }
            Exit::FailEntry { reason } => {
                return Err(Error::GuestFailure {
                    reason: format!("KVM could not enter the guest: hardware reason {reason:#x}"),
                    report: Box::new(self.crash_report(None)),
                });
            }
            Exit::SystemEvent { kind } => {
                const KVM_SYSTEM_EVENT_RESET: u32 = 2;
                if kind == KVM_SYSTEM_EVENT_RESET {
                    return Ok(Next::Stop(GuestExit::Reset));
                }
                return Err(Error::GuestShutdown(Box::new(self.crash_report(None))));
            }
            Exit::Other(what) => {
                return Err(Error::GuestFailure {
                    reason: format!("KVM stopped the guest: unexpected exit {what}"),
                    report: Box::new(self.crash_report(None)),
                });
            }
        }
        Ok(Next::Continue)
    }

    pub(super) fn hypercall(&mut self, monitor: &mut dyn Monitor) -> Result<Next> {
        let regs = self.machine.vcpu.regs();
        let long_mode = self.machine.vcpu.sregs().cs.l == 1;
        let width = |v: u64| if long_mode { v } else { v & 0xffff_ffff };
        let call = Hypercall {
            command: regs.rax as u32,
            args: [
                width(regs.rbx),
                width(regs.rcx),
                width(regs.rsi),
                width(regs.rdi),
            ],
            more_args: [width(regs.r8), width(regs.r9)],
            rip: regs.rip,
        };
        let memory = self.machine.vcpu.memory(&self.machine.ram);
        let outcome =
            self.machine
                .hypercalls
                .handle(call, &memory, monitor, &mut console::user_message);
        match outcome {
            HypercallOutcome::Reply(status) => {
                self.machine.vcpu.complete_io_in(&status.to_le_bytes());
                self.tell(
                    monitor,
                    ExitView::Hypercall {
                        call,
                        result: status,
                    },
                );
                if let Some(text) = self.machine.hypercalls.take_log() {
                    monitor.guest_log(&text);
                }
                Ok(Next::Continue)
            }
            HypercallOutcome::Exit(status) => {
                if self.step.stepping {
                    // The `in` completes, and steps, on the next entry, as
                    // every other hypercall's does: run it, so that the
                    // trace ends with it (as QEMU's does).
                    self.machine.vcpu.complete_io_in(&status::OK.to_le_bytes());
                    self.tell(
                        monitor,
                        ExitView::Hypercall {
                            call,
                            result: status::OK,
                        },
                    );
                    if let Exit::Debug {
                        breakpoint: false, ..
                    } = self.enter()
                    {
                        self.tell(monitor, ExitView::Debug { breakpoint: false });
                    }
                }
                Ok(Next::Stop(GuestExit::Status(status)))
            }
        }
    }

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
        let regs = self.machine.vcpu.regs();
        let sregs = self.machine.vcpu.sregs();
        let linear = sregs.cs.base.wrapping_add(regs.rip);
        let mut code = vec![0u8; 15];
        let memory = self.machine.vcpu.memory(&self.machine.ram);
        let code =
            crate::devices::hypercall::GuestVirtualMemory::read_virtual(&memory, linear, &mut code)
                .ok()
                .map(|()| code);
        CrashReport {
            regs: (&regs).into(),
            sregs: (&sregs).into(),
            code,
            recent_exits: self.machine.history.recent(),
            hint,
        }
    }
}
