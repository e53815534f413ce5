//! The run loop: enter the guest, serve each exit, deliver interrupts.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use kvm_ioctls::VcpuExit;

use crate::clock::{VirtualClock, VirtualNanos};
use crate::console::{self, ConsoleInput, RawTerminal};
use crate::cpu::{soft_int, unemulated};
use crate::devices::hypercall::GuestVirtualMemory;
use crate::devices::hypercall::{Hypercall, HypercallOutcome, MarkStats};
use crate::diagnostics::{CrashReport, ExitNote, EMULATOR_HINT};
use crate::error::{Error, Result};
use crate::kick::Kicker;
use crate::memory::GuestRam;
use crate::monitor::{CpuView, Directive, Exception, ExceptionKind, ExitView, Injection, Monitor};
use crate::signals;
use crate::vcpu::Vcpu;
use crate::vm::{ConsoleMode, Vm};
use vtrace_guest::status;

/// How a run ended, when it ended the way a guest may end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestExit {
    /// The guest made the EXIT hypercall with this status.
    Status(u8),
    /// The guest reset the machine (i8042 or port 0xCF9): a reboot.
    Reset,
    /// The guest powered the machine off (ACPI S5).
    PowerOff,
    /// The user pressed `Ctrl-A x`.
    UserQuit,
    /// The monitor was done with the guest (a tracer told to end the run
    /// when tracing stops).
    MonitorDone,
    /// SIGINT, SIGTERM or SIGHUP (this number) asked vtrace to stop; see
    /// [`signals`](crate::signals).
    Signal(i32),
}

/// How a run ended, as the monitor is told in [`Monitor::on_finish`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish<'a> {
    /// The guest ended it (EXIT hypercall, power-off, reset), or the
    /// monitor did.
    Guest,
    /// The user pressed `Ctrl-A x`.
    UserQuit,
    /// A stop signal (its number).
    Signal(i32),
    /// The guest failed or KVM did; the first line of the error.
    Failure(&'a str),
}

/// What wakes the run loop between exits or from a halt.
enum Wake {
    /// Console input: bytes for the guest, a hotkey, or its end.
    Console(ConsoleInput),
    /// A `vtrace ctl` request is waiting.
    Control,
    /// A stop signal was caught.
    Signal,
}

/// What a finished run reports.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    pub exit: GuestExit,
    /// Virtual time at the end.
    pub virtual_time: Duration,
    /// Host time the run took.
    pub host_time: Duration,
    /// Interrupts injected, by ISA IRQ line.
    pub irqs: [u64; 16],
    /// VM exits served.
    pub exits: u64,
    /// MARK hypercalls, by identifier (the first
    /// [`MAX_MARK_IDS`](crate::devices::hypercall::MAX_MARK_IDS) ids).
    pub marks: BTreeMap<u64, MarkStats>,
    /// MARK calls with ids past that bound.
    pub marks_uncounted: u64,
    /// Guest lines (LOG, rejected calls) not printed: over the rate limit.
    pub guest_lines_not_shown: u64,
    /// Instructions (INT3, INT n, FWAIT, LDMXCSR...) the VMM completed because KVM's
    /// emulator could not.
    pub completed_by_vmm: u64,
}

impl RunOutcome {
    /// Timer (IRQ0) interrupts delivered to the guest.
    pub fn timer_interrupts(&self) -> u64 {
        self.irqs[0]
    }
}

const KVM_INTERNAL_ERROR_EMULATION: u32 = 1;

/// A function for another thread that sends `what` to the loop and kicks
/// the vCPU out of `KVM_RUN`.
fn waker(tx: &mpsc::Sender<Wake>, kicker: &Kicker, what: fn() -> Wake) -> Box<dyn Fn() + Send> {
    let (tx, handle) = (tx.clone(), kicker.handle());
    Box::new(move || {
        let _ = tx.send(what());
        handle.kick();
    })
}

/// An exit, copied out of `kvm_run` so the VM can be used while serving it.
enum Exit {
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
    },
    Other(String),
}

