//! The tracer as the VMM sees it: a [`Monitor`] that decides when tracing
//! is on, drives the [`Engine`] and sends its records to the trace disk.
//!
//! One room a job: `options` is what a run asks and what it reports,
//! `triggers` what starts and stops tracing from the guest's code (and the
//! debug registers they share), `guest` the guest's own tracing
//! hypercalls, `requests` the user's hotkeys and `vtrace ctl`. This file
//! holds the tracer's state, starting and stopping, and the hooks.

mod cpus;
mod guest;
mod options;
mod requests;
mod triggers;

pub use options::{parse_autostop, SampleCount, TraceOptions, TraceReport, DEFAULT_AUTOSTOP};

use guest::{GuestRequests, Request};

use vtrace_guest::{cmd, status};
use vtrace_storage::{Event, Recorder, TraceReason};
use vtrace_vmm::Hypercall;
use vtrace_vmm::PeepSample;
use vtrace_vmm::{
    Breakpoints, CpuView, Directive, EntryPlan, ExitAnswer, ExitView, Finish, Help, Injection,
    Monitor,
};

use crate::capture::Captures;
use crate::engine::{Engine, RecordSink};
use crate::probes::Probes;
use crate::tasks::TaskWatch;
use crate::window::Windows;

/// Tracing state and the recorder it writes to.
pub struct Tracer {
    /// The engine of the CPU on stage (the one the VMM enters).
    engine: Box<Engine>,
    /// The CPU on stage, and the other CPUs' engines (see `cpus`).
    cpu: usize,
    // Boxed, as `engine` is: they trade places at every turn (see
    // `Tracer::new_engine`).
    #[allow(clippy::vec_box)]
    parked_engines: Vec<Box<Engine>>,
    /// The steps come from stepping with the trap flag (else from the
    /// VMM's engine, where nothing rides on TF).
    on_trap_flag: bool,
    recorder: Recorder,
    options: TraceOptions,
    active: bool,
    stop_reason: Option<TraceReason>,
    /// The guest's own requests to trace, and their pass counts.
    guest: GuestRequests,
    marks: u64,
    /// The run is ending (`on_finish`): no guest runs on after a stop.
    ending: bool,
    /// The user was told tracing cannot start again (see `spent`).
    told_spent: bool,
    /// Tells the user of starts and stops they did not ask for at that
    /// moment (see [`Tracer::on_announce`]).
    announce: Box<dyn FnMut(&str) + Send>,
    /// Armed hardware breakpoints (see [`Tracer::arm`]).
    breakpoints: Breakpoints,
    /// The start address waits for its breakpoint.
    start_armed: bool,
    /// Untraced, this CPU steps over the instruction at this capture place
    /// before its breakpoint is armed again.
    stepping_over: Option<(usize, u64)>,
    captures: Captures,
    windows: Windows,
    probes: Probes,
    /// Watched exception handlers: (entry, vector).
    handlers: Vec<(u64, u8)>,
    /// Steps recorded when the handlers' gates were last read.
    handlers_read_at: u64,
    tasks: Option<TaskWatch>,
    /// A trigger fired where its task could not be told (said once).
    unsure_trigger: bool,
    samples: SampleCount,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer").finish_non_exhaustive()
    }
}

/// Starts and stops the user did not ask for at that moment (a trigger,
/// a limit, the guest) are told on the console; the others answer
/// where they were asked, or end the run.
fn announced(reason: &TraceReason) -> bool {
    !matches!(
        reason,
        TraceReason::Hotkey
            | TraceReason::Control
            | TraceReason::CommandLine
            | TraceReason::GuestExit
            | TraceReason::UserQuit
            | TraceReason::Signal(_)
            // Said in the run's summary: a routine may be called often.
            | TraceReason::Function { .. }
    )
}

