//! The run loop: enter the guest, serve each exit, deliver interrupts.
//!
//! A run is one [`Run`]: the VM, the monitor steering it, the channel that
//! wakes the loop and the kicker that cuts `KVM_RUN` short. One room a job:
//! `enter` runs the vCPU to its next exit (passing over the single-step
//! exits KVM on VT-x reports twice), `exit` has one handler per exit kind,
//! `decide` the pure decisions they act on, `inject` delivers interrupts
//! and foreseen exceptions, `halt` waits while the guest idles, `failure`
//! reports what stopped the guest, `requests` answers the console's
//! hotkeys and `vtrace ctl`, `cpu_view` is the monitor's view of the
//! vCPU. For a machine of several CPUs: `turns` holds the order of turns
//! (whether the CPUs take turns, who runs next, when a turn ends),
//! `ipi` the IPIs between them, `parallel` runs them at once untraced,
//! `pair` two CPUs' steps at once traced, on `crate::steppers`. This file
//! holds the loop itself and what the rooms share.

mod cpu_view;
mod decide;
mod engine_host;
mod enter;
mod exit;
mod failure;
mod halt;
mod inject;
mod ipi;
mod on_engine;
mod pair;
mod parallel;
mod requests;
pub(crate) mod turns;

use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::frontends::{waker, Wake};
use crate::kick::Kicker;
use crate::monitor::{Breakpoints, ExitAnswer, ExitView, Monitor};
use crate::peep::{PeepMessage, PeepReport};
use crate::signals;
use crate::vm::Vm;

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
    /// Interrupts injected from the CPUs' local APICs (timers and IPIs).
    pub local_apic_interrupts: u64,
    /// VM exits served.
    pub exits: u64,
    /// Guest lines (LOG, rejected calls) not printed: over the rate limit.
    pub guest_lines_not_shown: u64,
    /// Instructions (INT3, INT n, FWAIT, LDMXCSR...) the VMM completed because KVM's
    /// emulator could not.
    pub completed_by_vmm: u64,
    /// Times two CPUs of a machine of several stepped at once (see
    /// `pair`): each is two steps.
    pub step_pairs: u64,
    /// Times pairing paused (a second, longer where it repeats) because
    /// the host's cores were busy with other work (see `steppers`).
    pub pair_pauses: u32,
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

/// One run of the VM: what every handler of the loop needs, in one place.
pub(super) struct Run<'a> {
    vm: &'a mut Vm,
    monitor: &'a mut dyn Monitor,
    /// What wakes the loop between exits or from a halt.
    wakes: &'a Receiver<Wake>,
    /// Where the loop's wakes come from, for the vCPU threads of
    /// `parallel`.
    tx: &'a Sender<Wake>,
    kicker: &'a Kicker,
    /// Interrupts injected, by ISA IRQ line.
    irqs: [u64; 16],
    /// Interrupts injected from local APICs.
    local_apic_interrupts: u64,
    /// Steps launched ahead, beside another CPU's.
    paired: u64,
    /// The monitor held the guest at the boundary the engine's last run
    /// ended at (see `on_engine`): not asked again there.
    engine_paused: bool,
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
        self.machine.clock.restart(monitor.plan_entry().stepping);
        let started = Instant::now();
        let mut run = Run {
            vm: self,
            monitor: &mut *monitor,
            wakes: &rx,
            tx: &tx,
            kicker: &kicker,
            irqs: [0; 16],
            local_apic_interrupts: 0,
            paired: 0,
            engine_paused: false,
        };
        let result = run.until_stop();
        let (irqs, local_apic_interrupts, paired) =
            (run.irqs, run.local_apic_interrupts, run.paired);
        if let Some(engine) = self.engine.as_mut() {
            engine.refused_msrs.tell();
        }
        // A step still ahead (the run ended between two paired steps) ran
        // beside the last one served; nothing enters a vCPU any more.
        self.steppers.stop();
        let pair_pauses = self.steppers.take_rests();
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
            local_apic_interrupts,
            exits: self.machine.history.total(),
            guest_lines_not_shown: self.machine.hypercalls.lines_not_shown(),
            completed_by_vmm: self.machine.completed_by_vmm,
            step_pairs: paired,
            pair_pauses,
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

    /// Arms or disarms single-stepping and hardware breakpoints (only when
    /// they change: it is an ioctl).
    pub(super) fn set_debug(&mut self, stepping: bool, breakpoints: Breakpoints) -> Result<()> {
        if stepping == self.step.stepping && breakpoints == self.step.breakpoints {
            return Ok(());
        }
        self.machine
            .vcpu
            .set_guest_debug(&decide::guest_debug(stepping, &breakpoints))?;
        if stepping != self.step.stepping {
            self.machine.clock.set_stepping(stepping);
        }
        self.step.stepping = stepping;
        self.step.breakpoints = breakpoints;
        Ok(())
    }

    /// Issues the current debug configuration again (re-arming TF).
    pub(super) fn rearm(&mut self) -> Result<()> {
        let (stepping, breakpoints) = (self.step.stepping, self.step.breakpoints);
        self.step.stepping = !stepping;
        self.set_debug(stepping, breakpoints)
    }
}

