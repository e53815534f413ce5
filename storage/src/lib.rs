//! Trace records, their compact encoding and the trace disk.
//!
//! Filled in by the tracing issue; the crate exists now so that the
//! workspace layout matches DESIGN.md and later crates can depend on it.
