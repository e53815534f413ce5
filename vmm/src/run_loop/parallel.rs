//! Untraced, the CPUs of a machine of several run in parallel.
//!
//! Each vCPU gets a thread of its own (a crew member) that does nothing
//! but `KVM_RUN` on it, while this loop's thread serves every exit, one
//! at a time, with the same handlers the turns use: the CPU whose exit
//! came goes on stage (`Cpus::bring_on`), so "the vCPU" of every handler
//! is the one that exited, and the devices, the clock and the monitor
//! stay on one thread with no lock. A CPU that gets an interrupt while it
//! runs is kicked out of `KVM_RUN` (its `immediate_exit` set, then a
//! signal to its thread), and a halted one is entered again once an
//! interrupt waits for it.
//!
//! The crew lives while nothing wants to see single instructions: once
//! tracing starts or a breakpoint is to be armed, every member is called
//! back (kicked, its exit served), its thread ends, and the turns take
//! over on the loop's own thread (and the steppers, see `pair`).
//! KVM waits for an RCU grace period when a vCPU is entered from another
//! thread than the last, so a vCPU changes threads only there, never per
//! exit. Untraced runs do not repeat anyway; traced ones still do, since
//! the turns begin from wherever the CPUs stood.

use std::os::unix::io::RawFd;
use std::os::unix::thread::JoinHandleExt;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::thread::JoinHandle;
use std::time::Duration;

use kvm_bindings::kvm_run;

use crate::console::ConsoleInput;
use crate::error::{Error, Result};
use crate::frontends::Wake;
use crate::peep::PeepMessage;

use super::enter::Exit;
use super::turns::may_race;
use super::{GuestExit, Next, Run};
use crate::cpus::Power;

/// How long the loop waits for an exit when no device event is due.
const IDLE_WAIT: Duration = Duration::from_millis(100);

/// One vCPU's thread.
struct Member {
    /// Tells the thread to enter its vCPU (true) or to end (false).
    go: SyncSender<bool>,
    thread: Option<JoinHandle<()>>,
    /// The vCPU's `kvm_run`, for `immediate_exit`.
    run: *mut kvm_run,
    /// Entered (or about to be), its exit not yet served.
    running: bool,
    /// Kicked since it was entered.
    kicked: bool,
    /// RIP where it was entered (an OUT that moved it completed at its
    /// exit; see `Exit::IoOut`).
    entry_rip: u64,
}

/// Every vCPU's thread.
struct Crew {
    members: Vec<Member>,
}

/// The raw descriptor crosses to the member's thread; the vCPU outlives
/// the crew (it is disbanded before the loop returns).
fn member(cpu: usize, fd: RawFd, go: Receiver<bool>, exits: Sender<Wake>) {
    while let Ok(true) = go.recv() {
        // SAFETY: `fd` is a vCPU's, open until the crew is disbanded; the
        // loop's thread does not use the vCPU while this one runs it.
        let errno = unsafe { crate::vcpu::run_raw(fd) };
        if exits.send(Wake::CpuExit { cpu, errno }).is_err() {
            return;
        }
    }
}

impl Crew {
    fn running(&self) -> bool {
        self.members.iter().any(|m| m.running)
    }

    /// Enters CPU `cpu` on its thread.
    fn release(&mut self, cpu: usize, entry_rip: u64) {
        let Some(m) = self.members.get_mut(cpu) else {
            return;
        };
        if m.go.send(true).is_ok() {
            m.running = true;
            m.kicked = false;
            m.entry_rip = entry_rip;
        }
    }

    /// Gets CPU `cpu` out of `KVM_RUN` soon: `immediate_exit` covers a
    /// thread not yet in it, the signal one inside it.
    fn kick(&mut self, cpu: usize) {
        let Some(m) = self.members.get_mut(cpu).filter(|m| m.running && !m.kicked) else {
            return;
        };
        m.kicked = true;
        // SAFETY: `run` is the vCPU's kvm_run mapping, alive as long as the
        // vCPU; KVM only reads this byte.
        unsafe { std::ptr::write_volatile(&mut (*m.run).immediate_exit, 1) };
        if let Some(t) = &m.thread {
            // SAFETY: the thread is alive until joined in `disband`; the
            // kick signal has a handler (installed by the kicker).
            unsafe { libc::pthread_kill(t.as_pthread_t(), libc::SIGRTMIN()) };
        }
    }

