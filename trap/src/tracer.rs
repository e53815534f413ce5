//! The tracer as the VMM sees it: a [`Monitor`] that decides when tracing
//! is on, drives the [`Engine`] and sends its records to the trace disk.

use vtrace_guest::{cmd, status};
use vtrace_storage::WriterReport;
use vtrace_storage::{Event, Recorder, TaskLayout, TraceReason, HOST_MARK};
use vtrace_vmm::x86::dr::BREAKPOINTS as DEBUG_REGISTERS;
use vtrace_vmm::Hypercall;
use vtrace_vmm::PeepSample;
use vtrace_vmm::{
    Breakpoints, CpuView, Directive, EntryPlan, ExitAnswer, ExitView, Finish, Help, Injection,
    Monitor,
};

use crate::capture::{CaptureCount, CaptureSite, Captures};
use crate::engine::{Engine, EngineStats, RecordSink};
use crate::probes::{FunctionProbe, ProbeCount, ProbeTroubles, Probes, StaticSite};
use crate::tasks::TaskWatch;
use crate::window::{FunctionSite, WindowCount, Windows};

/// When and how long to trace.
#[derive(Clone, Debug)]
pub struct TraceOptions {
    /// Trace from the first instruction.
    pub from_start: bool,
    /// Stop after this many steps.
    pub max_steps: Option<u64>,
    /// Stop when the guest takes one of these exception vectors.
    pub autostop: Vec<u8>,
    /// Start when execution reaches this linear address (a hardware
    /// breakpoint; once).
    pub start_at: Option<u64>,
    /// Stop when execution reaches this linear address (before it runs).
    pub stop_at: Option<u64>,
    /// Start at [`TraceOptions::start_at`] only in a task of this name
    /// (a comm, up to 15 bytes): the address is a user program's, and
    /// every process may have code there.
    pub start_in: Option<String>,
    /// Stop at [`TraceOptions::stop_at`] only in a task of this name.
    pub stop_in: Option<String>,
    /// The host steps with RFLAGS.TF (hardware VT-x/AMD-V): catch the main
    /// exception handlers with breakpoints too, for exceptions the engine
    /// does not foresee (see `fault`).
    pub trap_flag_host: bool,
    /// End the run the first time tracing stops, rather than let the guest
    /// run on.
    pub exit_after_trace: bool,
    /// Obey the guest's tracing hypercalls (where neither `from_start`
    /// nor `functions` decide already); else they are only counted.
    pub obey_guest: bool,
    /// Where a Linux guest keeps its running task: record task events
    /// (see `tasks`).
    pub linux_tasks: Option<TaskLayout>,
    /// Memory to copy into the trace at places (see `capture`).
    pub captures: Vec<CaptureSite>,
    /// Routines traced from entry to return (see `window`).
    pub functions: Vec<FunctionSite>,
    /// Every static probe site of the guest's kernel, enabled or not
    /// (see `probes`).
    pub probe_sites: Vec<StaticSite>,
    /// The `fn:` probes asked for.
    pub function_probes: Vec<FunctionProbe>,
    /// Probe patterns enabled from the start (`--probe`).
    pub probes_enabled: Vec<String>,
}

/// Exceptions whose handlers a TF host watches, most frequent first (four
/// debug registers, one of which `--start-at` may need).
const WATCHED_EXCEPTIONS: [u8; 4] = [14, 13, 6, 0];

/// Steps between two readings of the watched handlers' gates: a guest may
/// rewrite the gates of the IDT it has loaded (Linux does, while it boots).
const HANDLER_RECHECK: u64 = 4096;

/// Exceptions that stop tracing by default, those that mean the guest went
/// wrong: divide error, NMI, breakpoint, overflow, BOUND, invalid opcode,
/// double fault, invalid TSS, segment not present, stack fault, general
/// protection.
pub const DEFAULT_AUTOSTOP: [u8; 11] = [0, 2, 3, 4, 5, 6, 8, 10, 11, 12, 13];