/// What serving an exit decided.
enum Next {
    Continue,
    Stop(GuestExit),
}

impl Vm {
    /// Runs the guest until it exits, resets, is quit by the user, or fails.
    pub fn run(&mut self, monitor: &mut dyn Monitor) -> Result<RunOutcome> {
        let _raw = match self.console {
            ConsoleMode::Interactive => RawTerminal::enable()?,
            ConsoleMode::OutputOnly => None,
        };
        let immediate_exit = &mut self.vcpu.run_page().immediate_exit as *mut u8;
        let kicker = Kicker::new(immediate_exit)?;
        let (tx, rx) = mpsc::channel();
        signals::catch_stop_signals()?;
        signals::set_waker(Some(waker(&tx, &kicker, || Wake::Signal)));
        if let Some(control) = &self.control {
            control.set_waker(waker(&tx, &kicker, || Wake::Control));
        }
        self.console_open = self.console == ConsoleMode::Interactive;
        if self.console_open {
            let (tx, handle) = (tx.clone(), kicker.handle());
            console::spawn_input_thread(move |input| {
                let sent = tx.send(Wake::Console(input)).is_ok();
                handle.kick();
                sent
            })?;
        }
        self.clock = if monitor.stepping() {
            VirtualClock::stepping_from_start(self.clock.mode())
        } else {
            VirtualClock::new(self.clock.mode())
        };
        let started = Instant::now();
        let mut irqs = [0u64; 16];
        let result = self.run_until_stop(&rx, &kicker, monitor, &mut irqs);
        signals::set_waker(None);
        let failure = result.as_ref().err().map(|e| {
            let text = e.to_string();
            text.lines().next().unwrap_or_default().to_string()
        });
        let finish = match (&result, failure.as_deref()) {
            (_, Some(failure)) => Finish::Failure(failure),
            (Ok(GuestExit::UserQuit), None) => Finish::UserQuit,
            (Ok(GuestExit::Signal(signal)), None) => Finish::Signal(*signal),
            _ => Finish::Guest,
        };
        monitor.on_finish(
            &mut KvmCpuView {
                vcpu: &mut self.vcpu,
                ram: &self.ram,
                cpuid: &self.cpuid,
            },
            finish,
        );
        let exit = result?;
        Ok(RunOutcome {
            exit,
            virtual_time: Duration::from_nanos(self.clock.now()),
            host_time: started.elapsed(),
            irqs,
            exits: self.history.total(),
            marks: self.hypercalls.marks().clone(),
            marks_uncounted: self.hypercalls.marks_uncounted(),
            guest_lines_not_shown: self.hypercalls.lines_not_shown(),
            completed_by_vmm: self.completed_by_vmm,
        })
    }

    fn run_until_stop(
        &mut self,
        rx: &Receiver<Wake>,
        kicker: &Kicker,
        monitor: &mut dyn Monitor,
        irqs: &mut [u64; 16],
    ) -> Result<GuestExit> {
        loop {
            if let Next::Stop(exit) = self.service(rx, monitor, irqs)? {
                return Ok(exit);
            }
            if monitor.done() {
                return Ok(GuestExit::MonitorDone);
            }
            if monitor.stepping() && !self.stepping && !self.io_pending {
                self.reclaim_queued_interrupt(monitor)?;
            }
            self.set_debug(monitor.stepping(), monitor.breakpoints())?;
            if self.stepping && !self.io_pending {
                if let Some(e) = monitor.exception_before_entry() {
                    self.deliver_exception(e, monitor)?;
                }
            }
            if self.stepping && self.vcpu.step_stale() {
                self.rearm()?;
            }
            kicker.set_quiet(self.stepping);
            match self
                .devices
                .next_deadline()
                .filter(|_| !self.stepping)
                .and_then(|d| self.clock.host_delay_until(d))
            {
                Some(delay) => kicker.kick_after(delay),
                None => kicker.cancel(),
            }
            monitor.before_entry(&mut KvmCpuView {
                vcpu: &mut self.vcpu,
                ram: &self.ram,
                cpuid: &self.cpuid,
            });
            let exit = self.enter();
            self.io_pending = matches!(
                exit,
                Exit::IoIn { .. }
                    | Exit::MmioRead { .. }
                    | Exit::IoOut {
                        completed: false,
                        ..
                    }
            );
            if let Next::Stop(exit) = self.serve(exit, rx, monitor, irqs)? {
                return Ok(exit);
            }
        }
    }