impl Run<'_> {
    /// Enters the guest and serves its exits until the run ends.
    fn until_stop(&mut self) -> Result<GuestExit> {
        loop {
            // A step launched ahead runs as if this loop came to it
            // straight from the last exit (see `pair`).
            let ahead = self.vm.steppers.any_ahead();
            if !ahead {
                if let Next::Stop(exit) = self.service()? {
                    return Ok(exit);
                }
            }
            let held = match std::mem::take(&mut self.engine_paused) {
                true => std::time::Duration::ZERO,
                false => self.monitor.pause(&mut self.vm.cpu_view()),
            };
            if !held.is_zero() {
                self.vm.machine.clock.leave_out(held);
                // A stop signal that came while the monitor held the guest
                // (gdb) ends the run here, before another instruction.
                if let Some(signal) = signals::caught() {
                    return Ok(GuestExit::Signal(signal));
                }
            }
            let plan = self.monitor.plan_entry();
            if plan.done {
                return Ok(GuestExit::MonitorDone);
            }
            if self.vm.engine.is_some() {
                // A CPU mid-IN (or mid-MMIO read) in KVM completes there
                // first: the engine would run the instruction again.
                if plan.stepping && !self.vm.step.io_pending {
                    match self.step_on_engine()? {
                        Next::Stop(exit) => return Ok(exit),
                        Next::Continue => {
                            self.hand_on_if_turn_ends();
                            continue;
                        }
                    }
                }
                if !plan.stepping && self.vm.on_engine() {
                    self.hand_to_kvm()?;
                }
            }
            self.fit_steppers(&plan)?;
            let peeping = self.vm.frontends.peeper.is_some();
            if !ahead && turns::may_race(self.vm.machine.cpus.count(), &plan, peeping) {
                match self.race()? {
                    Some(exit) => return Ok(exit),
                    None => match self.resume_turns()? {
                        Next::Stop(exit) => return Ok(exit),
                        Next::Continue => continue,
                    },
                }
            }
            let step = &self.vm.step;
            let plan = if plan.stepping && !step.stepping && !step.io_pending {
                match self.reclaim_queued_interrupt()? {
                    // The monitor was told: its plan may have changed.
                    true => self.monitor.plan_entry(),
                    false => plan,
                }
            } else {
                plan
            };
            self.vm.set_debug(plan.stepping, plan.breakpoints)?;
            if self.vm.step.stepping && !self.vm.step.io_pending {
                if let Some(e) = self.monitor.exception_before_entry() {
                    self.deliver_exception(e)?;
                }
            }
            if self.vm.step.stepping && self.vm.machine.vcpu.step_stale() {
                self.vm.rearm()?;
            }
            self.arm_kicker();
            self.monitor.before_entry(&mut self.vm.cpu_view());
            self.pair_up(&plan);
            // Kicks go to the stepper that enters the CPU on stage, if one
            // does.
            let stepper = self.vm.steppers.thread_of(self.vm.machine.cpus.on_stage());
            if stepper.is_some() {
                self.kicker.retarget_thread(stepper);
            }
            self.kicker.in_run(true);
            let exit = self.vm.enter();
            self.kicker.in_run(false);
            if stepper.is_some() {
                self.kicker.retarget_thread(None);
            }
            self.vm.step.io_pending = exit.completes_on_next_entry();
            self.vm.step.mmio_read_pending = matches!(exit, enter::Exit::MmioRead { .. });
            if let Next::Stop(exit) = self.serve(exit)? {
                return Ok(exit);
            }
            self.hand_on_if_turn_ends();
        }
    }

    /// Untraced, the kicker cuts `KVM_RUN` short when the next device
    /// event is due (no exit would come for it), and at the end of the
    /// CPU's time slice where others wait for their turn; stepping exits
    /// after every instruction anyway.
    fn arm_kicker(&mut self) {
        let stepping = self.vm.step.stepping;
        self.kicker.set_quiet(stepping);
        let machine = &self.vm.machine;
        let slice = turns::time_slice(machine.cpus.count());
        match machine
            .devices
            .next_deadline()
            .and_then(|d| machine.clock.host_delay_until(d))
            .into_iter()
            .chain(slice)
            .min()
            .filter(|_| !stepping)
        {
            Some(delay) => self.kicker.kick_after(delay),
            None => self.kicker.cancel(),
        }
    }

    /// Device work between exits: console input, interrupt lines, injection.
    fn service(&mut self) -> Result<Next> {
        while let Ok(wake) = self.wakes.try_recv() {
            if let Next::Stop(exit) = self.woken(wake) {
                return Ok(Next::Stop(exit));
            }
        }
        if let Some(end) = self.between_exits() {
            return Ok(Next::Stop(end));
        }
        self.inject()?;
        Ok(Next::Continue)
    }

    /// What happens between two exits on any machine: a stop signal ends
    /// the run, `vtrace ctl` is answered, progress said, and the devices'
    /// interrupt lines move as of now; the end of the run the guest asked
    /// for, if it did.
    fn between_exits(&mut self) -> Option<GuestExit> {
        if let Some(signal) = signals::caught() {
            return Some(GuestExit::Signal(signal));
        }
        self.serve_control();
        if self.vm.frontends.progress.is_some() {
            self.report_progress_if_due();
        }
        let now = self.vm.machine.clock.now();
        self.vm.machine.devices.update_interrupts(now);
        self.vm.machine.devices.machine_end()
    }

    /// Passes an exit to the monitor.
    fn tell(&mut self, exit: ExitView) -> ExitAnswer {
        self.monitor.on_exit(&exit, &mut self.vm.cpu_view())
    }
}
