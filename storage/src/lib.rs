//! Trace records, their compact encoding and the trace disk.
//!
//! A trace is a sequence of [`Record`]s: steps (one executed instruction
//! each) with events between them. [`SegmentEncoder`] turns a run of records into the
//! payload of one segment and back; a segment starts from nothing (a
//! keyframe), so it decodes on its own: that is what ring mode, crash
//! recovery and parallel analysis rely on.

// Every number in a trace file is the file's to choose: a cast that could
// cut one short must say why it cannot (or be a checked conversion).
#![warn(clippy::cast_possible_truncation)]

mod codec;
mod digest;
mod disk;
mod lock;
mod metadata;
mod reader;
mod record;
mod segment;
mod summary;
mod task_layout;
mod varint;
mod writer;

// The crate's API. The modules are private: each item is named here,
// once, so a module can be split or moved without breaking callers and the
// compiler finds what nothing uses.
pub use codec::{DecodeError, SegmentDecoder, SegmentEncoder};
pub use digest::TraceDigest;
pub use disk::{
    DiskError, DiskScan, DiskWriter, FoundSegment, Superblock, DEFAULT_SEGMENT_SIZE, SUPERBLOCK_LEN,
};
pub use metadata::{
    image_id, SampleType, SampleVariable, TraceMetadata, BUILTIN_DEMO, BUILTIN_DEMO_SMP,
    LINUX_TASKS,
};
pub use reader::{SegmentEntry, SegmentError, SegmentState, TraceReader};
pub use record::{
    CpuMode, Event, FunctionEdge, InsnBytes, InterruptSource, Mapping, MemoryValue, ProbeField,
    ProbeValue, Record, RecordRef, Regs, Step, TraceReason, HOST_MARK, MAX_CPUS, MAX_MEMORY_VALUES,
    MAX_PROBE_ARGS, MAX_PROBE_FIELDS, MAX_PROBE_TEXT, MAX_SAMPLE_VALUES, REG_COUNT, REG_NAMES,
};
pub use segment::{seal, unseal, Compression, SegmentHeader, HEADER_LEN};
pub use summary::{summarize, TraceSummary};
pub use task_layout::{MapLayout, TaskLayout};
pub use varint::put as put_varint;
pub use writer::{Recorder, WriterReport};