impl Tracer {
    /// A tracer that records to `recorder` as `options` say; it starts
    /// at once where `options.from_start`.
    pub fn new(recorder: Recorder, options: TraceOptions) -> Tracer {
        let tasks = options.linux_tasks.map(TaskWatch::new);
        let captures = Captures::new(options.captures.clone());
        let windows = Windows::new(options.functions.clone(), options.linux_tasks.is_some());
        let start_armed = options.start_at.is_some();
        // A trace the user started on the command line covers the whole
        // run, and --trace-function windows cover their routines: the
        // guest's requests are counted, not obeyed.
        let obeyed = options.obey_guest && !options.from_start && options.functions.is_empty();
        let mut probes = Probes::new(options.probe_sites.clone(), options.function_probes.clone());
        for pattern in &options.probes_enabled {
            probes.set(pattern, true);
        }
        let mut tracer = Tracer {
            engine: Box::new(Engine::new()),
            cpu: 0,
            parked_engines: Vec::new(),
            on_trap_flag: true,
            recorder,
            options,
            active: false,
            stop_reason: None,
            guest: GuestRequests::new(obeyed),
            marks: 0,
            ending: false,
            told_spent: false,
            announce: Box::new(vtrace_vmm::user_message),
            breakpoints: Breakpoints::default(),
            start_armed,
            stepping_over: None,
            captures,
            windows,
            probes,
            handlers: Vec::new(),
            handlers_read_at: 0,
            tasks,
            unsure_trigger: false,
            samples: SampleCount::default(),
        };
        tracer.engine = tracer.new_engine();
        tracer.arm();
        if tracer.options.from_start {
            tracer.start(TraceReason::CommandLine);
        }
        tracer
    }

    /// Where to tell the user that tracing started or stopped by a
    /// trigger, a limit or the guest (stderr by default; a console in raw
    /// mode wants its own line endings).
    pub fn on_announce(mut self, announce: impl FnMut(&str) + Send + 'static) -> Tracer {
        self.announce = Box::new(announce);
        self
    }

    /// Whether tracing is on.
    pub fn active(&self) -> bool {
        self.active
    }

    /// Starts tracing for `reason`; false if it was on already.
    pub fn start(&mut self, reason: TraceReason) -> bool {
        if self.active {
            return false;
        }
        if let Some(why) = self.spent() {
            // It would stop again at once: a window of no steps.
            if announced(&reason) && !self.told_spent {
                self.told_spent = true;
                (self.announce)(&format!("vtrace: tracing not started by {reason}: {why}"));
            }
            return false;
        }
        if announced(&reason) {
            (self.announce)(&format!("vtrace: tracing started by {reason}"));
        }
        // Where tracing stopped on another CPU, the records name this one.
        self.recorder.event(&Event::Cpu(self.cpu_number()));
        self.recorder.event(&Event::TraceStart(reason));
        if let Some(tasks) = &mut self.tasks {
            tasks.new_window();
        }
        self.active = true;
        self.stepping_over = None;
        // Calls entered untraced were timed on the host's clock.
        self.probes.forget_calls();
        self.guest.tracing_started();
        self.arm();
        true
    }

    /// Stops tracing for `reason`; false if it was off already.
    pub fn stop(&mut self, reason: TraceReason) -> bool {
        if !self.active {
            return false;
        }
        // A window still open (its routine did not return) is unfinished;
        // one whose task was switched out is already stopped in the trace.
        if !self.windows.abandon() {
            self.recorder.event(&Event::TraceStop(reason.clone()));
        }
        self.probes.forget_calls();
        // Sealed now, not when the chunk fills: the guest may run on for
        // long after (a Linux boot, for minutes where kernel code is
        // emulated), and a user who ends the run with a kill must not lose
        // what was traced.
        self.recorder.flush_and_wait();
        if announced(&reason) {
            (self.announce)(&format!(
                "vtrace: tracing stopped by {reason} after {} steps; they are on the \
                 trace disk, and {}",
                self.recorder.steps(),
                if self.ending {
                    "the run ends"
                } else if self.options.exit_after_trace {
                    "the run ends (--exit-after-trace)"
                } else {
                    "the guest runs on"
                }
            ));
        }
        self.stop_reason = Some(reason);
        self.active = false;
        self.end_engines();
        self.handlers.clear();
        self.arm();
        true
    }