    /// Arms or disarms single-stepping and hardware breakpoints (only when
    /// they change: it is an ioctl).
    fn set_debug(&mut self, stepping: bool, breakpoints: &[u64]) -> Result<()> {
        let breakpoints = &breakpoints[..breakpoints.len().min(4)];
        if stepping == self.stepping && breakpoints == self.breakpoints.as_slice() {
            return Ok(());
        }
        let mut debug = kvm_bindings::kvm_guest_debug::default();
        if stepping || !breakpoints.is_empty() {
            debug.control = kvm_bindings::KVM_GUESTDBG_ENABLE;
        }
        if stepping {
            debug.control |= kvm_bindings::KVM_GUESTDBG_SINGLESTEP;
        }
        if !breakpoints.is_empty() {
            debug.control |= kvm_bindings::KVM_GUESTDBG_USE_HW_BP;
            for (i, addr) in breakpoints.iter().enumerate() {
                debug.arch.debugreg[i] = *addr;
                // Local enable; R/W and LEN 0: break on execution.
                debug.arch.debugreg[7] |= 1 << (2 * i);
            }
        }
        self.vcpu.set_guest_debug(&debug)?;
        if stepping != self.stepping {
            self.clock.set_stepping(stepping);
        }
        self.stepping = stepping;
        self.breakpoints = breakpoints.to_vec();
        Ok(())
    }

    /// Device work between exits: console input, interrupt lines, injection.
    fn service(
        &mut self,
        rx: &Receiver<Wake>,
        monitor: &mut dyn Monitor,
        irqs: &mut [u64; 16],
    ) -> Result<Next> {
        while let Ok(wake) = rx.try_recv() {
            if let Next::Stop(exit) = self.woken(wake, monitor) {
                return Ok(Next::Stop(exit));
            }
        }
        if let Some(signal) = signals::caught() {
            return Ok(Next::Stop(GuestExit::Signal(signal)));
        }
        self.serve_control(monitor);
        let now = self.clock.now();
        self.devices.update_interrupts(now);
        if let Some(end) = self.devices.machine_end() {
            return Ok(Next::Stop(end));
        }
        self.inject(irqs, monitor)?;
        Ok(Next::Continue)
    }

    /// Acts on what woke the loop (console input, a signal...).
    fn woken(&mut self, wake: Wake, monitor: &mut dyn Monitor) -> Next {
        match wake {
            Wake::Console(input) => self.console_input(input, monitor),
            Wake::Control => {
                self.serve_control(monitor);
                Next::Continue
            }
            Wake::Signal => match signals::caught() {
                Some(signal) => Next::Stop(GuestExit::Signal(signal)),
                None => Next::Continue,
            },
        }
    }

    /// Answers the waiting `vtrace ctl` requests.
    fn serve_control(&mut self, monitor: &mut dyn Monitor) {
        while let Some(request) = self.control.as_ref().and_then(|c| c.try_next()) {
            let answer = match request.command.as_str() {
                "status" => {
                    let own = format!(
                        "virtual time {:.6} s, {} exits",
                        self.clock.now() as f64 / 1e9,
                        self.history.total()
                    );
                    match monitor.control("status") {
                        Some(more) => format!("{more}; {own}"),
                        None => own,
                    }
                }
                command => monitor.control(command).unwrap_or_else(|| {
                    format!("error: unknown command '{command}' (start, stop, mark [ID], status)")
                }),
            };
            request.reply(answer);
        }
    }

