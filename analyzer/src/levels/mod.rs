//! The level engine: follows calls, returns, jumps between routines,
//! interrupts and switches through a trace with a call stack per task
//! where the trace names Linux tasks (each has its own kernel stack, and
//! kernel threads borrow address spaces), else per address space, and
//! tells a [`LevelSink`] about routine entries and exits, big-level
//! boundaries and irregular control flow.
//!
//! A *big level* is a stretch of the trace from its start, an interrupt or
//! exception entry, a system-call entry, a return from one of those, or a
//! task or address-space switch, to the next such boundary. *Small levels*
//! are the call depths within it. Memory is the deepest stack times the
//! number of stacks, plus one trie node per distinct call path.

mod counts;
mod engine;
mod frames;
mod items;
mod pass;
mod select;
mod sink;

pub use counts::LevelCounts;
pub use engine::LevelEngine;
pub use items::{FuncResolver, Item, SegmentRecord};
pub use pass::{LevelPass, RoutineRun, SegmentPass};
pub use select::SelectedTasks;
pub use sink::{BigLevel, BigLevelCause, EntryKind, ExitKind, FrameView, Irregular, LevelSink};

#[cfg(test)]
mod tests;
