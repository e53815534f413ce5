//! A trace disk as `vtrace info` and `vtrace analyze` open it: the scan,
//! the superblock, every segment's checks and records, the summary. (The
//! analyses over it are the `analysis` target's.)
#![no_main]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use vtrace_storage::{summarize, TraceReader};

/// One file per fuzzing process, rewritten for each input: in memory
/// (/dev/shm) where there is one, for speed.
static PATH: LazyLock<PathBuf> = LazyLock::new(|| {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("vtrace-fuzz-{}.vtd", std::process::id()))
});

fuzz_target!(|data: &[u8]| {
    let Ok(mut file) = std::fs::File::create(&*PATH) else {
        return;
    };
    if file.write_all(data).is_err() {
        return;
    }
    drop(file);
    if let Ok(reader) = TraceReader::open(&PATH) {
        let _ = summarize(&reader, |_, _| {});
        let _ = reader.structural_problems();
    }
    if let Ok(trace) = vtrace_analyzer::input::Trace::open(&PATH) {
        let _ = trace.steps();
        let _ = trace.step_range();
    }
});
