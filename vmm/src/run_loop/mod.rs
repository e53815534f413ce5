//! The run loop: enter the guest, serve each exit, deliver interrupts.
//!
//! One room a job: `exit` enters the guest and serves what it exits for
//! (passing over the single-step exits KVM on VT-x reports twice),
//! `inject` delivers interrupts and foreseen exceptions, `halt` waits while
//! the guest idles, `requests` answers the console's hotkeys and `vtrace
//! ctl`. This file holds the loop itself and what the rooms share.

mod exit;
mod halt;
mod inject;
mod requests;

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use crate::console::ConsoleInput;
use crate::devices::hypercall::MarkStats;
use crate::error::Result;
use crate::frontends::waker;
use crate::kick::Kicker;
use crate::memory::{GuestRam, LowRam};
use crate::monitor::{CpuView, Directive, ExitView, Monitor};
use crate::peep::{PeepMessage, PeepReport};
use crate::signals;
use crate::vcpu::Vcpu;
use crate::vm::Vm;
use crate::x86::{Registers, SpecialRegisters};

use exit::Exit;

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
    /// [`stop_signals`](crate::stop_signals).
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
pub(crate) enum Wake {
    /// Console input: bytes for the guest, a hotkey, or its end.
    Console(ConsoleInput),
    /// A `vtrace ctl` request is waiting.
    Control,
    /// A stop signal was caught.
    Signal,
    /// The peeper has samples, or asks for one with the pc.
    Peep(PeepMessage),
}

/// What a finished run reports.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    /// How it ended.
    pub exit: GuestExit,
    /// Virtual time at the end.
    pub virtual_time: Duration,
    /// Host time the run took.
    pub host_time: Duration,
    /// Interrupts injected, by ISA IRQ line.
    pub irqs: [u64; 16],
    /// VM exits served.
    pub exits: u64,
    /// MARK hypercalls, by identifier (only so many distinct ids are
    /// counted: a guest cannot grow the VMM with them).
    pub marks: BTreeMap<u64, MarkStats>,
    /// MARK calls with ids past that bound.
    pub marks_uncounted: u64,
    /// Guest lines (LOG, rejected calls) not printed: over the rate limit.
    pub guest_lines_not_shown: u64,
    /// Instructions (INT3, INT n, FWAIT, LDMXCSR...) the VMM completed because KVM's
    /// emulator could not.
    pub completed_by_vmm: u64,
    /// What the peeper did, where the run had one ([`Vm::peep`]).
    pub peeped: Option<PeepReport>,
}

impl RunOutcome {
    /// Timer (IRQ0) interrupts delivered to the guest.
    pub fn timer_interrupts(&self) -> u64 {
        self.irqs[0]
    }
}

/// What serving an exit decided.
pub(super) enum Next {
    Continue,
    Stop(GuestExit),
}

impl Vm {
    /// Runs the guest until it exits, resets, is quit by the user, or fails.
    pub fn run(&mut self, monitor: &mut dyn Monitor) -> Result<RunOutcome> {
        let immediate_exit = &mut self.machine.vcpu.run_page().immediate_exit as *mut u8;
        let kicker = Kicker::new(immediate_exit)?;
        let (tx, rx) = mpsc::channel();
        let clock = self.machine.clock.reader();
        let _raw = self
            .frontends
            .start(&tx, &kicker, &self.machine.ram, clock)?;
        signals::catch_stop_signals()?;
        signals::set_waker(Some(waker(&tx, &kicker, || Wake::Signal)));
        self.machine.clock.restart(monitor.stepping());
        let started = Instant::now();
        let mut irqs = [0u64; 16];
        let result = self.run_until_stop(&rx, &kicker, monitor, &mut irqs);
        // The guest's time when it stopped: a wall-driven clock would run
        // on while the run is wound up (the peeper joined, the trace
        // flushed); the final sample and the summary tell the same moment.
        let stopped_at = self.machine.clock.freeze();
        signals::set_waker(None);
        let peeped = self.stop_peeping(&rx, monitor, stopped_at);
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
        monitor.on_finish(&mut self.cpu_view(), finish);
        let exit = result?;
        Ok(RunOutcome {
            exit,
            virtual_time: Duration::from_nanos(stopped_at),
            host_time: started.elapsed(),
            irqs,
            exits: self.machine.history.total(),
            marks: self.machine.hypercalls.marks().clone(),
            marks_uncounted: self.machine.hypercalls.marks_uncounted(),
            guest_lines_not_shown: self.machine.hypercalls.lines_not_shown(),
            completed_by_vmm: self.machine.completed_by_vmm,
            peeped,
        })
    }

    /// Stops the peeper and hands the monitor every sample still on its
    /// way, the last one taken after the guest stopped.
    fn stop_peeping(
        &mut self,
        rx: &Receiver<Wake>,
        monitor: &mut dyn Monitor,
        stopped_at: u64,
    ) -> Option<PeepReport> {
        let peeper = self.frontends.peeper.take()?;
        let (rest, report) = peeper.stop(stopped_at);
        for wake in rx.try_iter() {
            if let Wake::Peep(PeepMessage::Batch(batch)) = wake {
                monitor.peeped(&batch.samples);
            }
        }
        monitor.peeped(&rest);
        Some(report)
    }

