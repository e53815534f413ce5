//! `vtrace-trap`: the tracer. It arms single-step on the vCPU through the
//! VMM's [`vtrace_vmm::Monitor`] hooks, turns every exit into trace records
//! ([`engine`]) and decides when tracing starts and stops ([`tracer`]).

pub mod capture;
pub mod context;
pub mod engine;
pub mod fault;
pub mod flow;
pub mod idt;
mod maple;
pub mod probes;
pub mod rep;
pub mod tasks;
pub mod tracer;
pub mod walker;
pub mod window;

pub use capture::{CaptureCount, CaptureSite, MAX_CAPTURES, MAX_CAPTURE_LENGTH};
pub use engine::{Engine, EngineStats, RecordSink};
pub use probes::{FunctionProbe, ProbeCount, ProbeTroubles, StaticSite};
pub use tasks::TaskWatch;
pub use tracer::{
    parse_autostop, SampleCount, TraceOptions, TraceReport, Tracer, DEFAULT_AUTOSTOP,
};

// A sample the peeper takes must fit the trace's sample event.
const _: () = assert!(vtrace_vmm::MAX_PEEP_READS <= vtrace_storage::MAX_SAMPLE_VALUES);
pub use window::{FunctionSite, WindowCount};
