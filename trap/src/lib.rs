//! `vtrace-trap`: the tracer. It arms single-step on the vCPU through the
//! VMM's [`vtrace_vmm::Monitor`] hooks, turns every exit into trace records
//! (its engine) and decides when tracing starts and stops ([`Tracer`]).

mod beside;
mod capture;
mod context;
mod engine;
mod fault;
mod flow;
mod idt;
mod maple;
mod memory_record;
mod probe_returns;
mod probe_values;
mod probes;
mod rep;
mod tasks;
#[cfg(test)]
mod test_machine;
mod tracer;
mod window;

// The crate's API. The modules are private: what a user of the tracer
// needs is named here, once, so the compiler finds what nothing uses.
pub use capture::{CaptureCount, CaptureSite, MAX_CAPTURES, MAX_CAPTURE_LENGTH};
pub use engine::EngineStats;
pub use probes::{matches as probe_matches, FunctionProbe, ProbeCount, ProbeTroubles, StaticSite};
pub use tracer::{
    parse_autostop, SampleCount, TraceOptions, TraceReport, Tracer, DEFAULT_AUTOSTOP,
};

pub use window::{FunctionSite, WindowCount};

// A sample the peeper takes must fit the trace's sample event.
const _: () = assert!(vtrace_vmm::MAX_PEEP_READS <= vtrace_storage::MAX_SAMPLE_VALUES);