    /// Delivers the PIC's pending interrupt if the guest can take it now,
    /// else asks KVM to exit as soon as it can.
    fn inject(&mut self, irqs: &mut [u64; 16], monitor: &mut dyn Monitor) -> Result<()> {
        let pending = self.devices.pic.pending_vector().is_some();
        if pending && self.stepping && !monitor.interruptible() {
            // Stepping exits after every instruction anyway.
            return Ok(());
        }
        let run = self.vcpu.run_page();
        if !pending {
            run.request_interrupt_window = 0;
            return Ok(());
        }
        if run.ready_for_interrupt_injection != 0 && run.if_flag != 0 {
            run.request_interrupt_window = 0;
            // An IN or MMIO read completes on the next entry; moving RIP
            // under it would break the completion. Deliver one exit later.
            // Whether the next entry steps, not whether the last one did:
            // an interrupt queued where tracing starts would be delivered by
            // the CPU with the tracer's TF in the frame it pushes, for the
            // guest to find after tracing stops.
            if monitor.deliver_interrupts() && monitor.stepping() && !self.io_pending {
                if let Some(handler) = self.deliver_through_idt()? {
                    if let Some((vector, irq)) = self.devices.pic.acknowledge() {
                        irqs[usize::from(irq)] += 1;
                        let how = Injection::Delivered { handler };
                        monitor.on_inject(
                            vector,
                            irq,
                            how,
                            &mut KvmCpuView {
                                vcpu: &mut self.vcpu,
                                ram: &self.ram,
                                cpuid: &self.cpuid,
                            },
                        );
                    }
                    return Ok(());
                }
            } else if monitor.deliver_interrupts() && self.io_pending {
                return Ok(());
            }
            if let Some((vector, irq)) = self.devices.pic.acknowledge() {
                self.vcpu.interrupt(vector)?;
                irqs[usize::from(irq)] += 1;
                monitor.on_inject(
                    vector,
                    irq,
                    Injection::Queued,
                    &mut KvmCpuView {
                        vcpu: &mut self.vcpu,
                        ram: &self.ram,
                        cpuid: &self.cpuid,
                    },
                );
            }
        } else {
            run.request_interrupt_window = 1;
        }
        Ok(())
    }

    /// Where stepping is about to start, an interrupt queued with
    /// `KVM_INTERRUPT` while it was off may still wait inside KVM (a kick,
    /// such as the `vtrace ctl start` that turns tracing on, cut the last
    /// `KVM_RUN` short). The CPU would deliver it with the tracer's TF in the
    /// frame it pushes and run the handler unstepped, so the VMM takes it
    /// back and delivers it through the IDT itself.
    fn reclaim_queued_interrupt(&mut self, monitor: &mut dyn Monitor) -> Result<()> {
        let Some(vector) = self.vcpu.take_queued_interrupt()? else {
            return Ok(());
        };
        match self.deliver_vector(vector)? {
            Some(handler) => monitor.on_inject(
                vector,
                // Counted by its IRQ line when it was queued.
                u8::MAX,
                Injection::Delivered { handler },
                &mut KvmCpuView {
                    vcpu: &mut self.vcpu,
                    ram: &self.ram,
                    cpuid: &self.cpuid,
                },
            ),
            None => self.vcpu.interrupt(vector)?,
        }
        Ok(())
    }

    /// Delivers the PIC's pending vector through the guest IDT in the VMM.
    /// Returns the handler address, or None where the VMM does not model
    /// the delivery (not 64-bit mode at CPL 0 or 3, a bad gate): the caller
    /// then queues the interrupt with KVM instead.
    fn deliver_through_idt(&mut self) -> Result<Option<u64>> {
        let Some(vector) = self.devices.pic.pending_vector() else {
            return Ok(None);
        };
        self.deliver_vector(vector)
    }

