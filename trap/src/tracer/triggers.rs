//! What starts, stops and steers tracing from the guest's code: the start
//! and stop addresses, the routines of `--trace-function`, the places of
//! captures and `fn:` probes, and the exception handlers a TF host watches,
//! sharing the four debug registers.

use vtrace_storage::TraceReason;
use vtrace_vmm::{Breakpoints, CpuView};
use vtrace_x86::dr::BREAKPOINTS as DEBUG_REGISTERS;

use crate::engine::RecordSink;

use super::Tracer;

/// Exceptions whose handlers a TF host watches, most frequent first (four
/// debug registers, one of which `--start-at` may need).
const WATCHED_EXCEPTIONS: [u8; 4] = [14, 13, 6, 0];

/// Steps between two readings of the watched handlers' gates: a guest may
/// rewrite the gates of the IDT it has loaded (Linux does, while it boots).
const HANDLER_RECHECK: u64 = 4096;

impl Tracer {
    /// Finds the handlers a TF host watches while tracing again where they
    /// may have moved: the guest loaded another IDT (tracing often starts
    /// before the guest has one), or it has run [`HANDLER_RECHECK`] steps
    /// since they were read.
    pub(super) fn rewatch_handlers(&mut self, cpu: &mut dyn CpuView) {
        let steps = self.recorder.steps();
        if self.engine.take_idt_moved()
            || steps >= self.handlers_read_at.saturating_add(HANDLER_RECHECK)
        {
            self.watch_handlers(cpu);
        }
    }

    /// Finds the handlers a TF host watches while tracing.
    pub(super) fn watch_handlers(&mut self, cpu: &mut dyn CpuView) {
        self.handlers_read_at = self.recorder.steps();
        let room = DEBUG_REGISTERS - usize::from(self.start_armed);
        self.handlers = WATCHED_EXCEPTIONS
            .iter()
            .filter_map(|&v| self.engine.handler_of(v, cpu).map(|h| (h, v)))
            .take(room)
            .collect();
        self.arm();
    }

    /// Sets the breakpoints: the start address until it fires; while
    /// tracing, the watched exception handlers (TF hosts); while not, the
    /// captures' places, as many as the debug registers have room for
    /// (while tracing, every step's pc is compared with them instead).
    pub(super) fn arm(&mut self) {
        let mut breakpoints = Breakpoints::default();
        if let (true, Some(at)) = (self.start_armed, self.options.start_at) {
            breakpoints.push(at);
        }
        // Past four, the rest wait (see README: the debug registers are
        // shared): `push` refuses them.
        if self.active {
            for (handler, _) in &self.handlers {
                breakpoints.push(*handler);
            }
        } else {
            let over = self.stepping_over.map(|(_, place)| place);
            let places = self
                .windows
                .entries()
                .chain(self.probes.entries())
                .chain(self.captures.places());
            for place in places.filter(|p| Some(*p) != over) {
                breakpoints.push(place);
            }
            // Last, the return addresses of `fnret:` calls entered while
            // tracing was off, innermost first; a call whose return finds
            // no register left is given up (and counted).
            for to in self.probes.return_places() {
                if Some(to) != over && !breakpoints.push(to) {
                    self.probes.unwatch_returns(to);
                }
            }
        }
        self.breakpoints = breakpoints;
    }

    /// Takes the captures and fires the `fn:` probes at `pc`, where the
    /// vCPU stands (those of a user program only in its tasks); returns
    /// whether there were any.
    pub(super) fn at_place(&mut self, pc: u64, cpu: &mut dyn CpuView) -> bool {
        let (captured, probed) = (self.captures.at(pc), self.probes.function_at(pc));
        if captured {
            for i in self.captures.sites_at(pc) {
                let task = self.captures.site(i).task.clone();
                if self.runs_in(task.as_deref(), cpu) {
                    let event = self.captures.take(i, &mut self.engine, cpu);
                    self.windows.route(&mut self.recorder).event(&event);
                }
            }
        }
        if probed {
            self.returns_at(cpu);
            for (i, task) in self.probes.functions_at(pc) {
                if !self.runs_in(task.as_deref(), cpu) {
                    continue;
                }
                if self.probes.at_return(i) {
                    // Untraced only where it has a breakpoint.
                    if self.active || self.probes.untraced(i) {
                        let now = self.return_clock();
                        self.call_entered(i, cpu, now);
                    }
                    continue;
                }
                // A probe without a breakpoint fires only while tracing.
                if !self.active && !self.probes.untraced(i) {
                    continue;
                }
                {
                    let regs = cpu.regs();
                    let engine = &mut self.engine;
                    let mut read =
                        |addr: u64, buf: &mut [u8]| engine.read_linear_prefix(&mut *cpu, addr, buf);
                    let (fire, values) = self.probes.fire_function(i, &regs, &mut read);
                    let mut to = self.windows.route(&mut self.recorder);
                    to.event(&fire);
                    if let Some(values) = values {
                        to.event(&values);
                    }
                }
            }
        }
        captured || probed
    }