    /// Flushes everything to the disk and reports.
    pub fn finish(self) -> Result<TraceReport, vtrace_storage::DiskError> {
        let engine = self.engine_stats();
        let stop_reason = self.stop_reason.clone();
        let captures = self.captures.counts();
        let windows = self.windows.counts();
        let probes = self.probes.counts();
        let probe_troubles = self.probes.troubles();
        let recorded_steps = self.recorder.steps();
        let samples = self.samples;
        let writer = self.recorder.finish()?;
        Ok(TraceReport {
            engine,
            recorded_steps,
            writer,
            stop_reason,
            captures,
            windows,
            probes,
            probe_troubles,
            samples,
        })
    }

    /// Starts following the vCPU where it stands.
    fn begin(&mut self, cpu: &mut dyn CpuView) {
        self.engine.begin(cpu);
        if let Some(tasks) = &mut self.tasks {
            let mut sink = self.windows.route(&mut self.recorder);
            tasks.begin(&mut self.engine, cpu, &mut sink);
        }
        if self.options.trap_flag_host {
            self.watch_handlers(cpu);
        }
        // Tracing may start right at a capture's or probe's place (its
        // breakpoint started it, or the user did).
        if let Some(pc) = self.engine.next_pc() {
            self.at_place(pc, cpu);
        }
    }

    /// Follows one exit: untraced, a breakpoint's trigger; traced, the
    /// engine's step, then what the step may have set off (a window's end,
    /// a limit, a capture, the stop address).
    fn exit(&mut self, exit: &ExitView, cpu: &mut dyn CpuView) -> Directive {
        self.engine.restore_fmask(cpu);
        if !self.active {
            // Whatever ended the step (the step itself, an I/O exit, an
            // interrupt), the instruction has run or will run unwatched.
            if self.stepping_over.is_some_and(|(c, _)| c == self.cpu)
                && !matches!(exit, ExitView::Interrupted)
            {
                self.stepped_over();
            }
            if let ExitView::Debug { breakpoint: true } = exit {
                self.untraced_breakpoint(cpu);
            }
            return Directive::Continue;
        }
        if let ExitView::Debug { breakpoint: true } = exit {
            let pc = cpu.regs().rip;
            // Where the VMM delivered a foreseen exception itself, the
            // engine already stands at the handler: its breakpoint fired
            // before the first instruction, and nothing more happened.
            let delivered = self.engine.next_pc() == Some(pc);
            if let Some(&(handler, vector)) =
                self.handlers.iter().find(|(h, _)| *h == pc && !delivered)
            {
                let mut sink = self.windows.route(&mut self.recorder);
                self.engine.exception_entry(vector, handler, cpu, &mut sink);
                self.check_limits();
                if self.active {
                    self.at_place(handler, cpu);
                }
                return Directive::ReArm;
            }
        }
        let before = self.engine.next_pc();
        let mut sink = self.windows.route(&mut self.recorder);
        let directive = self.engine.exit(exit, cpu, &mut sink);
        // An exit that ran nothing (a KVM_RUN cut short) arrives nowhere:
        // the place was seen already (a window's entry is no recursive
        // call, a probe does not fire twice).
        let moved = self.engine.steps_at_exit() > 0 || self.engine.next_pc() != before;
        let next = self.engine.next_pc().filter(|_| moved);
        if let (Some(tasks), Some(pc)) = (&mut self.tasks, next) {
            tasks.before(pc, &mut self.engine, cpu, &mut sink);
        }
        if let Some(pc) = next {
            if let Some(returned) = self.windows.before(pc, self.engine.next_sp()) {
                self.stop(returned);
            }
        }
        if self.options.trap_flag_host && self.active {
            self.rewatch_handlers(cpu);
        }
        self.check_limits();
        if let (Some(pc), true) = (next, self.active) {
            if self.captures.at(pc) || self.probes.function_at(pc) {
                self.at_place(pc, cpu);
            }
            if self.options.stop_at == Some(pc)
                && self.runs_in(self.options.stop_in.clone().as_deref(), cpu)
            {
                self.stop(TraceReason::Address(pc));
            }
        }
        directive
    }

    /// Why tracing cannot start again: the trace holds `--max-steps`
    /// already, or its disk is full.
    fn spent(&self) -> Option<String> {
        let steps = self.recorder.steps();
        match self.options.max_steps {
            Some(max) if steps >= max => Some(format!("--max-steps {max} reached")),
            _ if self.recorder.nearly_full() => {
                Some(format!("the trace disk is full ({steps} steps)"))
            }
            _ => None,
        }
    }

