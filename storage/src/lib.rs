//! Trace records, their compact encoding and the trace disk.
//!
//! A trace is a sequence of [`Record`]s: steps (one executed instruction
//! each) with events between them. [`codec`] turns a run of records into the
//! payload of one segment and back; a segment starts from nothing (a
//! keyframe), so it decodes on its own: that is what ring mode, crash
//! recovery and parallel analysis rely on.

pub mod codec;
pub mod digest;
pub mod disk;
mod lock;
pub mod metadata;
pub mod reader;
pub mod record;
pub mod segment;
pub mod summary;
mod task_layout;
mod varint;
pub mod writer;

pub use codec::{DecodeError, SegmentDecoder, SegmentEncoder};
pub use reader::TraceReader;
pub use record::{
    CpuMode, Event, FunctionEdge, InsnBytes, InterruptSource, Mapping, Record, RecordRef, Regs,
    Step, TraceReason, HOST_MARK, MAX_PROBE_ARGS, MAX_SAMPLE_VALUES, REG_NAMES,
};
pub use segment::Compression;
pub use summary::{summarize, TraceSummary};
pub use task_layout::{MapLayout, TaskLayout};
pub use writer::Recorder;