    pub(super) fn run_until_stop(
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
            if monitor.stepping() && !self.step.stepping && !self.step.io_pending {
                self.reclaim_queued_interrupt(monitor)?;
            }
            self.set_debug(monitor.stepping(), monitor.breakpoints())?;
            if self.step.stepping && !self.step.io_pending {
                if let Some(e) = monitor.exception_before_entry() {
                    self.deliver_exception(e, monitor)?;
                }
            }
            if self.step.stepping && self.machine.vcpu.step_stale() {
                self.rearm()?;
            }
            kicker.set_quiet(self.step.stepping);
            match self
                .machine
                .devices
                .next_deadline()
                .filter(|_| !self.step.stepping)
                .and_then(|d| self.machine.clock.host_delay_until(d))
            {
                Some(delay) => kicker.kick_after(delay),
                None => kicker.cancel(),
            }
            monitor.before_entry(&mut self.cpu_view());
            let exit = self.enter();
            self.step.io_pending = matches!(
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
    pub(super) fn set_debug(&mut self, stepping: bool, breakpoints: &[u64]) -> Result<()> {
        let breakpoints = &breakpoints[..breakpoints.len().min(crate::x86::dr::BREAKPOINTS)];
        // Once per exit: a slice `==` is a libc memcmp call, which took
        // 1.6 % of a traced run's vCPU thread; at most four addresses
        // compare faster inline.
        let same =
            |a: &[u64], b: &[u64]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y);
        if stepping == self.step.stepping && same(breakpoints, &self.step.breakpoints) {
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
        self.machine.vcpu.set_guest_debug(&debug)?;
        if stepping != self.step.stepping {
            self.machine.clock.set_stepping(stepping);
        }
        self.step.stepping = stepping;
        self.step.breakpoints = breakpoints.to_vec();
        Ok(())
    }

    /// Device work between exits: console input, interrupt lines, injection.
    pub(super) fn service(
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
        if self.frontends.progress.is_some() {
            self.report_progress_if_due(monitor);
        }
        let now = self.machine.clock.now();
        self.machine.devices.update_interrupts(now);
        if let Some(end) = self.machine.devices.machine_end() {
            return Ok(Next::Stop(end));
        }
        self.inject(irqs, monitor)?;
        Ok(Next::Continue)
    }

    /// Issues the current debug configuration again (re-arming TF).
    pub(super) fn rearm(&mut self) -> Result<()> {
        let (stepping, breakpoints) = (
            self.step.stepping,
            std::mem::take(&mut self.step.breakpoints),
        );
        self.step.stepping = !stepping;
        self.set_debug(stepping, &breakpoints)
    }

    /// Passes an exit to the monitor.
    pub(super) fn tell(&mut self, monitor: &mut dyn Monitor, exit: ExitView) -> Directive {
        monitor.on_exit(&exit, &mut self.cpu_view())
    }

    /// The monitor's view of the vCPU.
    pub(super) fn cpu_view(&mut self) -> KvmCpuView<'_> {
        KvmCpuView {
            low: self.machine.low_ram,
            vcpu: &mut self.machine.vcpu,
            ram: &self.machine.ram,
            cpuid: &self.machine.cpuid,
        }
    }
}

/// The monitor's view of the vCPU: sync registers and guest RAM.
pub(super) struct KvmCpuView<'a> {
    /// `ram`'s region at 0 (see [`LowRam`]).
    low: Option<LowRam>,
    vcpu: &'a mut Vcpu,
    ram: &'a GuestRam,
    cpuid: &'a crate::cpu::cpuid::CpuidTable,
}

impl CpuView for KvmCpuView<'_> {
    fn regs(&mut self) -> Registers {
        (&self.vcpu.regs()).into()
    }

    fn sregs(&mut self) -> SpecialRegisters {
        self.vcpu.special_registers()
    }

    fn read_physical(&self, gpa: u64, buf: &mut [u8]) -> bool {
        use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};
        // SAFETY: `low` was taken from `ram`, which this view borrows.
        if self.low.is_some_and(|low| unsafe { low.read(gpa, buf) }) {
            return true;
        }
        // Elsewhere a slice of one region still costs a fraction of
        // read_slice's walk over regions.
        if let Ok(slice) = self.ram.get_slice(GuestAddress(gpa), buf.len()) {
            return slice.copy_to(buf) == buf.len();
        }
        self.ram.read_slice(buf, GuestAddress(gpa)).is_ok()
    }

    fn write_physical(&mut self, gpa: u64, data: &[u8]) -> bool {
        use vm_memory::{Bytes, GuestAddress};
        self.ram.write_slice(data, GuestAddress(gpa)).is_ok()
    }

    fn write_regs(&mut self, regs: &Registers) -> bool {
        self.vcpu.set_regs(&regs.into()).is_ok()
    }

    fn cpuid_as_given(&self, function: u32, index: u32, seen: [u32; 4]) -> [u32; 4] {
        self.cpuid.as_given(function, index, seen)
    }

    fn read_msr(&mut self, index: u32) -> Option<u64> {
        self.vcpu.msr(index)
    }

    fn write_msr(&mut self, index: u32, value: u64) -> bool {
        self.vcpu.set_msr(index, value)
    }
}
