//! `vtrace-session`: a trace session as a library. [`SessionBuilder`]
//! assembles what `vtrace run` runs (a VM, and where tracing is asked the
//! tracer, its trace disk and metadata, the control socket, the places
//! triggers fire at, the kernel's probes and the variables to peep at),
//! so the command line only parses and wires, and any other program can
//! trace a guest the same way.

mod error;
mod location;
pub mod metadata;
mod panic_watch;
mod peep;
mod places;
mod request;
mod session;
mod tracepoint_probes;
mod triggers;

pub use error::SessionError;
pub use location::{parse_address, parse_location, Location};
pub use peep::PeepSetup;
pub use places::builtin_kernels;
pub use request::{CaptureRequest, PeepRequest, TraceRequest, DEFAULT_TRACE};
pub use session::{Session, SessionBuilder, SessionOutcome};
pub use tracepoint_probes::kernel_tracepoints;
pub use triggers::kernel_probes;
