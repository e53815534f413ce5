//! Trace records, their compact encoding and (next) the trace disk.
//!
//! A trace is a sequence of [`Record`]s: steps (one executed instruction
//! each) with events between them. [`codec`] turns a run of records into the
//! payload of one segment and back; a segment starts from nothing (a
//! keyframe), so it decodes on its own: that is what ring mode, crash
//! recovery and parallel analysis rely on.

pub mod codec;
pub mod disk;
pub mod record;
pub mod segment;
mod varint;

pub use codec::{DecodeError, SegmentDecoder, SegmentEncoder};
pub use record::{CpuMode, Event, InsnBytes, Record, Regs, Step};
