//! The guest held for gdb: a [`Monitor`] around the run's own (the tracer,
//! or none) that stops the guest where gdb asked and answers gdb's
//! questions from the vCPU while it stands.

use std::sync::atomic::Ordering;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use vtrace_vmm::{
    stop_signals, CpuView, EntryPlan, Exception, ExitAnswer, ExitView, GuestExit, Help, Hypercall,
    Injection, Monitor, PeepSample,
};
use vtrace_x86::Walker;

use super::link::{Reply, Request, Stop, VcpuEnd};
use super::watch::{LiveWatch, Watcher};
use crate::arch::{Reg, RegisterFile};

/// How often a guest held for gdb looks for a stop signal: SIGINT, SIGTERM
/// or SIGHUP ends the run cleanly while gdb holds it, as at any other time.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// A run's monitor with gdb in charge of stopping.
pub struct GdbMonitor<'a> {
    inner: &'a mut dyn Monitor,
    end: VcpuEnd,
    /// Where the guest stops at the next pause.
    pending: Option<Stop>,
    /// gdb asked for one instruction.
    stepping: bool,
    /// gdb's breakpoints.
    breakpoints: Vec<u64>,
    /// gdb's watchpoints, checked at each step while the run steps.
    watcher: Watcher,
    /// Tracing stopped under gdb's watchpoints, and gdb was told.
    watches_dormant: bool,
    /// gdb is gone (detached, or its connection closed).
    gone: bool,
    /// gdb killed the session.
    killed: bool,
    walker: Walker,
}

impl std::fmt::Debug for GdbMonitor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GdbMonitor")
            .field("pending", &self.pending)
            .field("stepping", &self.stepping)
            .field("breakpoints", &self.breakpoints)
            .field("watcher", &self.watcher)
            .finish_non_exhaustive()
    }
}

impl<'a> GdbMonitor<'a> {
    /// `inner` with gdb on `end`; `wait`: stop before the first
    /// instruction until gdb attaches.
    pub fn new(inner: &'a mut dyn Monitor, end: VcpuEnd, wait: bool) -> GdbMonitor<'a> {
        GdbMonitor {
            inner,
            end,
            pending: wait.then_some(Stop::Attached),
            stepping: false,
            breakpoints: Vec::new(),
            watcher: Watcher::default(),
            watches_dormant: false,
            gone: false,
            killed: false,
            walker: Walker::default(),
        }
    }

    /// Tells gdb how the run ended, where gdb waits for the guest to stop
    /// and so can hear it. (Where gdb holds the guest it asks nothing of
    /// how it runs, and is not told.)
    pub fn ended(&mut self, exit: GuestExit) {
        if self.gone || !self.end.awaited.load(Ordering::Acquire) {
            return;
        }
        let reply = match exit {
            GuestExit::Status(status) => Reply::Exited(status),
            GuestExit::Signal(signal) => Reply::Terminated(signal),
            _ => Reply::Exited(0),
        };
        let _ = self.end.replies.send(reply);
    }

    /// Serves gdb while the guest stands, until it says to run on, or a
    /// stop signal ends the run.
    fn serve(&mut self, stop: Stop, cpu: &mut dyn CpuView) {
        self.end.awaited.store(false, Ordering::Release);
        if self.end.replies.send(Reply::Stopped(stop)).is_err() {
            return self.let_go();
        }
        // The guest may have changed its page tables since the last stop.
        self.walker.flush();
        loop {
            let Some(request) = self.next_request() else {
                return self.let_go();
            };
            let reply = match request {
                Request::Registers => Reply::Registers(Box::new(registers(cpu))),
                Request::Memory { addr, len } => {
                    let sregs = cpu.sregs();
                    let mut buf = vec![0; len];
                    let read = self.walker.read(cpu, &sregs, addr, &mut buf);
                    buf.truncate(read);
                    Reply::Memory(buf)
                }
                Request::Breakpoints(addrs) => Reply::Set(self.set_breakpoints(addrs)),
                Request::Watchpoints(watches) => Reply::Set(self.set_watches(watches)),
                Request::Continue => return self.end.awaited.store(true, Ordering::Release),
                Request::Step => {
                    self.stepping = true;
                    return self.end.awaited.store(true, Ordering::Release);
                }
                Request::Detach => return self.let_go(),
                Request::Kill => {
                    self.killed = true;
                    return self.let_go();
                }
            };
            if self.end.replies.send(reply).is_err() {
                return self.let_go();
            }
        }
    }

    /// gdb's next request; none where gdb is gone, or a stop signal came
    /// (the run loop ends the run as soon as the guest is let go).
    fn next_request(&mut self) -> Option<Request> {
        loop {
            match self.end.requests.recv_timeout(SIGNAL_POLL) {
                Ok(request) => return Some(request),
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) => {
                    if stop_signals::caught().is_some() {
                        return None;
                    }
                }
            }
        }
    }

