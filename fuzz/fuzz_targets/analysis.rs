//! The analyses over a trace disk: statistics (through the level engine)
//! and the listing, with their arithmetic on what the headers claim.
#![no_main]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use vtrace_analyzer::listing::{self, ListingOptions};
use vtrace_analyzer::stats;
use vtrace_analyzer::symbols::Symbolizer;

/// One file per fuzzing process, rewritten for each input: in memory
/// (/dev/shm) where there is one, for speed.
static PATH: LazyLock<PathBuf> = LazyLock::new(|| {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("vtrace-fuzz-analysis-{}.vtd", std::process::id()))
});

fuzz_target!(|data: &[u8]| {
    let Ok(mut file) = std::fs::File::create(&*PATH) else {
        return;
    };
    if file.write_all(data).is_err() {
        return;
    }
    drop(file);
    if let Ok(trace) = vtrace_analyzer::input::Trace::open(&PATH) {
        let symbols = Symbolizer::new();
        let _ = stats::collect(&trace, &symbols, &|_, _| {});
        let options = ListingOptions::default();
        let _ = listing::write(&trace, &symbols, &options, &mut std::io::sink(), &|_, _| {});
    }
});