/// Exception names as `--autostop` takes them.
pub const EXCEPTION_NAMES: [(&str, u8); 20] = [
    ("de", 0),
    ("db", 1),
    ("nmi", 2),
    ("bp", 3),
    ("of", 4),
    ("br", 5),
    ("ud", 6),
    ("nm", 7),
    ("df", 8),
    ("ts", 10),
    ("np", 11),
    ("ss", 12),
    ("gp", 13),
    ("pf", 14),
    ("mf", 16),
    ("ac", 17),
    ("mc", 18),
    ("xm", 19),
    ("ve", 20),
    ("cp", 21),
];

/// Parses `--autostop`: `default`, `none`, or a comma list of names
/// (`ud,gp`) and vector numbers.
pub fn parse_autostop(text: &str) -> Result<Vec<u8>, String> {
    match text {
        "default" => return Ok(DEFAULT_AUTOSTOP.to_vec()),
        "none" => return Ok(Vec::new()),
        _ => {}
    }
    text.split(',')
        .map(|item| {
            let item = item.trim().to_ascii_lowercase();
            EXCEPTION_NAMES
                .iter()
                .find(|(name, _)| *name == item)
                .map(|(_, v)| *v)
                .or_else(|| item.parse::<u8>().ok().filter(|v| *v < 32))
                .ok_or_else(|| {
                    format!("'{item}' is not an exception (names: de, ud, gp, pf, ...; or 0-31)")
                })
        })
        .collect()
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            from_start: false,
            max_steps: None,
            autostop: DEFAULT_AUTOSTOP.to_vec(),
            start_at: None,
            stop_at: None,
            start_in: None,
            stop_in: None,
            trap_flag_host: false,
            exit_after_trace: false,
            obey_guest: true,
            linux_tasks: None,
            captures: Vec::new(),
            functions: Vec::new(),
            probe_sites: Vec::new(),
            function_probes: Vec::new(),
            probes_enabled: Vec::new(),
        }
    }
}

/// What a finished trace run reports.
#[derive(Clone, Debug)]
pub struct TraceReport {
    /// What the engine counted.
    pub engine: EngineStats,
    /// Steps on the trace disk (fewer than the engine stepped where
    /// `--trace-function` kept other tasks off).
    pub recorded_steps: u64,
    /// What the disk writer stored.
    pub writer: WriterReport,
    /// Why tracing last stopped; `None` if it never started.
    pub stop_reason: Option<TraceReason>,
    /// How often each capture was taken.
    pub captures: Vec<CaptureCount>,
    /// What each `--trace-function` routine's windows came to.
    pub windows: Vec<WindowCount>,
    /// How often each probe fired (those the guest's kernel has, and
    /// the `fn:` probes).
    pub probes: Vec<ProbeCount>,
    /// What kept probes from working as asked.
    pub probe_troubles: ProbeTroubles,
    /// The peeper's samples (`vtrace run --peep`).
    pub samples: SampleCount,
}

/// What became of the peeper's samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleCount {
    /// Written to the trace.
    pub recorded: u64,
    /// Not written: the trace disk was full (and not a ring).
    pub lost: u64,
}

