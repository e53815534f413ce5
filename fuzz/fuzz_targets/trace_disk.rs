//! A trace disk as `vtrace info` and `vtrace analyze` open it: the scan,
//! the superblock, every segment's checks and records, the summary. (The
//! analyses over it are the `analysis` target's.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use vtrace_storage::{summarize, TraceReader};

#[path = "disk_file.rs"]
mod disk_file;

fuzz_target!(|data: &[u8]| {
    let Some(path) = disk_file::write(data) else {
        return;
    };
    if let Ok(reader) = TraceReader::open(path) {
        let _ = summarize(&reader, |_, _| {});
        let _ = reader.structural_problems();
    }
    if let Ok(trace) = vtrace_analyzer::Trace::open(path) {
        let _ = trace.steps();
        let _ = trace.step_range();
    }
});