    /// gdb's breakpoints, where the debug registers the run's own monitor
    /// leaves free hold them.
    fn set_breakpoints(&mut self, addrs: Vec<u64>) -> Result<(), String> {
        let plan = self.inner.plan_entry();
        if !plan.stepping {
            let mut taken = plan.breakpoints;
            for &a in &addrs {
                if !taken.push(a) {
                    return Err(format!(
                        "no debug register is free for a breakpoint at {a:#x} (4 in all, the \
                         tracer's function probes take theirs)"
                    ));
                }
            }
        }
        self.breakpoints = addrs;
        Ok(())
    }

    /// gdb's watchpoints, where the run steps: each step's memory operands
    /// are compared with them.
    fn set_watches(&mut self, watches: Vec<LiveWatch>) -> Result<(), String> {
        if !watches.is_empty() && !self.inner.plan_entry().stepping {
            return Err(
                "watchpoints need the run traced (--trace, or start tracing with vtrace \
                        ctl start): each traced step's memory operands are compared with them"
                    .to_string(),
            );
        }
        self.watcher.set(watches);
        Ok(())
    }

    /// With watchpoints set: where tracing stopped (`--max-steps`, `vtrace
    /// ctl stop`...), nothing compares the guest's accesses any more, so
    /// the guest stops for gdb once, saying so, rather than run on as if
    /// nothing it watches changed.
    fn watch_tracing(&mut self) {
        let traced = self.inner.plan_entry().stepping;
        if !traced && !self.watches_dormant {
            vtrace_vmm::user_message(
                "vtrace: gdb: tracing stopped, so gdb's watchpoints cannot fire until it starts \
                 again; the guest is stopped here for gdb",
            );
            self.pending.get_or_insert(Stop::Interrupted);
        }
        self.watches_dormant = !traced;
    }

    /// gdb is gone: the guest runs on as if it had never come.
    fn let_go(&mut self) {
        self.gone = true;
        self.stepping = false;
        self.breakpoints.clear();
        self.watcher.set(Vec::new());
        self.pending = None;
    }
}

/// The registers gdb shows, read from the vCPU.
fn registers(cpu: &mut dyn CpuView) -> RegisterFile {
    let r = cpu.regs();
    let s = cpu.sregs();
    let mut file = RegisterFile::default();
    let gprs = [
        r.rax, r.rcx, r.rdx, r.rbx, r.rsp, r.rbp, r.rsi, r.rdi, r.r8, r.r9, r.r10, r.r11, r.r12,
        r.r13, r.r14, r.r15,
    ];
    for (n, v) in gprs.into_iter().enumerate() {
        file.set(Reg::Gpr(n), Some(v));
    }
    file.set(Reg::Rip, Some(r.rip));
    file.set(Reg::Eflags, Some(r.rflags));
    for (n, seg) in [s.cs, s.ss, s.ds, s.es, s.fs, s.gs].iter().enumerate() {
        file.set(Reg::Segment(n), Some(u64::from(seg.selector)));
    }
    file.set(Reg::FsBase, Some(s.fs.base));
    file.set(Reg::GsBase, Some(s.gs.base));
    file.set(Reg::Cr0, Some(s.cr0));
    file.set(Reg::Cr2, Some(s.cr2));
    file.set(Reg::Cr3, Some(s.cr3));
    file.set(Reg::Cr4, Some(s.cr4));
    file.set(Reg::Cr8, Some(s.cr8));
    file.set(Reg::Efer, Some(s.efer));
    file
}

