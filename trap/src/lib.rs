//! The tracer: arms single-step on the vCPU, turns each exit into trace
//! records and decides when tracing starts and stops.
//!
//! The stepping engine arrives with the tracing issue; until then this crate
//! only reserves its place in the workspace so that the dependency direction
//! (`vmm` → `trap` → `storage`) is fixed from the start.