    fn check_limits(&mut self) {
        if let Some(vector) = self.engine.take_exception() {
            if self.options.autostop.contains(&vector) {
                self.stop(TraceReason::Exception(vector));
                return;
            }
        }
        if let Some(max) = self.options.max_steps {
            if self.recorder.steps() >= max {
                self.stop(TraceReason::MaxSteps);
                return;
            }
        }
        if self.recorder.nearly_full() {
            self.stop(TraceReason::DiskFull);
        }
    }
}

impl Tracer {
    /// Whether the vCPU steps: while tracing, and to step over a place
    /// whose breakpoint fired untraced.
    fn stepping(&self) -> bool {
        self.active || self.stepping_over.is_some_and(|(c, _)| c == self.cpu)
    }
}

impl Monitor for Tracer {
    fn plan_entry(&self) -> EntryPlan {
        EntryPlan {
            stepping: self.stepping(),
            breakpoints: self.breakpoints,
            done: self.options.exit_after_trace && !self.active && self.stop_reason.is_some(),
            deliver_interrupts: self.active,
            interruptible: !(self.active && self.engine.mid_rep()),
            pairing: self.active && self.options.pairing,
        }
    }

    fn before_entry(&mut self, cpu: &mut dyn CpuView) {
        if self.probes.writes_waiting() {
            self.probes.write_semaphores(cpu);
        }
        if !self.active {
            self.engine.release(cpu);
        } else if !self.engine.started() {
            self.begin(cpu);
        }
    }

    fn on_engine(&mut self, engine: vtrace_vmm::EngineKind) {
        self.set_trap_flag(engine == vtrace_vmm::EngineKind::Step);
    }

    fn on_exit(&mut self, exit: &ExitView, cpu: &mut dyn CpuView) -> ExitAnswer {
        let directive = self.exit(exit, cpu);
        ExitAnswer {
            directive,
            // For the step clock (see `ExitAnswer`).
            instructions: match (self.active, exit) {
                (true, _) => self.engine.steps_at_exit(),
                (false, ExitView::Mmio { .. }) => 0,
                (false, _) => 1,
            },
        }
    }

    fn guest_log(&mut self, text: &str) {
        if self.active {
            self.engine.defer_event(Event::Log(text.to_string()));
        }
    }

    fn exception_before_entry(&mut self) -> Option<vtrace_vmm::Exception> {
        if self.active {
            self.engine.take_foreseen()
        } else {
            None
        }
    }

    fn on_inject(&mut self, vector: u8, _irq: u8, how: Injection, cpu: &mut dyn CpuView) {
        if !self.active {
            return;
        }
        match how {
            Injection::Queued => self.engine.note_injection(vector),
            Injection::Delivered { .. } if !self.engine.started() => {
                // Tracing starts with this interrupt: its handler is the
                // first thing stepped.
                self.begin(cpu);
                let mut sink = self.windows.route(&mut self.recorder);
                self.engine.note_first_delivery(vector, &mut sink);
            }
            Injection::Delivered { handler } => {
                let mut sink = self.windows.route(&mut self.recorder);
                self.engine.note_delivery(vector, handler, cpu, &mut sink)
            }
        }
    }

    fn peeped(&mut self, samples: &[PeepSample]) {
        for sample in samples {
            // Not through the windows of --trace-function: a sample
            // belongs to no task.
            if self.recorder.nearly_full() {
                self.samples.lost += 1;
                continue;
            }
            self.recorder.event(&Event::Sample {
                virtual_ns: sample.virtual_ns,
                host_ns: sample.host_ns,
                values: sample.values.clone(),
                pc: sample.pc,
            });
            self.samples.recorded += 1;
        }
    }

    fn on_finish(&mut self, _cpu: &mut dyn CpuView, how: Finish<'_>) {
        let reason = match how {
            Finish::Guest => TraceReason::GuestExit,
            Finish::UserQuit => TraceReason::UserQuit,
            Finish::Signal(signal) => TraceReason::Signal(signal as u8),
            Finish::Failure(why) => TraceReason::Other(why.to_string()),
        };
        self.ending = true;
        self.stop(reason);
    }

