//! Offline analysis of trace disks: symbols, listings, nest diagrams,
//! statistics and pictures.
//!
//! Filled in by the analyzer issue.