    /// The clock `fnret:` calls are timed on: the trace's step count while
    /// tracing, the host's nanoseconds while not.
    fn return_clock(&self) -> u64 {
        match self.active {
            true => self.recorder.steps(),
            false => self.probes.host_ns(),
        }
    }

    /// An `fnret:` probe's routine entered with the vCPU at its first
    /// instruction, the clock at `now`: where its `ret` will go is on top
    /// of the stack.
    fn call_entered(&mut self, i: usize, cpu: &mut dyn CpuView, now: u64) {
        let regs = cpu.regs();
        let mut ret = [0u8; 8];
        if self.engine.read_linear_prefix(cpu, regs.rsp, &mut ret) == ret.len() {
            let cr3 = cpu.sregs().cr3;
            self.probes
                .call_entered(i, u64::from_le_bytes(ret), regs.rsp, cr3, now);
        }
    }

    /// Fires the `fnret:` probes whose calls returned to where the vCPU
    /// stands.
    fn returns_at(&mut self, cpu: &mut dyn CpuView) {
        let (regs, cr3) = (cpu.regs(), cpu.sregs().cr3);
        let now = self.return_clock();
        for (fire, values) in self.probes.fire_returns(&regs, cr3, now, self.active) {
            let mut to = self.windows.route(&mut self.recorder);
            to.event(&fire);
            to.event(&values);
        }
    }

    /// A breakpoint while not tracing: the start address, a
    /// `--trace-function` routine's entry, a `fn:` probe's, or a capture's
    /// place.
    pub(super) fn untraced_breakpoint(&mut self, cpu: &mut dyn CpuView) {
        // The guest ran untraced and may have changed its page tables.
        self.engine.forget_translations();
        let pc = cpu.regs().rip;
        if self.start_armed
            && self.options.start_at == Some(pc)
            && self.runs_in(self.options.start_in.clone().as_deref(), cpu)
        {
            // Once: stepping on from here must not hit it again. The
            // captures here are taken where stepping begins.
            self.start_armed = false;
            self.start(TraceReason::Address(pc));
            return;
        }
        if let Some((i, site)) = self.windows.site_at(pc) {
            let task = site.task.clone();
            if self.runs_in(task.as_deref(), cpu) {
                let sp = cpu.regs().rsp;
                let mut ret = [0u8; 8];
                let ret = self
                    .engine
                    .read_linear(cpu, sp, &mut ret)
                    .then(|| u64::from_le_bytes(ret));
                let reason = self.windows.open(i, ret, sp);
                self.start(reason);
                return;
            }
        }
        if self.at_place(pc, cpu) {
            // RF would let the instruction run without firing again, but
            // a KVM that emulates kernel code fires again regardless (48
            // million times in a row, measured): step over it instead, and
            // arm the place again after.
            self.stepping_over = Some((self.cpu, pc));
            self.arm();
        }
    }

    /// The exit after stepping over a capture's place: arm it again.
    pub(super) fn stepped_over(&mut self) {
        self.stepping_over = None;
        self.arm();
    }

    /// Whether the running task is named `comm` (a trigger's condition;
    /// `None` holds everywhere). Where the task cannot be read (no task
    /// layout, the kernel's half unmapped in user mode) the trigger fires,
    /// and says so once: better a trace from the wrong process than none.
    pub(super) fn runs_in(&mut self, comm: Option<&str>, cpu: &mut dyn CpuView) -> bool {
        let Some(wanted) = comm else {
            return true;
        };
        let running = self
            .tasks
            .as_mut()
            .and_then(|t| t.running_comm(&mut self.engine, cpu));
        match running {
            Some(name) => name == wanted,
            None => {
                if !self.unsure_trigger {
                    self.unsure_trigger = true;
                    (self.announce)(&format!(
                        "vtrace: cannot tell which task reached the trigger in {wanted}; it fires"
                    ));
                }
                true
            }
        }
    }
}