    /// Delivers `vector` through the guest IDT (see `deliver_through_idt`).
    fn deliver_vector(&mut self, vector: u8) -> Result<Option<u64>> {
        let mut regs = self.vcpu.regs();
        let mut sregs = self.vcpu.sregs();
        let return_rip = regs.rip;
        let memory = self.vcpu.memory(&self.ram);
        let Ok(sregs_changed) =
            soft_int::deliver(&memory, &mut regs, &mut sregs, vector, return_rip)
        else {
            return Ok(None);
        };
        if sregs_changed {
            self.vcpu.set_sregs(&sregs)?;
        }
        self.vcpu.set_regs(&regs)?;
        Ok(Some(regs.rip))
    }

    /// Delivers an exception the monitor foresaw, through the guest's IDT,
    /// and tells the monitor. Where the VMM does not model the delivery
    /// (see `soft_int`), the instruction runs and the CPU delivers it.
    fn deliver_exception(&mut self, e: Exception, monitor: &mut dyn Monitor) -> Result<()> {
        let mut regs = self.vcpu.regs();
        let mut sregs = self.vcpu.sregs();
        if let Some(cr2) = e.cr2 {
            sregs.cr2 = cr2;
        }
        let memory = self.vcpu.memory(&self.ram);
        let delivered = soft_int::deliver_with_error_code(
            &memory,
            &mut regs,
            &mut sregs,
            e.vector,
            e.return_rip,
            e.error_code,
        );
        if let Err(why) = delivered {
            tracing::debug!("vector {} not delivered by the VMM: {why}", e.vector);
            return Ok(());
        }
        self.vcpu.set_sregs(&sregs)?;
        self.vcpu.set_regs(&regs)?;
        let view = match e.kind {
            ExceptionKind::Fault => ExitView::FaultDelivered {
                vector: e.vector,
                error_code: e.error_code,
            },
            ExceptionKind::SoftwareInterrupt => {
                // The instruction completed.
                self.clock.step();
                ExitView::CompletedByVmm {
                    vector: Some(e.vector),
                }
            }
        };
        self.tell(monitor, view);
        Ok(())
    }

    /// Issues the current debug configuration again (re-arming TF).
    fn rearm(&mut self) -> Result<()> {
        let (stepping, breakpoints) = (self.stepping, std::mem::take(&mut self.breakpoints));
        self.stepping = !stepping;
        self.set_debug(stepping, &breakpoints)
    }

    fn console_input(&mut self, input: ConsoleInput, monitor: &mut dyn Monitor) -> Next {
        match input {
            ConsoleInput::Guest(bytes) => self.devices.serial.queue_input(&bytes),
            ConsoleInput::Hotkey(b'x') => {
                console::user_message("vtrace: terminated by Ctrl-A x");
                return Next::Stop(GuestExit::UserQuit);
            }
            ConsoleInput::Hotkey(b'h' | b'?') => {
                let mut help = String::from(
                    "vtrace console keys (press Ctrl-A, then the key):\n  \
                     Ctrl-A x    quit vtrace\n  \
                     Ctrl-A h    this help\n  \
                     Ctrl-A r    show the guest's registers and recent exits\n  \
                     Ctrl-A s    show run statistics\n  \
                     Ctrl-A C-a  send Ctrl-A to the guest",
                );
                for (key, meaning) in monitor.hotkey_help() {
                    help.push_str(&format!("\n  Ctrl-A {key}    {meaning}"));
                }
                console::user_message(&help);
            }
            ConsoleInput::Hotkey(b'r') => {
                let report = self.crash_report(None);
                console::user_message(&format!("vtrace: guest state\n{report}"));
            }
            ConsoleInput::Hotkey(b's') => {
                console::user_message(&format!(
                    "vtrace: virtual time {:.3} s, {} exits, timer interrupts {}, \
                     instructions completed by vtrace {}",
                    self.clock.now() as f64 / 1e9,
                    self.history.total(),
                    self.devices.timer_edges,
                    self.completed_by_vmm
                ));
            }
            ConsoleInput::Hotkey(key) => match monitor.hotkey(key) {
                Some(message) => console::user_message(&message),
                None => console::user_message(&format!(
                    "vtrace: Ctrl-A {} does nothing (Ctrl-A h lists the keys)",
                    char::from(key).escape_default()
                )),
            },
            ConsoleInput::Closed => self.console_open = false,
        }
        Next::Continue
    }

