//! Offline analysis of vtrace traces.
//!
//! The analyzer reads a trace disk through `vtrace-storage` and turns it
//! into listings, nest diagrams of call levels, address-space tables,
//! statistics, flame graphs, Perfetto timelines and an HTML report.
//! Segments decode independently, so per-step work runs in parallel across
//! them ([`input`]); analyses that follow the call stack see the steps in
//! order through the level engine ([`levels`]). What it knows of the
//! guest's images (symbols, probe sites, task layout, initramfs programs)
//! is `vtrace-image`'s, re-exported here under the same names.

pub mod captures;
pub mod diff;
pub mod error;
pub mod event_text;
pub mod export;
pub mod flame;
pub mod input;
pub mod insn;
pub mod levels;
pub mod listing;
pub mod naming;
pub mod nest;
pub mod probes;
pub mod processes;
pub mod report;
pub mod samples;
pub mod spaces;
pub mod stats;
pub mod syscalls;
pub mod tasks;
pub mod timeline;
pub mod user_programs;

pub use vtrace_image::{initramfs, linux_tasks, sdt, symbols, user_routine};
