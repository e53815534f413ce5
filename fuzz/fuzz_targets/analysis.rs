//! The analyses over a trace disk: statistics (through the level engine)
//! and the listing, with their arithmetic on what the headers claim.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vtrace_analyzer::listing::{self, ListingOptions};
use vtrace_analyzer::stats;
use vtrace_analyzer::symbols::Symbolizer;

#[path = "disk_file.rs"]
mod disk_file;

fuzz_target!(|data: &[u8]| {
    let Some(path) = disk_file::write(data) else {
        return;
    };
    if let Ok(trace) = vtrace_analyzer::input::Trace::open(path) {
        let symbols = Symbolizer::new();
        let _ = stats::collect(&trace, &symbols, &|_, _| {});
        let options = ListingOptions::default();
        let _ = listing::write(&trace, &symbols, &options, &mut std::io::sink(), &|_, _| {});
    }
});
