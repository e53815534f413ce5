//! What a run asks to trace: the library's form of `vtrace run`'s tracing
//! options, free of any command line.

use std::path::PathBuf;
use std::time::Duration;

use crate::location::Location;

/// The trace disk `vtrace run` writes, and `info` and `analyze` read,
/// when none is named: in the directory they run in (perf's `perf.data`).
pub const DEFAULT_TRACE: &str = "vtrace.vtd";

/// What a run traces, and where the trace goes.
#[derive(Clone, Debug)]
pub struct TraceRequest {
    /// The trace disk: a file or a block device.
    pub disk: PathBuf,
    /// Replace a file at [`TraceRequest::disk`] even if it is not a trace.
    pub replace: bool,
    /// Room reserved for the disk while tracing.
    pub disk_size: u64,
    /// Size at which the trace is cut into segments.
    pub segment_size: u32,
    /// When the disk is full, overwrite the oldest segments.
    pub wrap: bool,
    /// Trace from the first instruction.
    pub from_start: bool,
    /// What runs the guest while it is traced.
    pub engine: vtrace_vmm::EngineKind,
    /// Stop tracing after this many steps.
    pub max_steps: Option<u64>,
    /// Record the memory values registers do not give.
    pub record_values: bool,
    /// Start tracing when execution reaches this place.
    pub start_at: Option<Location>,
    /// Stop tracing when execution reaches this place.
    pub stop_at: Option<Location>,
    /// End the run the first time tracing stops.
    pub exit_after_trace: bool,
    /// Step one CPU at a time, never two at once (the trace is the same).
    pub serial_steps: bool,
    /// Obey the guest's tracing hypercalls.
    pub obey_guest: bool,
    /// Exception vectors that stop tracing.
    pub autostop: Vec<u8>,
    /// Memory to copy into the trace at places.
    pub captures: Vec<CaptureRequest>,
    /// Routines traced from entry to return (each takes a breakpoint).
    pub functions: Vec<Location>,
    /// Probe patterns enabled from the start: static probes by pattern,
    /// or `fn:ROUTINE`.
    pub probes: Vec<String>,
    /// Guest variables sampled on a host timer.
    pub peep: Option<PeepRequest>,
}

impl Default for TraceRequest {
    /// Tracing that waits for a hypercall or `vtrace ctl`, to
    /// [`DEFAULT_TRACE`] with `vtrace run`'s defaults.
    fn default() -> Self {
        TraceRequest {
            disk: PathBuf::from(DEFAULT_TRACE),
            replace: false,
            disk_size: 1 << 30,
            segment_size: vtrace_storage::DEFAULT_SEGMENT_SIZE,
            wrap: false,
            from_start: false,
            engine: vtrace_vmm::EngineKind::Step,
            max_steps: None,
            record_values: false,
            start_at: None,
            stop_at: None,
            exit_after_trace: false,
            serial_steps: false,
            obey_guest: true,
            autostop: vtrace_trap::DEFAULT_AUTOSTOP.to_vec(),
            captures: Vec::new(),
            functions: Vec::new(),
            probes: Vec::new(),
            peep: None,
        }
    }
}

/// One capture: at `place`, copy `length` bytes from the address in a
/// general register, under `name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureRequest {
    /// Where the copy is taken.
    pub place: Location,
    /// Index of the general register holding the address (see
    /// [`vtrace_storage::Regs::gpr_index`]).
    pub register: usize,
    /// Bytes to copy.
    pub length: u32,
    /// The name the capture is recorded under.
    pub name: String,
}

/// Peeping: guest variables read from a host thread every `interval`.
#[derive(Clone, Debug)]
pub struct PeepRequest {
    /// Host time between samples.
    pub interval: Duration,
    /// `SYMBOL[:TYPE]` or `0xADDRESS[:TYPE]` for each variable.
    pub samples: Vec<String>,
    /// Take the running pc with every sample (one exit each).
    pub pc: bool,
}
