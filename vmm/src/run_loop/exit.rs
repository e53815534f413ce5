//! Serving what the guest exits for: one handler per exit kind (port and
//! MMIO access, HLT, debug exits, hypercalls, and the failures KVM
//! reports), each acting on the decisions in `decide`.

use kvm_bindings::{KVM_INTERNAL_ERROR_EMULATION, KVM_SYSTEM_EVENT_RESET};
use vtrace_guest::status;

use crate::console;
use crate::devices::hypercall::{Hypercall, HypercallOutcome, HypercallPort};
use crate::diagnostics::emulator_hint;
use crate::error::{Error, Result};
use crate::memory::GuestVirtualMemory;
use crate::monitor::Monitor;
use crate::monitor::{Directive, ExitView};
use crate::vm::Vm;

use super::decide::{self, AfterHalt};
use super::enter::Exit;
use super::{GuestExit, Next, Run};

impl Run<'_> {
    /// Serves one exit.
    pub(super) fn serve(&mut self, exit: Exit) -> Result<Next> {
        match exit {
            Exit::IoIn { port, size } => self.io_in(port, size),
            Exit::IoOut {
                port,
                data,
                size,
                completed,
            } => self.io_out(port, &data[..size.min(data.len())], completed),
            Exit::MmioRead { addr, size } => {
                self.vm.note("mmio", addr);
                let value = self.mmio_read(addr, size);
                self.mmio_told(ExitView::Mmio {
                    addr,
                    size,
                    write: false,
                    value,
                });
                Ok(Next::Continue)
            }
            Exit::MmioWrite { addr, size, value } => {
                self.vm.note("mmio", addr);
                // Told first: the device sees the time after what ran
                // before the store (see `mmio_told`).
                self.mmio_told(ExitView::Mmio {
                    addr,
                    size,
                    write: true,
                    value,
                });
                self.mmio_write(addr, value)?;
                Ok(Next::Continue)
            }
            Exit::Halt => self.hlt(),
            Exit::IrqWindow => {
                self.vm.note("irq-window", 0);
                Ok(Next::Continue)
            }
            Exit::Interrupted => {
                self.vm.machine.vcpu.clear_immediate_exit();
                if self.kicker.take_watchdog() && self.vm.step.stepping {
                    self.stepping_lost()?;
                }
                self.tell(ExitView::Interrupted);
                Ok(Next::Continue)
            }
            Exit::Debug { breakpoint, .. } => self.debug(breakpoint),
            Exit::Shutdown => {
                self.vm.note("shutdown", 0);
                Err(Error::GuestShutdown(Box::new(self.vm.crash_report(None))))
            }
            Exit::InternalError { suberror } => self.internal_error(suberror),
            Exit::FailEntry { reason } => Err(Error::GuestFailure {
                reason: format!("KVM could not enter the guest: hardware reason {reason:#x}"),
                report: Box::new(self.vm.crash_report(None)),
            }),
            Exit::SystemEvent { kind } if kind == KVM_SYSTEM_EVENT_RESET => {
                Ok(Next::Stop(GuestExit::Reset))
            }
            Exit::SystemEvent { .. } => {
                Err(Error::GuestShutdown(Box::new(self.vm.crash_report(None))))
            }
            Exit::Other(what) => Err(Error::GuestFailure {
                reason: format!("KVM stopped the guest: unexpected exit {what}"),
                report: Box::new(self.vm.crash_report(None)),
            }),
        }
    }

    /// A load of `size` bytes at `addr` outside RAM, from the on-stage
    /// CPU: its device's value, which goes to the guest on the next entry,
    /// or all ones where no device answers (the guest's load is not
    /// completed then).
    fn mmio_read(&mut self, addr: u64, size: u8) -> u64 {
        let machine = &mut self.vm.machine;
        let cpu = machine.cpus.on_stage();
        let now = machine.clock.now();
        match machine.devices.mmio_read(cpu, addr, now) {
            Some(value) => {
                let bytes = value.to_le_bytes();
                let bytes = &bytes[..usize::from(size).min(bytes.len())];
                machine.vcpu.complete_mmio_read(bytes);
                u64::from(le_u32(bytes))
            }
            None => u64::MAX >> (64 - 8 * u32::from(size.clamp(1, 8))),
        }
    }

    /// A store at `addr` outside RAM from the on-stage CPU, and the IPI it
    /// sends.
    fn mmio_write(&mut self, addr: u64, value: u64) -> Result<()> {
        let machine = &mut self.vm.machine;
        let cpu = machine.cpus.on_stage();
        let now = machine.clock.now();
        match machine.devices.mmio_write(cpu, addr, value, now) {
            Some(ipi) => self.send_ipi(ipi),
            None => Ok(()),
        }
    }

    /// Tells the monitor of an MMIO access and counts on the step clock
    /// the instructions that ran before it without a trap of their own
    /// (see [`crate::ExitAnswer`]).
    fn mmio_told(&mut self, view: ExitView) {
        let answer = self.tell(view);
        if self.vm.step.stepping && answer.instructions > 0 {
            self.vm.machine.clock.steps(answer.instructions);
        }
    }

    /// `IN`: a device's answer, or a hypercall on the hypercall port.
    fn io_in(&mut self, port: u16, size: usize) -> Result<Next> {
        self.vm.note("io-in", u64::from(port));
        if port == vtrace_guest::PORT && size == 4 {
            return self.hypercall();
        }
        let mut data = [0u8; 8];
        let data = &mut data[..size.min(8)];
        let machine = &mut self.vm.machine;
        machine.devices.pio_read(port, data, machine.clock.now());
        machine.vcpu.complete_io_in(data);
        self.tell(ExitView::IoIn {
            port,
            size: data.len() as u8,
            value: le_u32(data),
        });
        Ok(Next::Continue)
    }

    /// `OUT`: devices see the time after it on every host (see
    /// [`decide::out_counted_ahead`]).
    fn io_out(&mut self, port: u16, data: &[u8], completed: bool) -> Result<Next> {
        self.vm.note("io-out", u64::from(port));
        let machine = &mut self.vm.machine;
        machine.clock.step();
        self.vm.step.out_counted = decide::out_counted_ahead(completed);
        machine.devices.pio_write(port, data, machine.clock.now());
        self.tell(ExitView::IoOut {
            port,
            size: data.len() as u8,
            value: le_u32(data),
            completed,
        });
        Ok(Next::Continue)
    }

    /// HLT: wait for an interrupt, where one ran (see [`decide::after_halt`]).
    fn hlt(&mut self) -> Result<Next> {
        self.vm.note("hlt", 0);
        let answer = self.tell(ExitView::Halt);
        match decide::after_halt(self.vm.step.stepping, answer) {
            AfterHalt::RunOn => {
                self.vm.machine.vcpu.set_runnable()?;
                Ok(Next::Continue)
            }
            AfterHalt::Wait { clock_steps } => {
                if clock_steps > 0 {
                    self.vm.machine.clock.steps(clock_steps);
                }
                self.halt()
            }
        }
    }

    /// A single step or a hardware breakpoint (see [`decide::after_debug`]).
    fn debug(&mut self, breakpoint: bool) -> Result<Next> {
        self.vm.note("debug", 0);
        let answer = self.tell(ExitView::Debug { breakpoint });
        let after = decide::after_debug(breakpoint, answer, self.vm.step.out_counted);
        if after.settles_out {
            self.vm.step.out_counted = false;
        }
        if after.clock_steps > 0 {
            self.vm.machine.clock.steps(after.clock_steps);
        }
        if after.resume_flag {
            let mut regs = self.vm.machine.vcpu.regs();
            regs.rflags |= vtrace_x86::rflags::RF;
            self.vm.machine.vcpu.set_regs(&regs)?;
        }
        match after.then {
            Directive::Halt => self.halt(),
            Directive::ReArm => {
                self.vm.rearm()?;
                Ok(Next::Continue)
            }
            Directive::Continue => Ok(Next::Continue),
        }
    }

    /// KVM gave up: on an instruction its emulator lacks (which the VMM
    /// may complete itself), or for a reason of its own.
    fn internal_error(&mut self, suberror: u32) -> Result<Next> {
        self.vm.note("internal", u64::from(suberror));
        if suberror != KVM_INTERNAL_ERROR_EMULATION {
            return Err(Error::GuestFailure {
                reason: format!("KVM stopped the guest: internal error, suberror {suberror}"),
                report: Box::new(self.vm.crash_report(None)),
            });
        }
        if let Some(vector) = self.vm.complete_unemulated()? {
            self.vm.machine.clock.step();
            self.tell(ExitView::CompletedByVmm { vector });
            return Ok(Next::Continue);
        }
        let mut report = self.vm.crash_report(None);
        report.hint = Some(emulator_hint(report.decoded().as_ref()));
        Err(Error::EmulationFailure(Box::new(report)))
    }

    /// An `IN` on the hypercall port: the port serves what is the VMM's,
    /// the monitor the rest.
    fn hypercall(&mut self) -> Result<Next> {
        let call = self.vm.hypercall_at_rip();
        let machine = &mut self.vm.machine;
        let memory = machine.vcpu.memory(&machine.ram);
        let (result, log) =
            match answer_hypercall(&mut machine.hypercalls, &mut *self.monitor, call, &memory) {
                Answered::Reply { status, log } => (status, log),
                Answered::Exit(status) => return self.exit_hypercall(call, status),
            };
        self.vm.machine.vcpu.complete_io_in(&result.to_le_bytes());
        self.tell(ExitView::Hypercall { call, result });
        if let Some(text) = log {
            self.monitor.guest_log(&text);
        }
        Ok(Next::Continue)
    }

    /// The stepping watchdog found a `KVM_RUN` that ran on without its
    /// single-step exit (see `kick.rs`): arm stepping again and say so; the
    /// tracer records what ran unseen as a gap.
    fn stepping_lost(&mut self) -> Result<()> {
        self.vm.note("stepping-lost", 0);
        crate::console::user_message(&format!(
            "vtrace: the guest ran {} s without a single-step exit (now at rip {:#x}): \
             stepping is armed again, and the trace has a gap here",
            crate::kick::STEP_WATCHDOG.as_secs(),
            self.vm.machine.vcpu.rip()
        ));
        self.vm.rearm()
    }

    /// The EXIT hypercall. While stepping, the `in` completes, and steps,
    /// on the next entry, as every other hypercall's does: run it, so that
    /// the trace ends with it (as QEMU's does).
    fn exit_hypercall(&mut self, call: Hypercall, status: u8) -> Result<Next> {
        if self.vm.step.stepping {
            self.vm
                .machine
                .vcpu
                .complete_io_in(&status::OK.to_le_bytes());
            self.tell(ExitView::Hypercall {
                call,
                result: status::OK,
            });
            if let Exit::Debug {
                breakpoint: false, ..
            } = self.vm.enter()
            {
                self.tell(ExitView::Debug { breakpoint: false });
            }
        }
        Ok(Next::Stop(GuestExit::Status(status)))
    }
}