    /// Runs the vCPU until its next exit.
    fn enter(&mut self) -> Exit {
        let entry_rip = self.vcpu.rip();
        let exit = match self.vcpu.run() {
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
                let suberror = unsafe { self.vcpu.run_page().__bindgen_anon_1.internal.suberror };
                Exit::InternalError { suberror }
            }
            Ok(VcpuExit::FailEntry(reason, _)) => Exit::FailEntry { reason },
            Ok(VcpuExit::SystemEvent(kind, _)) => Exit::SystemEvent { kind },
            Ok(VcpuExit::Debug(arch)) => Exit::Debug {
                // DR6 bits 0-3: a hardware breakpoint matched; BS (14): a step.
                breakpoint: arch.dr6 & 0xf != 0 && arch.dr6 & (1 << 14) == 0,
            },
            Ok(VcpuExit::Intr) => Exit::Interrupted,
            Ok(other) => Exit::Other(format!("{other:?}")),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Exit::Interrupted,
            Err(e) => Exit::Other(format!("KVM_RUN failed: {e}")),
        };
        let mut exit = exit;
        match &mut exit {
            Exit::IoOut { completed, .. } => *completed = self.vcpu.rip() != entry_rip,
            // KVM's emulator ran the access and rewrote RFLAGS without TF.
            Exit::MmioRead { .. } | Exit::MmioWrite { .. } => self.vcpu.mark_step_stale(),
            _ => {}
        }
        exit
    }

    fn note(&mut self, kind: &'static str, detail: u64) {
        let rip = self.vcpu.rip();
        self.history.record(ExitNote { kind, rip, detail });
    }

    fn serve(
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
                let now = self.clock.now();
                self.devices.pio_read(port, &mut data[..size.min(8)], now);
                self.vcpu.complete_io_in(&data[..size.min(8)]);
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
                self.clock.step();
                self.out_counted = !completed;
                let now = self.clock.now();
                self.devices.pio_write(port, &data[..size], now);
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
                if self.stepping {
                    if directive != Directive::Halt {
                        // The monitor saw no HLT run (see ExitView::Halt).
                        self.vcpu.set_runnable()?;
                        return Ok(Next::Continue);
                    }
                    self.clock.steps(monitor.instructions_at_exit());
                }
                return self.halt(rx, monitor, irqs);
            }
            Exit::IrqWindow => self.note("irq-window", 0),
            Exit::Interrupted => {
                self.vcpu.clear_immediate_exit();
                self.tell(monitor, ExitView::Interrupted);
            }
            Exit::Debug { breakpoint } => {
                self.note("debug", 0);
                let directive = self.tell(monitor, ExitView::Debug { breakpoint });
                if !breakpoint {
                    let counted = u64::from(std::mem::take(&mut self.out_counted));
                    self.clock
                        .steps(monitor.instructions_at_exit().saturating_sub(counted));
                }
                if breakpoint {
                    // An instruction breakpoint fires before the instruction:
                    // RF lets it run once without firing again.
                    let mut regs = self.vcpu.regs();
                    regs.rflags |= 1 << 16;
                    self.vcpu.set_regs(&regs)?;
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
                        self.clock.step();
                        self.tell(monitor, ExitView::CompletedByVmm { vector });
                        return Ok(Next::Continue);
                    }
                }
                if suberror == KVM_INTERNAL_ERROR_EMULATION {
                    let hint = Some(EMULATOR_HINT.to_string());
                    return Err(Error::EmulationFailure(Box::new(self.crash_report(hint))));
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

    fn hypercall(&mut self, monitor: &mut dyn Monitor) -> Result<Next> {
        let regs = self.vcpu.regs();
        let long_mode = self.vcpu.sregs().cs.l == 1;
        let width = |v: u64| if long_mode { v } else { v & 0xffff_ffff };
        let call = Hypercall {
            command: regs.rax as u32,
            args: [
                width(regs.rbx),
                width(regs.rcx),
                width(regs.rsi),
                width(regs.rdi),
            ],
        };
        let memory = self.vcpu.memory(&self.ram);
        let outcome = self
            .hypercalls
            .handle(call, &memory, monitor, &mut console::user_message);
        match outcome {
            HypercallOutcome::Reply(status) => {
                self.vcpu.complete_io_in(&status.to_le_bytes());
                self.tell(
                    monitor,
                    ExitView::Hypercall {
                        call,
                        result: status,
                    },
                );
                if let Some(text) = self.hypercalls.take_log() {
                    monitor.guest_log(&text);
                }
                Ok(Next::Continue)
            }
            HypercallOutcome::Exit(status) => {
                if self.stepping {
                    // The `in` completes, and steps, on the next entry, as
                    // every other hypercall's does: run it, so that the
                    // trace ends with it (as QEMU's does).
                    self.vcpu.complete_io_in(&status::OK.to_le_bytes());
                    self.tell(
                        monitor,
                        ExitView::Hypercall {
                            call,
                            result: status::OK,
                        },
                    );
                    if let Exit::Debug { breakpoint: false } = self.enter() {
                        self.tell(monitor, ExitView::Debug { breakpoint: false });
                    }
                }
                Ok(Next::Stop(GuestExit::Status(status)))
            }
        }
    }

    /// The guest executed HLT: wait (in host time) until a device has
    /// something for it, serving console input meanwhile.
    fn halt(
        &mut self,
        rx: &Receiver<Wake>,
        monitor: &mut dyn Monitor,
        irqs: &mut [u64; 16],
    ) -> Result<Next> {
        if self.vcpu.run_page().if_flag == 0 {
            return Err(Error::GuestFailure {
                reason: "the guest halted with interrupts disabled, so nothing can wake it \
                         (a guest that is done should use the EXIT hypercall)"
                    .into(),
                report: Box::new(self.crash_report(None)),
            });
        }
        loop {
            let now: VirtualNanos = self.clock.now();
            self.devices.update_interrupts(now);
            if let Some(end) = self.devices.machine_end() {
                return Ok(Next::Stop(end));
            }
            if self.devices.pic.pending_vector().is_some() {
                self.inject(irqs, monitor)?;
                return Ok(Next::Continue);
            }
            let deadline = self.devices.next_deadline();
            if let (Some(d), true) = (deadline, self.clock.step_driven()) {
                // Nothing runs while the guest idles: jump to its next event.
                self.clock.skip_to(d);
                continue;
            }
            let wait = deadline
                .and_then(|d| self.clock.host_delay_until(d))
                .unwrap_or(Duration::from_millis(100));
            if let Some(signal) = signals::caught() {
                return Ok(Next::Stop(GuestExit::Signal(signal)));
            }
            if deadline.is_none() && !self.console_open {
                return Err(Error::GuestFailure {
                    reason: "the guest halted with no timer programmed and no console \
                             input, so nothing can wake it"
                        .into(),
                    report: Box::new(self.crash_report(None)),
                });
            }
            match rx.recv_timeout(wait) {
                Ok(wake) => {
                    if let Next::Stop(exit) = self.woken(wake, monitor) {
                        return Ok(Next::Stop(exit));
                    }
                }
                // The senders live as long as the loop: a timeout, or a
                // channel that cannot end.
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
            }
        }
    }

    /// Where KVM's emulator gave up on an instruction the VMM can complete
    /// itself (see `cpu::unemulated`), does so and returns true: the guest
    /// goes on as if the CPU had run it.
    fn complete_unemulated(&mut self) -> Result<Option<Option<u8>>> {
        let mut regs = self.vcpu.regs();
        let mut sregs = self.vcpu.sregs();
        let memory = self.vcpu.memory(&self.ram);
        let mut code = [0u8; 15];
        let linear = sregs.cs.base.wrapping_add(regs.rip);
        // The instruction may end a mapped page; read what there is.
        let readable = (1..=code.len())
            .rev()
            .find(|&n| memory.read_virtual(linear, &mut code[..n]).is_ok());
        let Some(len) = readable else {
            return Ok(None);
        };
        let bitness = CrashReport::bitness_of(&sregs);
        let Some(plan) = unemulated::plan(&code[..len], bitness, &regs, &sregs) else {
            return Ok(None);
        };
        let mut fpu = self.vcpu.fpu()?;
        let (cs_before, fpu_before) = (sregs.cs, (fpu.mxcsr, fpu.fsw));
        let vector = match unemulated::complete(plan, &memory, &mut regs, &mut sregs, &mut fpu) {
            Ok(vector) => vector,
            Err(e) => {
                tracing::debug!("{plan:?} not completed: {e}");
                return Ok(None);
            }
        };
        if sregs.cs != cs_before {
            self.vcpu.set_sregs(&sregs)?;
        }
        if (fpu.mxcsr, fpu.fsw) != fpu_before {
            self.vcpu.set_fpu(&fpu)?;
        }
        self.vcpu.set_regs(&regs)?;
        self.completed_by_vmm += 1;
        tracing::debug!("completed {plan:?}; guest continues at {:#x}", regs.rip);
        Ok(Some(vector))
    }

    /// Passes an exit to the monitor.
    fn tell(&mut self, monitor: &mut dyn Monitor, exit: ExitView) -> Directive {
        monitor.on_exit(
            &exit,
            &mut KvmCpuView {
                vcpu: &mut self.vcpu,
                ram: &self.ram,
                cpuid: &self.cpuid,
            },
        )
    }

    fn crash_report(&mut self, hint: Option<String>) -> CrashReport {
        let regs = self.vcpu.regs();
        let sregs = self.vcpu.sregs();
        let linear = sregs.cs.base.wrapping_add(regs.rip);
        let mut code = vec![0u8; 15];
        let memory = self.vcpu.memory(&self.ram);
        let code =
            crate::devices::hypercall::GuestVirtualMemory::read_virtual(&memory, linear, &mut code)
                .ok()
                .map(|()| code);
        CrashReport {
            regs,
            sregs,
            code,
            recent_exits: self.history.recent(),
            hint,
        }
    }
}