/// Tracing state and the recorder it writes to.
pub struct Tracer {
    engine: Engine,
    recorder: Recorder,
    options: TraceOptions,
    active: bool,
    stop_reason: Option<TraceReason>,
    start_calls: u64,
    /// The START hypercall's pass count fires once per run.
    start_fired: bool,
    stop_calls: u64,
    region_calls: u64,
    /// The call count at which a TRACE_REGION started tracing stops it.
    region_stop: Option<u64>,
    marks: u64,
    /// The run is ending (`on_finish`): no guest runs on after a stop.
    ending: bool,
    /// Tells the user of starts and stops they did not ask for at that
    /// moment (see [`Tracer::on_announce`]).
    announce: Box<dyn FnMut(&str) + Send>,
    /// Armed hardware breakpoints (see [`Tracer::arm`]).
    breakpoints: Breakpoints,
    /// The start address waits for its breakpoint.
    start_armed: bool,
    /// Untraced, the vCPU steps over the instruction at this capture place
    /// before its breakpoint is armed again.
    stepping_over: Option<u64>,
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
        let mut probes = Probes::new(options.probe_sites.clone(), options.function_probes.clone());
        for pattern in &options.probes_enabled {
            probes.set(pattern, true);
        }
        let mut tracer = Tracer {
            engine: Engine::new(),
            recorder,
            options,
            active: false,
            stop_reason: None,
            start_calls: 0,
            start_fired: false,
            stop_calls: 0,
            region_calls: 0,
            region_stop: None,
            marks: 0,
            ending: false,
            announce: Box::new(|line| eprintln!("{line}")),
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
        tracer.engine.set_step_limit(tracer.options.max_steps);
        // Needed where stepping rides on TF (the CPU would run handlers
        // unstepped); done on every host so that the same guest gives the
        // same records everywhere. Its cost here is within noise.
        tracer.engine.set_foresee_faults(true);
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
        if announced(&reason) {
            (self.announce)(&format!("vtrace: tracing started by {reason}"));
        }
        self.recorder.event(&Event::TraceStart(reason));
        self.active = true;
        self.stepping_over = None;
        self.stop_calls = 0;
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
        self.engine.end();
        self.handlers.clear();
        self.arm();
        true
    }

    /// Flushes everything to the disk and reports.
    pub fn finish(self) -> Result<TraceReport, vtrace_storage::DiskError> {
        let engine = self.engine.stats();
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

    /// Finds the handlers a TF host watches while tracing again where they
    /// may have moved: the guest loaded another IDT (tracing often starts
    /// before the guest has one), or it has run [`HANDLER_RECHECK`] steps
    /// since they were read.
    fn rewatch_handlers(&mut self, cpu: &mut dyn CpuView) {
        let steps = self.recorder.steps();
        if self.engine.take_idt_moved()
            || steps >= self.handlers_read_at.saturating_add(HANDLER_RECHECK)
        {
            self.watch_handlers(cpu);
        }
    }

    /// Finds the handlers a TF host watches while tracing.
    fn watch_handlers(&mut self, cpu: &mut dyn CpuView) {
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
    fn arm(&mut self) {
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
            let over = self.stepping_over;
            let places = self
                .windows
                .entries()
                .chain(self.probes.entries())
                .chain(self.captures.places());
            for place in places.filter(|p| Some(*p) != over) {
                breakpoints.push(place);
            }
        }
        self.breakpoints = breakpoints;
    }

    /// Takes the captures and fires the `fn:` probes at `pc`, where the
    /// vCPU stands (those of a user program only in its tasks); returns
    /// whether there were any.
    fn at_place(&mut self, pc: u64, cpu: &mut dyn CpuView) -> bool {
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
            for (i, task) in self.probes.functions_at(pc) {
                if self.runs_in(task.as_deref(), cpu) {
                    let event = self.probes.fire_function(i, cpu);
                    self.windows.route(&mut self.recorder).event(&event);
                }
            }
        }
        captured || probed
    }

