//! The analyses over a trace disk: statistics (through the level engine),
//! the listing, the HTML report (with the nest filters and return values),
//! the Perfetto protobuf timeline, the probes' typed values, the
//! per-step export and the debugger's replay, with their arithmetic on what
//! the headers claim.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vtrace_analyzer::{
    collect_stats, probe_fires, probes, write_listing, write_report, write_timeline,
    ListingOptions, NestOptions, QuantizeOn, RoutineFilter, TaskFilter, TimelineFormat,
    TimelineOptions,
};
use vtrace_export::{export, Destination, ExportFormat};
use vtrace_image::symbols::Symbolizer;

#[path = "disk_file.rs"]
mod disk_file;

fuzz_target!(|data: &[u8]| {
    let Some(path) = disk_file::write(data) else {
        return;
    };
    if let Ok(trace) = vtrace_analyzer::Trace::open(path) {
        let symbols = Symbolizer::new();
        let _ = collect_stats(&trace, &symbols, &TaskFilter::default(), &|_, _| {});
        // The listing through the task filter and its columns, with the
        // memory values.
        let options = ListingOptions {
            tasks: TaskFilter {
                pids: vec![1],
                comms: vec!["sh".into()],
            },
            task_columns: true,
            values: true,
            ..Default::default()
        };
        let _ = write_listing(&trace, &symbols, &options, &mut std::io::sink(), &|_, _| {});
        let calls = NestOptions {
            exclude: RoutineFilter::new(&["[a-m]*".into()], true).unwrap_or_default(),
            min_steps: Some(3),
            retval: true,
            ..Default::default()
        };
        let _ = write_report(
            &trace,
            &symbols,
            1000,
            &calls,
            &mut std::io::sink(),
            &|_, _| {},
        );
        let timeline = TimelineOptions {
            format: TimelineFormat::Perfetto,
            ..Default::default()
        };
        let _ = write_timeline(
            &trace,
            &symbols,
            &timeline,
            &mut std::io::sink(),
            &|_, _| {},
        );
        let _ = probe_fires(&trace, &|_, _| {});
        let _ = probes(&trace, Some(QuantizeOn::Field("x".into())), &|_, _| {});
        // The export writes real files: Parquet, and JSON lines in a
        // directory of files of few steps.
        let dir = std::env::temp_dir().join(format!("vtrace-fuzz-export-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let _ = export(
            &trace,
            &symbols,
            ExportFormat::Parquet,
            &Destination::File(dir.join("steps.parquet")),
            &|_, _| {},
            &|| false,
        );
        let _ = export(
            &trace,
            &symbols,
            ExportFormat::Jsonl,
            &Destination::Directory {
                dir: dir.join("parts"),
                steps_per_file: 100,
            },
            &|_, _| {},
            &|| false,
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    // A debugger standing at its steps: the index, then moves both ways,
    // registers and memory.
    if let Ok(trace) = vtrace_analyzer::Trace::open(path) {
        if let Ok(mut replay) = vtrace_analyzer::Replay::open(trace, Vec::new(), &|_, _| {}) {
            let mut at = replay.first();
            for _ in 0..64 {
                let Some(here) = at else { break };
                let _ = replay.state(here);
                let mut buf = [0u8; 16];
                if let Ok(point) = replay.point(here) {
                    let _ = replay.read_memory(here, point.after.gpr[4], &mut buf);
                    let _ = replay.find(here, vtrace_analyzer::Direction::Backward, &[point.pc]);
                }
                at = replay.next(here);
            }
            if let Some(last) = replay.last() {
                let _ = replay.prev(last).map(|p| replay.state(p));
                let _ = replay.at_step(u64::MAX);
            }
        }
    }
});