/// The monitor's view of the vCPU: sync registers and guest RAM.
struct KvmCpuView<'a> {
    vcpu: &'a mut Vcpu,
    ram: &'a GuestRam,
    cpuid: &'a kvm_bindings::CpuId,
}

impl CpuView for KvmCpuView<'_> {
    fn regs(&mut self) -> kvm_bindings::kvm_regs {
        self.vcpu.regs()
    }

    fn sregs(&mut self) -> kvm_bindings::kvm_sregs {
        self.vcpu.sregs()
    }

    fn read_physical(&self, gpa: u64, buf: &mut [u8]) -> bool {
        use vm_memory::{Bytes, GuestAddress};
        self.ram.read_slice(buf, GuestAddress(gpa)).is_ok()
    }

    fn write_physical(&mut self, gpa: u64, data: &[u8]) -> bool {
        use vm_memory::{Bytes, GuestAddress};
        self.ram.write_slice(data, GuestAddress(gpa)).is_ok()
    }

    fn write_regs(&mut self, regs: &kvm_bindings::kvm_regs) -> bool {
        self.vcpu.set_regs(regs).is_ok()
    }

    fn cpuid_as_given(&self, function: u32, index: u32, seen: [u32; 4]) -> [u32; 4] {
        crate::cpu::cpuid::as_given(self.cpuid, function, index, seen)
    }

    fn read_msr(&mut self, index: u32) -> Option<u64> {
        self.vcpu.msr(index)
    }

    fn write_msr(&mut self, index: u32, value: u64) -> bool {
        self.vcpu.set_msr(index, value)
    }
}