impl Vm {
    /// The hypercall the vCPU stands at (an `IN` on the hypercall port).
    fn hypercall_at_rip(&mut self) -> Hypercall {
        let regs = (&self.machine.vcpu.regs()).into();
        let long_mode = self.machine.vcpu.sregs().cs.l == 1;
        hypercall_of(&regs, long_mode, regs.rip)
    }
}

/// What a hypercall gets.
pub(super) enum Answered {
    /// This status in EAX, and the text it logged (LOG).
    Reply { status: i32, log: Option<String> },
    /// The guest asked to end the VM with this status.
    Exit(u8),
}

/// Serves `call`: the port serves what is the VMM's, `monitor` the rest
/// (its tracing commands); `memory` is the guest's by its linear
/// addresses (what LOG reads).
pub(super) fn answer_hypercall(
    port: &mut HypercallPort,
    monitor: &mut dyn Monitor,
    call: Hypercall,
    memory: &dyn GuestVirtualMemory,
) -> Answered {
    match port.handle(call, memory, &mut console::user_message) {
        HypercallOutcome::Reply { status, log } => Answered::Reply { status, log },
        HypercallOutcome::ForMonitor => {
            let answer = monitor.hypercall(&call);
            Answered::Reply {
                status: port.unanswered(call, answer, &mut console::user_message),
                log: None,
            }
        }
        HypercallOutcome::Exit(status) => Answered::Exit(status),
    }
}

/// The hypercall of an `IN` on the hypercall port at `rip`, with the
/// registers `regs`: its arguments cut to 32 bits outside long mode.
pub(super) fn hypercall_of(regs: &vtrace_x86::Registers, long_mode: bool, rip: u64) -> Hypercall {
    let width = |v: u64| if long_mode { v } else { v & 0xffff_ffff };
    Hypercall {
        command: regs.rax as u32,
        args: [
            width(regs.rbx),
            width(regs.rcx),
            width(regs.rsi),
            width(regs.rdi),
        ],
        more_args: [width(regs.r8), width(regs.r9)],
        rip,
    }
}

/// The first four bytes of `data` (zero-padded), little-endian.
pub(super) fn le_u32(data: &[u8]) -> u32 {
    let mut bytes = [0u8; 4];
    let n = data.len().min(4);
    bytes[..n].copy_from_slice(&data[..n]);
    u32::from_le_bytes(bytes)
}
