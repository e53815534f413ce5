//! The analyses over a trace disk: statistics (through the level engine)
//! and the listing, with their arithmetic on what the headers claim.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vtrace_analyzer::listing::{self, ListingOptions};
use vtrace_analyzer::stats;
use vtrace_analyzer::symbols::Symbolizer;
use vtrace_analyzer::tasks::TaskFilter;

#[path = "disk_file.rs"]
mod disk_file;

fuzz_target!(|data: &[u8]| {
    let Some(path) = disk_file::write(data) else {
        return;
    };
    if let Ok(trace) = vtrace_analyzer::input::Trace::open(path) {
        let symbols = Symbolizer::new();
        let _ = stats::collect(&trace, &symbols, &TaskFilter::default(), &|_, _| {});
        // The listing through the task filter and its columns.
        let options = ListingOptions {
            tasks: TaskFilter {
                pids: vec![1],
                comms: vec!["sh".into()],
            },
            task_columns: true,
            ..Default::default()
        };
        let _ = listing::write(&trace, &symbols, &options, &mut std::io::sink(), &|_, _| {});
    }
});
