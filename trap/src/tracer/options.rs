//! What a run asks of the tracer ([`TraceOptions`]) and what the tracer
//! reports at its end ([`TraceReport`]).

use vtrace_storage::{TaskLayout, TraceReason, WriterReport};

use crate::capture::{CaptureCount, CaptureSite};
use crate::engine::EngineStats;
use crate::probes::{FunctionProbe, ProbeCount, ProbeTroubles, StaticSite};
use crate::window::{FunctionSite, WindowCount};

/// When and how long to trace.
#[derive(Clone, Debug)]
pub struct TraceOptions {
    /// Trace from the first instruction.
    pub from_start: bool,
    /// Stop after this many steps.
    pub max_steps: Option<u64>,
    /// Record the memory values the registers do not give (see
    /// `memory_record`).
    pub record_values: bool,
    /// Stop when the guest takes one of these exception vectors.
    pub autostop: Vec<u8>,
    /// Start when execution reaches this linear address (a hardware
    /// breakpoint; once).
    pub start_at: Option<u64>,
    /// How the user named [`TraceOptions::start_at`] (`schedule+0x10`),
    /// for the status line while tracing waits for it.
    pub start_label: Option<String>,
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
    /// On a machine of several CPUs, let two CPUs' steps run at once
    /// where they cannot see each other (see `beside`): the trace is the
    /// same either way.
    pub pairing: bool,
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
            record_values: false,
            autostop: DEFAULT_AUTOSTOP.to_vec(),
            start_at: None,
            start_label: None,
            stop_at: None,
            start_in: None,
            stop_in: None,
            trap_flag_host: false,
            exit_after_trace: false,
            pairing: true,
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