impl Monitor for GdbMonitor<'_> {
    fn plan_entry(&self) -> EntryPlan {
        let mut plan = self.inner.plan_entry();
        plan.done |= self.killed;
        // The debugger answers no `runs_beside`: no CPU steps beside another.
        plan.pairing = false;
        if self.stepping {
            plan.stepping = true;
        }
        // While the run steps anyway, a breakpoint is a pc compared after
        // each step (see on_exit); else a debug register.
        if !plan.stepping {
            for &a in &self.breakpoints {
                plan.breakpoints.push(a);
            }
        }
        plan
    }

    fn pause(&mut self, cpu: &mut dyn CpuView) -> Duration {
        if self.end.interrupt.swap(false, Ordering::Relaxed) && !self.gone {
            self.pending.get_or_insert(Stop::Interrupted);
        }
        if !self.watcher.is_empty() {
            self.watch_tracing();
        }
        let mut held = Duration::ZERO;
        if let Some(stop) = self.pending.take() {
            let since = Instant::now();
            self.serve(stop, cpu);
            held = since.elapsed();
        }
        held + self.inner.pause(cpu)
    }

    fn on_exit(&mut self, exit: &ExitView, cpu: &mut dyn CpuView) -> ExitAnswer {
        let ExitView::Debug { breakpoint } = *exit else {
            return self.inner.on_exit(exit, cpu);
        };
        let inner = self.inner.plan_entry();
        let rip = cpu.regs().rip;
        let ours_step = !breakpoint && self.stepping;
        let at_ours = self.breakpoints.contains(&rip) && (breakpoint || inner.stepping);
        let theirs = if breakpoint {
            inner.breakpoints.contains(rip)
        } else {
            inner.stepping
        };
        let watched = if breakpoint || self.watcher.is_empty() {
            None
        } else {
            self.watcher.after_step()
        };
        if let Some((addr, kind)) = watched {
            self.stepping = false;
            self.pending = Some(Stop::Watch { addr, kind });
        } else if ours_step {
            self.stepping = false;
            self.pending = Some(Stop::Step);
        } else if at_ours {
            self.pending = Some(Stop::Breakpoint);
        }
        if theirs || !(ours_step || at_ours) {
            self.inner.on_exit(exit, cpu)
        } else {
            ExitAnswer::CONTINUE
        }
    }

    fn exception_before_entry(&mut self) -> Option<Exception> {
        self.inner.exception_before_entry()
    }

    fn before_entry(&mut self, cpu: &mut dyn CpuView) {
        if !self.watcher.is_empty() {
            self.watcher.before(cpu);
        }
        self.inner.before_entry(cpu)
    }

    fn on_cpu(&mut self, cpu: usize) {
        self.inner.on_cpu(cpu)
    }

    fn turn_may_end(&self) -> bool {
        self.inner.turn_may_end()
    }

    fn on_inject(&mut self, vector: u8, irq: u8, how: Injection, cpu: &mut dyn CpuView) {
        self.inner.on_inject(vector, irq, how, cpu)
    }

    fn hypercall(&mut self, call: &Hypercall) -> Option<i32> {
        self.inner.hypercall(call)
    }

    fn guest_log(&mut self, text: &str) {
        self.inner.guest_log(text)
    }

    fn peeped(&mut self, samples: &[PeepSample]) {
        self.inner.peeped(samples)
    }

    fn on_finish(&mut self, cpu: &mut dyn CpuView, how: vtrace_vmm::Finish<'_>) {
        self.inner.on_finish(cpu, how)
    }

    fn hotkey(&mut self, key: u8) -> Option<String> {
        self.inner.hotkey(key)
    }

    fn control(&mut self, command: &str) -> Option<String> {
        self.inner.control(command)
    }

    fn status(&self) -> Option<String> {
        self.inner.status()
    }

    fn help(&self) -> Help {
        self.inner.help()
    }
}