    /// A breakpoint while not tracing: the start address, a
    /// `--trace-function` routine's entry, a `fn:` probe's, or a capture's
    /// place.
    fn untraced_breakpoint(&mut self, cpu: &mut dyn CpuView) {
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
            self.stepping_over = Some(pc);
            self.arm();
        }
    }

    /// The exit after stepping over a capture's place: arm it again.
    fn stepped_over(&mut self) {
        self.stepping_over = None;
        self.arm();
    }

    /// Records a mark made from the host: with `id` as a guest MARK
    /// would, else as [`HOST_MARK`]; the value counts host marks. Says
    /// what the trace shows.
    fn host_mark(&mut self, id: Option<u64>) -> String {
        self.marks += 1;
        self.recorder.event(&Event::Mark {
            id: id.unwrap_or(HOST_MARK),
            value: self.marks,
        });
        match id {
            Some(id) => format!("mark {id} recorded (value {})", self.marks),
            None => format!("host mark {} recorded", self.marks),
        }
    }

    /// Whether the running task is named `comm` (a trigger's condition;
    /// `None` holds everywhere). Where the task cannot be read (no task
    /// layout, the kernel's half unmapped in user mode) the trigger fires,
    /// and says so once: better a trace from the wrong process than none.
    fn runs_in(&mut self, comm: Option<&str>, cpu: &mut dyn CpuView) -> bool {
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

    /// Follows one exit: untraced, a breakpoint's trigger; traced, the
    /// engine's step, then what the step may have set off (a window's end,
    /// a limit, a capture, the stop address).
    fn exit(&mut self, exit: &ExitView, cpu: &mut dyn CpuView) -> Directive {
        self.engine.restore_fmask(cpu);
        if !self.active {
            // Whatever ended the step (the step itself, an I/O exit, an
            // interrupt), the instruction has run or will run unwatched.
            if self.stepping_over.is_some() && !matches!(exit, ExitView::Interrupted) {
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
        let mut sink = self.windows.route(&mut self.recorder);
        let directive = self.engine.exit(exit, cpu, &mut sink);
        let next = self.engine.next_pc();
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
        self.active || self.stepping_over.is_some()
    }

    /// The status line's tracer part (`vtrace ctl status`, `Ctrl-A s`).
    fn status_line(&self) -> String {
        let probes = self
            .probes
            .status()
            .map(|p| format!("; {p}"))
            .unwrap_or_default();
        let samples = match self.samples {
            SampleCount {
                recorded: 0,
                lost: 0,
            } => String::new(),
            SampleCount { recorded, lost: 0 } => format!("; {recorded} samples"),
            SampleCount { recorded, lost } => {
                format!("; {recorded} samples ({lost} lost: the disk is full)")
            }
        };
        let (used, size) = self.recorder.disk_fill();
        format!(
            "tracing {}, {} steps recorded, disk {:.1} of {:.1} MiB{}{probes}{samples}",
            if self.active { "on" } else { "off" },
            self.recorder.steps(),
            used as f64 / f64::from(1 << 20),
            size as f64 / f64::from(1 << 20),
            if self.recorder.wraps() {
                " (a ring)"
            } else {
                ""
            }
        )
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

    fn on_exit(&mut self, exit: &ExitView, cpu: &mut dyn CpuView) -> ExitAnswer {
        let directive = self.exit(exit, cpu);
        ExitAnswer {
            directive,
            // For the step clock (see `ExitAnswer`).
            instructions: match self.active {
                true => self.engine.steps_at_exit(),
                false => 1,
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
        // Pass counts as the old tracer's system call had them: 0 and 1
        // mean "this call"; n means "the n-th call".
        let due = |count: u64, pass: u64| count >= pass.max(1);
        // A trace the user started on the command line covers the whole
        // run, and --trace-function windows cover their routines: the
        // guest's requests are counted, not obeyed.
        let obeyed = self.options.obey_guest
            && !self.options.from_start
            && self.options.functions.is_empty();
        match call.command {
            cmd::TRACE_START => {
                self.start_calls += 1;
                if obeyed
                    && !self.active
                    && !self.start_fired
                    && due(self.start_calls, call.args[0])
                {
                    self.start_fired = true;
                    self.start(TraceReason::Hypercall {
                        pass: self.start_calls,
                    });
                }
                Some(status::OK)
            }
            cmd::TRACE_REGION => {
                self.region_calls += 1;
                let n = self.region_calls;
                let (start, passes) = (call.args[0].max(1), call.args[1]);
                if obeyed && self.region_stop == Some(n) {
                    self.region_stop = None;
                    self.stop(TraceReason::Hypercall { pass: n });
                } else if obeyed && n == start && !self.active {
                    self.start(TraceReason::Hypercall { pass: n });
                    self.region_stop = (passes > 0).then(|| start.saturating_add(passes));
                }
                Some(status::OK)
            }
            cmd::PROBE => {
                if let Some(event) = self.probes.fire(call) {
                    if self.active && self.engine.started() {
                        // After the step of the IN, as the hypercall's own
                        // event.
                        self.engine.defer_event(event);
                    } else {
                        self.windows.route(&mut self.recorder).event(&event);
                    }
                }
                Some(status::OK)
            }
            cmd::TRACE_STOP if !obeyed => Some(status::OK),
            cmd::TRACE_STOP => {
                if self.active {
                    self.stop_calls += 1;
                    if due(self.stop_calls, call.args[0]) {
                        self.stop(TraceReason::Hypercall {
                            pass: self.stop_calls,
                        });
                    }
                }
                Some(status::OK)
            }
            _ => None,
        }
    }

    fn hotkey(&mut self, key: u8) -> Option<String> {
        match key {
            b't' if self.active => {
                self.stop(TraceReason::Hotkey);
                Some(format!(
                    "vtrace: tracing stopped ({} steps so far)",
                    self.recorder.steps()
                ))
            }
            b't' => {
                self.start(TraceReason::Hotkey);
                Some("vtrace: tracing started".into())
            }
            b'm' => Some(format!("vtrace: {}", self.host_mark(None))),
            _ => None,
        }
    }

    fn control(&mut self, command: &str) -> Option<String> {
        let mut words = command.split_whitespace();
        Some(match (words.next()?, words.next()) {
            ("start", None) => match self.start(TraceReason::Control) {
                true => "tracing started".into(),
                false => "tracing was already on".into(),
            },
            ("stop", None) => match self.stop(TraceReason::Control) {
                true => format!("tracing stopped after {} steps", self.recorder.steps()),
                false => "tracing was already off".into(),
            },
            ("mark", id) => match id.map(str::parse::<u64>) {
                None => self.host_mark(None),
                Some(Ok(id)) if id != HOST_MARK => self.host_mark(Some(id)),
                Some(_) => {
                    return Some(format!(
                        "error: a mark's id is a number below {HOST_MARK} (that one means \
                         a mark without an id)"
                    ))
                }
            },
            ("probe", Some(action @ ("enable" | "disable"))) => {
                let (Some(pattern), None) = (words.next(), words.next()) else {
                    return Some(format!(
                        "error: probe {action} takes one pattern (sched:*, timer:tick, fn:*)"
                    ));
                };
                let matched = self.probes.set(pattern, action == "enable");
                // Written before the guest runs again; the breakpoints
                // of fn: probes follow.
                self.arm();
                match matched.len() {
                    0 => format!(
                        "error: no probe matches '{pattern}' (`vtrace probes list` lists the \
                         kernel's; fn: probes are given to vtrace run with --probe)"
                    ),
                    _ => format!("{action}d {}", matched.join(", ")),
                }
            }
            _ => return None,
        })
    }

    fn status(&self) -> Option<String> {
        Some(self.status_line())
    }

    fn help(&self) -> Help {
        Help {
            hotkeys: vec![
                ('t', "start or stop tracing"),
                ('m', "record a mark in the trace"),
            ],
            commands: vec![
                "start",
                "stop",
                "mark [ID]",
                "probe enable PATTERN",
                "probe disable PATTERN",
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::walker::tests::{machine, PF_HANDLER};
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
        use crate::walker::tests::CODE;
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

    #[test]
    fn a_capture_is_taken_where_a_step_arrives_while_tracing() {
        use crate::walker::tests::CODE;
        let dir = tempfile::tempdir().unwrap();
        // nop; nop: the capture is at the second.
        let mut cpu = machine(&[0x90, 0x90]);
        cpu.regs.rip = CODE;
        cpu.regs.rsi = CODE;
        let options = TraceOptions {
            from_start: true,
            captures: vec![capture_at(CODE + 1)],
            ..TraceOptions::default()
        };
        let mut t = tracer(dir.path(), options);
        t.before_entry(&mut cpu);
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
    fn a_capture_is_taken_at_its_breakpoint_while_not_tracing() {
        use crate::walker::tests::CODE;
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