    fn hypercall(&mut self, call: &Hypercall) -> Option<i32> {
        if GuestRequests::is_tracing_call(call.command) {
            let args = [call.args[0], call.args[1]];
            match self.guest.call(call.command, args, self.active) {
                Some(Request::Start(reason)) => {
                    self.start(reason);
                }
                Some(Request::Stop(reason)) => {
                    self.stop(reason);
                }
                None => {}
            }
            return Some(status::OK);
        }
        if call.command != cmd::PROBE {
            return None;
        }
        if let Some(event) = self.probes.fire(call) {
            if self.active && self.engine.started() {
                // After the step of the IN, as the hypercall's own event.
                self.engine.defer_event(event);
            } else {
                self.windows.route(&mut self.recorder).event(&event);
            }
        }
        Some(status::OK)
    }

    fn hotkey(&mut self, key: u8) -> Option<String> {
        self.answer_hotkey(key)
    }

    fn control(&mut self, command: &str) -> Option<String> {
        self.answer_control(command)
    }

    fn status(&self) -> Option<String> {
        Some(self.status_line())
    }

    fn help(&self) -> Help {
        Tracer::help_text()
    }

    fn on_cpu(&mut self, cpu: usize) {
        self.turn_to(cpu);
    }

    fn turn_may_end(&self) -> bool {
        !self.active || self.engine.turn_may_end()
    }