    /// Ends every thread (none runs its vCPU any more).
    fn disband(&mut self) {
        for m in &mut self.members {
            let _ = m.go.send(false);
        }
        for m in &mut self.members {
            if let Some(t) = m.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Run<'_> {
    /// Runs the CPUs in parallel until single steps or breakpoints are
    /// wanted (`None`: the turns go on) or the run ends.
    pub(super) fn race(&mut self) -> Result<Option<GuestExit>> {
        // The kicker would cut the loop's own `KVM_RUN` short: it has none.
        self.kicker.cancel();
        self.kicker.retarget(std::ptr::null_mut());
        let mut crew = self.crew()?;
        tracing::debug!("the CPUs run in parallel");
        let mut left_over = Vec::new();
        let raced = self.race_on(&mut crew, &mut left_over);
        let called_back = self.call_back(&mut crew, &mut left_over);
        crew.disband();
        tracing::debug!("the CPUs take turns");
        let immediate_exit = &mut self.vm.machine.vcpu.run_page().immediate_exit as *mut u8;
        self.kicker.retarget(immediate_exit);
        if let Some(end) = raced?.or(called_back?) {
            return Ok(Some(end));
        }
        // Requests that read the vCPU on stage, now that none runs.
        for wake in left_over {
            if let Next::Stop(end) = self.woken(wake) {
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    /// A thread per vCPU, none entered yet.
    fn crew(&mut self) -> Result<Crew> {
        let count = self.vm.machine.cpus.count();
        let mut members = Vec::with_capacity(count);
        for cpu in 0..count {
            let (fd, run) = match self.vm.machine.cpus.parked_vcpu(cpu) {
                Some(vcpu) => vcpu.raw_parts(),
                None => self.vm.machine.vcpu.raw_parts(),
            };
            let (go, orders) = mpsc::sync_channel(1);
            let exits = self.tx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("vtrace-cpu{cpu}"))
                .spawn(move || member(cpu, fd, orders, exits))
                .map_err(|source| Error::Host {
                    what: "start a vCPU thread",
                    source,
                })?;
            members.push(Member {
                go,
                thread: Some(thread),
                run,
                running: false,
                kicked: false,
                entry_rip: 0,
            });
        }
        Ok(Crew { members })
    }

    /// The parallel loop: enter every CPU that may run, serve the exits
    /// as they come, kick the CPUs interrupts wait for.
    fn race_on(&mut self, crew: &mut Crew, left_over: &mut Vec<Wake>) -> Result<Option<GuestExit>> {
        loop {
            // Before any CPU is entered: a start of tracing served last
            // time round must find every CPU called back, none entered
            // with its engine begun.
            let plan = self.monitor.plan_entry();
            if plan.done {
                return Ok(Some(GuestExit::MonitorDone));
            }
            let peeping = self.vm.frontends.peeper.is_some();
            if !may_race(self.vm.machine.cpus.count(), &plan, peeping) {
                return Ok(None);
            }
            self.dispatch(crew)?;
            let wait = self
                .vm
                .machine
                .devices
                .next_deadline()
                .and_then(|d| self.vm.machine.clock.host_delay_until(d))
                .map_or(IDLE_WAIT, |d| d.min(IDLE_WAIT));
            match self.wakes.recv_timeout(wait) {
                Ok(Wake::CpuExit { cpu, errno }) => {
                    if let Next::Stop(end) = self.serve_member(crew, cpu, errno)? {
                        return Ok(Some(end));
                    }
                }
                // These read the vCPU on stage, which may be running.
                Ok(
                    wake @ (Wake::Peep(PeepMessage::TakeWithPc)
                    | Wake::Console(ConsoleInput::Hotkey(b'r'))),
                ) => {
                    left_over.push(wake);
                    return Ok(None);
                }
                Ok(wake) => {
                    if let Next::Stop(end) = self.woken(wake) {
                        return Ok(Some(end));
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
            }
            if let Some(end) = self.between_exits() {
                return Ok(Some(end));
            }
            for cpu in 0..crew.members.len() {
                // An interrupt waits for it, or an INIT stopped it.
                let power = self.vm.machine.cpus.power()[cpu];
                if self.vm.machine.devices.pending_vector(cpu).is_some() || power != Power::Running
                {
                    crew.kick(cpu);
                }
            }
        }
    }

    /// Enters every CPU that may run and is not running: a running one,
    /// or a halted one an interrupt waits for, each given its interrupt
    /// first where it can take it.
    fn dispatch(&mut self, crew: &mut Crew) -> Result<()> {
        for cpu in 0..crew.members.len() {
            if crew.members[cpu].running {
                continue;
            }
            let waiting = self.vm.machine.devices.pending_vector(cpu).is_some();
            match self.vm.machine.cpus.power()[cpu] {
                Power::Running => {}
                Power::Halted if waiting => self.vm.machine.cpus.set_power(cpu, Power::Running),
                Power::Halted | Power::Stopped | Power::WaitingForStartup => continue,
            }
            self.on_stage(cpu);
            self.inject()?;
            // Racing means no stepping and no breakpoint (`may_race`); a
            // CPU that stepped last disarms here.
            self.vm
                .set_debug(false, crate::monitor::Breakpoints::default())?;
            self.monitor.before_entry(&mut self.vm.cpu_view());
            let rip = self.vm.machine.vcpu.rip();
            crew.release(cpu, rip);
        }
        Ok(())
    }

    /// CPU `cpu` goes on stage, without the kicker (none runs on this
    /// thread while the crew does).
    fn on_stage(&mut self, cpu: usize) {
        let machine = &mut self.vm.machine;
        if machine
            .cpus
            .bring_on(cpu, &mut machine.vcpu, &mut self.vm.step)
        {
            self.monitor.on_cpu(cpu);
        }
    }

    /// Serves CPU `cpu`'s exit, which its thread reports with `errno`.
    fn serve_member(&mut self, crew: &mut Crew, cpu: usize, errno: i32) -> Result<Next> {
        let Some(m) = crew.members.get_mut(cpu).filter(|m| m.running) else {
            return Ok(Next::Continue);
        };
        m.running = false;
        let entry_rip = m.entry_rip;
        self.on_stage(cpu);
        let vcpu = &mut self.vm.machine.vcpu;
        vcpu.ran_elsewhere(errno == 0);
        let mut exit = Exit::from_run_page(vcpu.run_page(), errno);
        // A kick's `immediate_exit` may outlive a real exit that came first.
        vcpu.clear_immediate_exit();
        let completes_mmio_read = self.vm.step.mmio_read_pending;
        self.vm.settle(&mut exit, entry_rip, completes_mmio_read);
        self.vm.step.io_pending = exit.completes_on_next_entry();
        self.vm.step.mmio_read_pending = matches!(exit, Exit::MmioRead { .. });
        self.serve(exit)
    }

    /// Gets every CPU out of `KVM_RUN` and serves its last exit, entering
    /// none again; the first end of the run one of them brings. Other
    /// wakes wait in `left_over` until no CPU runs.
    fn call_back(
        &mut self,
        crew: &mut Crew,
        left_over: &mut Vec<Wake>,
    ) -> Result<Option<GuestExit>> {
        let mut end = None;
        let mut failure = None;
        while crew.running() {
            for cpu in 0..crew.members.len() {
                crew.kick(cpu);
            }
            tracing::debug!(
                "calling back the CPUs still running: {:?}",
                crew.members.iter().map(|m| m.running).collect::<Vec<_>>()
            );
            match self.wakes.recv_timeout(IDLE_WAIT) {
                Ok(Wake::CpuExit { cpu, errno }) => match self.serve_member(crew, cpu, errno) {
                    Ok(Next::Stop(e)) => end = end.or(Some(e)),
                    Ok(Next::Continue) => {}
                    Err(e) => failure = failure.or(Some(e)),
                },
                Ok(wake) => left_over.push(wake),
                // A kick that found its thread outside `KVM_RUN` may have
                // come too early: kick again.
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    for m in &mut crew.members {
                        m.kicked = false;
                    }
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(end),
        }
    }
}
