//! Offline analysis of vtrace traces.
//!
//! The analyzer reads a trace disk through `vtrace-storage` and turns it
//! into listings, nest diagrams of call levels, address-space tables,
//! statistics, flame graphs, Perfetto timelines and an HTML report.
//! Segments decode independently, so per-step work runs in parallel across
//! them ([`Trace::for_each_ordered`]); analyses that follow the call stack
//! see the steps in order through the level engine ([`LevelPass`]). What
//! it knows of the guest's images (symbols, probe sites, task layout,
//! initramfs programs) is `vtrace-image`'s, which its callers name
//! themselves.

mod captures;
mod cpus;
mod diff;
mod error;
mod event_text;
mod flame;
mod input;
mod insn;
mod levels;
mod listing;
mod memory_values;
mod naming;
mod nest;
mod ordered;
mod perfetto;
mod probes;
mod processes;
mod replay;
mod report;
mod routine_filter;
mod samples;
mod spaces;
mod stats;
mod symbolize;
mod syscalls;
mod tasks;
mod timeline;
mod timeline_out;
mod user_programs;

// The crate's API. The modules are private: each item is named here,
// once, so the compiler finds what nothing uses and a module can be split
// without breaking a caller. An analysis is one entry point, named for what
// it makes. What the analyzer knows of guest images is vtrace-image's: its
// callers name that crate themselves.

// Opening a trace and reading it in parallel.
pub use error::{AnalyzeError, Result};
pub use input::{
    no_progress, pass_progress, Chunk, DamageLog, Progress, Records, SegmentInfo, Trace,
};
pub use tasks::{Comm, Selection, TaskFilter, TaskId, TaskTracker};

// What one step is: its decode, the memory it accesses and the values
// its registers give them, the system call it makes (the export's rows
// and the listing's lines read the same).
pub use insn::{intel_formatter, InsnCache, InsnInfo};
pub use memory_values::{accesses, target_value, Access};
pub use naming::routine_label;
pub use syscalls::{is_int_80, made_by as system_call_made_by, INT_80_VECTOR};

// The level engine: calls, returns, interrupts, switches.
pub use levels::{
    BigLevel, BigLevelCause, EntryKind, ExitKind, FrameView, Irregular, Item, LevelCounts,
    LevelEngine, LevelPass, LevelSink, RoutineRun, SegmentPass, SegmentRecord, SelectedTasks,
};

// The analyses.
pub use captures::{captures, format_table as format_captures, Capture};
pub use cpus::{collect as collect_cpus, CpuShare, CpuStats, SpinSite};
pub use diff::{compare, write_flame as write_diff_flame, Diff};
pub use event_text::describe_event;
pub use flame::{
    filter_stacks, folded as folded_stats, folded_lines, write_svg as write_flame,
    write_svg_of as write_flame_of, StackFilter,
};
pub use listing::{write as write_listing, write_files as write_listing_files, ListingOptions};
pub use nest::{format_return_value, DiagramTotals, NestDiagram, NestOptions, NestWriter, DIVIDED};
pub use probes::{
    fires as probe_fires, format_quantize, format_table as format_probes, probes, FieldValues,
    Fire, ProbeTally, Quantize, QuantizeOn, ValueCount,
};
pub use processes::{collect as collect_processes, ProcessTable};
pub use replay::{
    space_of, Before, Direction, MemoryIndex, Observation, Point, Points, Position, ReadOnlyImage,
    Replay, Spaces, State, Watch,
};
pub use report::write as write_report;
pub use routine_filter::{BadPattern, RoutineFilter, HIDDEN_BY_DEFAULT};
pub use samples::{format_profile, samples, Samples};
pub use spaces::{collect as collect_spaces, SpaceTable};
pub use stats::{collect as collect_stats, Stats};
pub use symbolize::{name_address, AddressQuery, Named};
pub use syscalls::{Abi as SystemCallAbi, SystemCall};
pub use timeline::{write as write_timeline, TimelineFormat, TimelineOptions};
pub use user_programs::{add_user_symbols, mapped_paths, recorded_maps, RecordedMap, UserFiles};