    fn runs_beside(&mut self, cpu: usize, view: &mut dyn CpuView) -> bool {
        // A probe's semaphore is written right before the next entry: a
        // step already run would not see it.
        if !self.active || !self.options.pairing || self.probes.writes_waiting() {
            return false;
        }
        let engine = match cpu == self.cpu {
            true => &mut self.engine,
            false => match self.parked_engines.get_mut(cpu) {
                Some(engine) => engine,
                None => return false,
            },
        };
        engine.runs_beside(view)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::CaptureSite;
    use crate::test_machine::{machine, FlatCpu, PF_HANDLER};
    use vtrace_storage::DiskWriter;

    fn tracer(dir: &std::path::Path, options: TraceOptions) -> Tracer {
        let disk = DiskWriter::create(&dir.join("t.vtd"), 1 << 20, 64 << 10, false, "").unwrap();
        Tracer::new(Recorder::start(disk), options)
    }

    #[test]
    fn a_trap_flag_host_watches_exception_handlers_while_tracing() {
        let dir = tempfile::tempdir().unwrap();
        let mut cpu = machine(&[0x88, 0x00, 0x90]);
        let options = TraceOptions {
            from_start: true,
            trap_flag_host: true,
            ..TraceOptions::default()
        };
        let mut t = tracer(dir.path(), options);
        assert!(
            t.plan_entry().breakpoints.as_slice().is_empty(),
            "nothing before the first entry"
        );
        t.before_entry(&mut cpu);
        // The machine's IDT has handlers for #PF only among the watched.
        assert_eq!(t.plan_entry().breakpoints.as_slice(), &[PF_HANDLER]);
        // The #PF handler's breakpoint fires: recorded, and stepping re-armed.
        cpu.regs.rip = PF_HANDLER;
        let d = t.on_exit(&ExitView::Debug { breakpoint: true }, &mut cpu);
        assert_eq!(d.directive, Directive::ReArm);
        assert_eq!(t.engine.stats().exceptions, 1);
        // Stopping removes the watch.
        t.stop(TraceReason::Control);
        assert!(t.plan_entry().breakpoints.as_slice().is_empty());
    }

    #[test]
    fn handlers_are_watched_once_the_guest_loads_an_idt() {
        let dir = tempfile::tempdir().unwrap();
        // nop; nop
        let mut cpu = machine(&[0x90, 0x90, 0x90]);
        let options = TraceOptions {
            from_start: true,
            trap_flag_host: true,
            ..TraceOptions::default()
        };
        let mut t = tracer(dir.path(), options);
        let idt = cpu.sregs.idt;
        cpu.sregs.idt.limit = 0;
        t.before_entry(&mut cpu);
        assert!(
            t.plan_entry().breakpoints.as_slice().is_empty(),
            "no IDT yet"
        );
        // The step of an LIDT: the IDT is there at the next exit.
        cpu.sregs.idt = idt;
        cpu.regs.rip += 1;
        t.on_exit(&ExitView::Debug { breakpoint: false }, &mut cpu);
        assert_eq!(t.plan_entry().breakpoints.as_slice(), &[PF_HANDLER]);
    }

    #[test]
    fn an_exception_the_vmm_delivered_is_not_recorded_again_at_the_handler() {
        let dir = tempfile::tempdir().unwrap();
        let mut cpu = machine(&[0x90]);
        let options = TraceOptions {
            from_start: true,
            trap_flag_host: true,
            ..TraceOptions::default()
        };
        let mut t = tracer(dir.path(), options);
        // The engine stands at the handler, as after a delivery by the VMM.
        cpu.regs.rip = PF_HANDLER;
        t.before_entry(&mut cpu);
        assert_eq!(t.plan_entry().breakpoints.as_slice(), &[PF_HANDLER]);
        let d = t.on_exit(&ExitView::Debug { breakpoint: true }, &mut cpu);
        assert_eq!(d.directive, Directive::Continue);
        assert_eq!(t.engine.stats().exceptions, 0);
    }

    #[test]
    fn an_emulating_host_needs_no_handler_breakpoints() {
        let dir = tempfile::tempdir().unwrap();
        let mut cpu = machine(&[0x90]);
        let options = TraceOptions {
            from_start: true,
            ..TraceOptions::default()
        };
        let mut t = tracer(dir.path(), options);
        t.before_entry(&mut cpu);
        assert!(t.plan_entry().breakpoints.as_slice().is_empty());
    }

    #[test]
    fn a_start_place_bound_to_a_task_fires_only_in_that_task() {
        use crate::tasks::tests::{layout, name_task, running};
        use crate::test_machine::CODE;
        let dir = tempfile::tempdir().unwrap();
        let mut cpu = running(&[0x90, 0x90], 7, "sh");
        let options = TraceOptions {
            start_at: Some(CODE),
            start_in: Some("vtprog".into()),
            linux_tasks: Some(layout()),
            ..TraceOptions::default()
        };
        let mut t = tracer(dir.path(), options);
        t.before_entry(&mut cpu);
        assert_eq!(t.plan_entry().breakpoints.as_slice(), &[CODE]);
        // Another program has code at that address: it runs on, the
        // breakpoint stays.
        t.on_exit(&ExitView::Debug { breakpoint: true }, &mut cpu);
        assert!(!t.active());
        assert_eq!(t.plan_entry().breakpoints.as_slice(), &[CODE]);
        // The program itself gets there.
        name_task(&cpu, 8, "vtprog");
        t.on_exit(&ExitView::Debug { breakpoint: true }, &mut cpu);
        assert!(t.active());
        assert!(t.plan_entry().breakpoints.as_slice().is_empty(), "once");
    }

    /// The events of the trace at `dir`, in order.
    fn events(dir: &std::path::Path) -> Vec<Event> {
        let reader = vtrace_storage::TraceReader::open(&dir.join("t.vtd")).unwrap();
        (0..reader.segments().len())
            .flat_map(|i| reader.decode(i).unwrap())
            .filter_map(|r| match r {
                vtrace_storage::Record::Event(e) => Some(e),
                _ => None,
            })
            .collect()
    }

    fn capture_at(at: u64) -> CaptureSite {
        CaptureSite {
            name: "here".into(),
            at,
            register: vtrace_storage::Regs::gpr_index("rsi").unwrap(),
            length: 2,
            task: None,
        }
    }

    /// Tracing from the start at `nop; nop`, a capture at the second:
    /// the tracer, begun, and the CPU.
    fn tracing_to_a_capture(dir: &std::path::Path) -> (Tracer, FlatCpu) {
        use crate::test_machine::CODE;
        let mut cpu = machine(&[0x90, 0x90]);
        cpu.regs.rsi = CODE;
        let options = TraceOptions {
            from_start: true,
            captures: vec![capture_at(CODE + 1)],
            ..TraceOptions::default()
        };
        let mut t = tracer(dir, options);
        t.before_entry(&mut cpu);
        (t, cpu)
    }

    #[test]
    fn a_capture_is_taken_where_a_step_arrives_while_tracing() {
        use crate::test_machine::CODE;
        let dir = tempfile::tempdir().unwrap();
        let (mut t, mut cpu) = tracing_to_a_capture(dir.path());
        assert!(
            t.plan_entry().breakpoints.as_slice().is_empty(),
            "no breakpoint while tracing"
        );
        cpu.regs.rip = CODE + 1;
        t.on_exit(&ExitView::Debug { breakpoint: false }, &mut cpu);
        t.stop(TraceReason::Control);
        assert_eq!(
            t.plan_entry().breakpoints.as_slice(),
            &[CODE + 1],
            "a breakpoint while not"
        );
        let report = t.finish().unwrap();
        assert_eq!((report.captures[0].taken, report.captures[0].short), (1, 0));
        let captures: Vec<Event> = events(dir.path())
            .into_iter()
            .filter(|e| matches!(e, Event::Capture { .. }))
            .collect();
        assert_eq!(
            captures,
            [Event::Capture {
                name: "here".into(),
                addr: CODE,
                length: 2,
                bytes: vec![0x90, 0x90],
            }]
        );
    }

    #[test]
    fn an_exit_that_ran_nothing_arrives_nowhere_again() {
        use crate::test_machine::CODE;
        let dir = tempfile::tempdir().unwrap();
        let (mut t, mut cpu) = tracing_to_a_capture(dir.path());
        cpu.regs.rip = CODE + 1;
        t.on_exit(&ExitView::Debug { breakpoint: false }, &mut cpu);
        // KVM_RUN cut short before the second nop: still there.
        t.on_exit(&ExitView::Interrupted, &mut cpu);
        let report = t.finish().unwrap();
        assert_eq!(report.captures[0].taken, 1, "taken once, at the step");
    }

    #[test]
    fn a_capture_is_taken_at_its_breakpoint_while_not_tracing() {
        use crate::test_machine::CODE;
        let dir = tempfile::tempdir().unwrap();
        let mut cpu = machine(&[0x90]);
        let options = TraceOptions {
            captures: vec![capture_at(CODE)],
            start_at: Some(CODE + 0x100),
            ..TraceOptions::default()
        };
        let mut t = tracer(dir.path(), options);
        assert_eq!(t.plan_entry().breakpoints.as_slice(), &[CODE + 0x100, CODE]);
        cpu.regs.rip = CODE;
        // Not present: nothing copied, and the trace says how much was asked.
        cpu.regs.rsi = 0x7fff_0000_0000;
        let d = t.on_exit(&ExitView::Debug { breakpoint: true }, &mut cpu);
        assert_eq!(d.directive, Directive::Continue);
        assert!(!t.active());
        let report = t.finish().unwrap();
        assert_eq!((report.captures[0].taken, report.captures[0].short), (1, 1));
        assert_eq!(
            events(dir.path()),
            [Event::Capture {
                name: "here".into(),
                addr: 0x7fff_0000_0000,
                length: 2,
                bytes: vec![],
            }]
        );
    }

    #[test]
    fn tracing_does_not_start_again_once_max_steps_is_reached() {
        let dir = tempfile::tempdir().unwrap();
        let options = TraceOptions {
            max_steps: Some(0),
            ..TraceOptions::default()
        };
        let mut t = tracer(dir.path(), options);
        assert!(!t.start(TraceReason::Control));
        assert!(!t.active());
        let answer = t.answer_control("start").unwrap_or_default();
        assert!(answer.contains("--max-steps 0 reached"), "{answer}");
    }

    #[test]
    fn the_run_ends_at_the_first_stop_only_when_asked() {
        for asked in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let options = TraceOptions {
                exit_after_trace: asked,
                ..TraceOptions::default()
            };
            let mut t = tracer(dir.path(), options);
            assert!(!t.plan_entry().done, "not before tracing");
            t.start(TraceReason::Control);
            assert!(!t.plan_entry().done, "not while tracing");
            t.stop(TraceReason::Control);
            assert_eq!(t.plan_entry().done, asked);
        }
    }
}
