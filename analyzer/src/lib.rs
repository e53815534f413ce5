//! Offline analysis of vtrace traces.
//!
//! The analyzer reads a trace disk through `vtrace-storage` and turns it
//! into listings, nest diagrams of call levels, address-space tables,
//! statistics, flame graphs, Perfetto timelines and an HTML report.
//! Segments decode independently, so per-step work runs in parallel across
//! them ([`input`]); analyses that follow the call stack see the steps in
//! order through the level engine ([`levels`]).

pub mod captures;
pub mod diff;
pub mod error;
pub mod export;
pub mod flame;
pub mod initramfs;
pub mod input;
pub mod insn;
pub mod levels;
pub mod linux_tasks;
pub mod listing;
pub mod naming;
pub mod nest;
pub mod probes;
pub mod processes;
pub mod report;
pub mod samples;
pub mod sdt;
pub mod spaces;
pub mod stats;
pub mod symbols;
pub mod syscalls;
pub mod tasks;
pub mod timeline;
pub mod user_programs;
pub mod user_routine;
