//! `vtrace bench`.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use vtrace_analyzer::{no_progress, Trace};
use vtrace_image::symbols::{discover, Symbolizer};
use vtrace_session::SessionBuilder;
use vtrace_storage::{Compression, Recorder, SegmentDecoder, TraceReader};
use vtrace_storage::{DiskWriter, DEFAULT_SEGMENT_SIZE};
use vtrace_vmm::BootSource;

use crate::cli::BenchArgs;
use crate::step_bench::{BenchReport, Stopped};

pub fn bench(args: BenchArgs) -> Result<i32> {
    // A Ctrl-C ends a benchmark run at its next exit, and an analysis at
    // its end; either way the temporary files go (a second one kills).
    vtrace_vmm::stop_signals::catch()?;
    let dir = std::env::temp_dir().join(format!("vtrace-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = measure(&args, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let error = match result {
        Ok(status) => return Ok(status),
        Err(error) => error,
    };
    let Some(stopped) = error.downcast_ref::<Stopped>() else {
        return Err(error);
    };
    say!("vtrace bench: {stopped} before it was done (a run cut short gives no figures)");
    Ok(128 + stopped.0)
}

/// The benchmark `args` ask for, its files in `dir`.
fn measure(args: &BenchArgs, dir: &Path) -> Result<i32> {
    let boot = SessionBuilder::demo();
    if args.analyzer {
        crate::few_malloc_arenas();
        return analyzer_bench(&boot, dir, args);
    }
    if args.host_limit_part {
        return crate::cpus_bench::host_limit_part(dir, args);
    }
    if args.cpus > 1 {
        return crate::cpus_bench::run(dir, args);
    }
    // clap holds it to 1..=100.
    let runs = args.runs;
    let measured = (1..=runs)
        .map(|run| {
            if !args.json {
                let of = if runs > 1 {
                    format!(" (run {run} of {runs})")
                } else {
                    String::new()
                };
                let what = match args.max_steps {
                    Some(n) => format!("the first {n} instructions of the demo OS"),
                    None => "the demo OS".to_string(),
                };
                say!(
                    "vtrace bench: stepping {what} bare, tracing them, and stepping them bare again{of}..."
                );
            }
            let r = crate::step_bench::run(&boot, dir, args.max_steps, 1, args.record_values)?;
            // A gigabyte, preallocated: gone before the next run makes its
            // own (the AMD-V test machine keeps its files in RAM).
            let _ = std::fs::remove_file(dir.join(crate::step_bench::TRACE_NAME));
            if !args.json {
                print_report(&r);
            }
            Ok(r)
        })
        .collect::<Result<Vec<_>>>();
    let reports = measured?;
    let ratios: Vec<f64> = reports.iter().map(|r| r.ratio()).collect();
    let median = crate::step_bench::median(&ratios);
    let best = reports
        .iter()
        .max_by(|a, b| a.ratio().total_cmp(&b.ratio()))
        .context("no benchmark run")?;
    if args.json {
        let mut json = report_json(best);
        if runs > 1 {
            json["ratio_median"] = median.into();
            json["runs"] = reports.iter().map(report_json).collect();
        }
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else if runs > 1 {
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "ratio, best of {runs}: {:.2}, median {median:.2} (each: {}; goal: best of three >= 0.95)",
            best.ratio(),
            each.join(", ")
        );
    }
    Ok(0)
}

fn report_json(r: &BenchReport) -> serde_json::Value {
    serde_json::json!({
        "guest": "demo OS",
        "bare_exits": r.bare_exits,
        "bare_seconds": r.bare_time.as_secs_f64(),
        "bare_exits_per_s": r.bare_exits_per_s(),
        "traced_exits": r.traced_exits,
        "traced_steps": r.traced_steps,
        "traced_seconds": r.traced_time.as_secs_f64(),
        "traced_exits_per_s": r.traced_exits_per_s(),
        "ratio": r.ratio(),
        "bytes_per_step": r.bytes_per_step(),
        "peak_rss_bytes": r.peak_rss_bytes,
        "engine_steps": r.engine.as_ref().map(|e| e.steps),
        "engine_seconds": r.engine.as_ref().map(|e| e.time.as_secs_f64()),
        "engine_steps_per_s": r.engine.as_ref().map(|e| e.steps_per_s()),
        "engine_speedup": r.engine.as_ref().map(|e| e.steps_per_s() / r.traced_steps_per_s()),
        "engine_bytes_per_step": r.engine.as_ref().map(|e| e.bytes_per_step()),
    })
}

fn print_report(r: &BenchReport) {
    println!(
        "bare single-step:  {} exits in {:.2} s = {:.0} exits/s (two runs)",
        r.bare_exits,
        r.bare_time.as_secs_f64(),
        r.bare_exits_per_s()
    );
    println!(
        "full tracing:      {} exits in {:.2} s = {:.0} exits/s ({} steps)",
        r.traced_exits,
        r.traced_time.as_secs_f64(),
        r.traced_exits_per_s(),
        r.traced_steps
    );
    println!("ratio:             {:.2} (goal >= 0.95)", r.ratio());
    println!("bytes per step:    {:.2} (goal <= 1.2)", r.bytes_per_step());
    match &r.engine {
        Some(e) => {
            println!(
                "engine tracing:    {} steps in {:.2} s = {:.0} steps/s, {:.1} times stepping's (goal >= 50, >= 10 M steps/s)",
                e.steps,
                e.time.as_secs_f64(),
                e.steps_per_s(),
                e.steps_per_s() / r.traced_steps_per_s()
            );
            println!("engine bytes/step: {:.2} (goal <= 1.2)", e.bytes_per_step());
        }
        None => println!(
            "engine tracing:    not measured (its library is not built: scripts/engine.sh)"
        ),
    }
    if let Some(rss) = r.peak_rss_bytes {
        println!("peak RSS:          {} MiB (both engines' runs)", rss >> 20);
    }
}

/// Writes the demo trace's records again and again into a new disk until
/// it holds at least `steps` steps: a long trace with the demo OS's real
/// instruction mix, call structure and interrupts, without tracing for
/// minutes.
fn repeat_trace(boot: &BootSource, source: &Path, target: &Path, steps: u64) -> Result<()> {
    let reader = TraceReader::open(source)?;
    // The payloads, not the records: decoded, the demo's records take
    // about 170 MiB, which would swamp the analyzer's own memory figure.
    let payloads = (0..reader.segments().len())
        .map(|i| reader.payload(i))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let per_copy: u64 = reader.segments().iter().map(|s| s.found.header.steps).sum();
    anyhow::ensure!(per_copy > 0, "the demo trace has no steps");
    let copies = steps.div_ceil(per_copy);
    // 1.38 bytes a step, measured (fast compression); four bytes leaves room.
    let size = (copies * per_copy * 4).max(64 << 20);
    // Says which kernel ran, so `vtrace analyze` on a kept copy finds the
    // demo OS's symbols as it does for a trace `vtrace run` wrote.
    let metadata = vtrace_session::metadata::for_boot(
        "the demo OS, repeated by vtrace bench --analyzer",
        boot,
        env!("VTRACE_LONG_VERSION"),
    );
    let disk = DiskWriter::create(
        target,
        size,
        DEFAULT_SEGMENT_SIZE,
        false,
        &metadata.to_text(),
    )?;
    // Fast: the analyzer does not care, and dense would add seconds.
    let mut recorder = Recorder::start_with(disk, Compression::Fast);
    for _ in 0..copies {
        for payload in &payloads {
            for r in SegmentDecoder::new(payload) {
                recorder.record(&r?);
            }
        }
    }
    let report = recorder.finish()?;
    anyhow::ensure!(
        report.dropped_chunks == 0,
        "the benchmark trace did not fit its disk ({} chunks dropped)",
        report.dropped_chunks
    );
    Ok(())
}

fn analyzer_bench(boot: &BootSource, dir: &Path, args: &BenchArgs) -> Result<i32> {
    let (trace, what) = bench_trace(boot, dir, args)?;
    let mut symbols = Symbolizer::new();
    let found = discover(
        &trace.metadata,
        &vtrace_session::builtin_kernels(),
        &mut symbols,
    );
    for w in found.all_warnings() {
        vtrace_vmm::user_message(&format!("vtrace: warning: {w}"));
    }
    let m = measure_analyzer(&trace, &symbols, dir)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&m.json())?);
    } else {
        m.print(&what);
    }
    Ok(0)
}

/// The trace the analyzer benchmark reads: the one given, or the demo OS
/// traced and repeated to `--steps` steps. Its description.
fn bench_trace(boot: &BootSource, dir: &Path, args: &BenchArgs) -> Result<(Trace, String)> {
    if let Some(path) = &args.trace {
        let trace = Trace::open(path)
            .with_context(|| format!("cannot open the trace {}", path.display()))?;
        return Ok((trace, path.display().to_string()));
    }
    if !args.json {
        say!(
            "vtrace bench: tracing the demo OS, then repeating it to {} steps...",
            args.steps
        );
    }
    crate::step_bench::run(boot, dir, None, 1, false)?;
    let big = args
        .keep
        .clone()
        .unwrap_or_else(|| dir.join("analyzer.vtd"));
    repeat_trace(
        boot,
        &dir.join(crate::step_bench::TRACE_NAME),
        &big,
        args.steps,
    )?;
    Ok((Trace::open(&big)?, "the demo OS, repeated".to_string()))
}

/// What the analyzer benchmark measured.
struct AnalyzerFigures {
    steps: u64,
    threads: usize,
    nest_seconds: f64,
    stats_seconds: f64,
    peak_rss: Option<u64>,
    export_seconds: f64,
    export_bytes_per_step: f64,
    export_peak_rss: Option<u64>,
}

/// Times the nest diagram, the statistics and the Parquet export (into
/// `dir`, removed after: about 8 bytes a step) on `trace`.
fn measure_analyzer(trace: &Trace, symbols: &Symbolizer, dir: &Path) -> Result<AnalyzerFigures> {
    let total = trace.steps();
    let started = Instant::now();
    vtrace_analyzer::NestDiagram::new(trace, symbols).write(std::io::sink())?;
    let nest_seconds = started.elapsed().as_secs_f64();
    crate::step_bench::not_stopped()?;

    let started = Instant::now();
    let stats = vtrace_analyzer::collect_stats(
        trace,
        symbols,
        &vtrace_analyzer::TaskFilter::default(),
        &no_progress,
    )?;
    let stats_seconds = started.elapsed().as_secs_f64();
    crate::step_bench::not_stopped()?;
    anyhow::ensure!(
        stats.steps == total,
        "stats saw {} of {total} steps",
        stats.steps
    );
    let peak_rss = crate::run::peak_rss_bytes();

    // Parquet files of 10 M steps each.
    let exported = dir.join("bench-export");
    let started = Instant::now();
    let export = vtrace_export::export(
        trace,
        symbols,
        vtrace_export::ExportFormat::Parquet,
        &vtrace_export::Destination::Directory {
            dir: exported.clone(),
            steps_per_file: 10_000_000,
        },
        &no_progress,
        // A signal is seen after the analysis, as after each other one.
        &|| false,
    )?;
    let export_seconds = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&exported);
    crate::step_bench::not_stopped()?;
    anyhow::ensure!(
        export.steps == total,
        "the export wrote {} of {total} steps",
        export.steps
    );
    Ok(AnalyzerFigures {
        steps: total,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        nest_seconds,
        stats_seconds,
        peak_rss,
        export_seconds,
        export_bytes_per_step: export.bytes() as f64 / total.max(1) as f64,
        export_peak_rss: crate::run::peak_rss_bytes(),
    })
}

impl AnalyzerFigures {
    fn rate(&self, seconds: f64) -> f64 {
        self.steps as f64 / seconds
    }

    /// As `--json` prints them.
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "steps": self.steps,
            "threads": self.threads,
            "nest_seconds": self.nest_seconds,
            "nest_steps_per_s": self.rate(self.nest_seconds),
            "stats_seconds": self.stats_seconds,
            "stats_steps_per_s": self.rate(self.stats_seconds),
            "peak_rss_bytes": self.peak_rss,
            "export_seconds": self.export_seconds,
            "export_steps_per_s": self.rate(self.export_seconds),
            "export_parquet_bytes_per_step": self.export_bytes_per_step,
            "export_peak_rss_bytes": self.export_peak_rss,
        })
    }

    /// For people; `what` says which trace was read.
    fn print(&self, what: &str) {
        println!(
            "trace:             {} steps ({what}), {} threads",
            self.steps, self.threads
        );
        println!(
            "nest diagram:      {:.2} s = {:.1} M steps/s (goal >= 40 on 2 cores)",
            self.nest_seconds,
            self.rate(self.nest_seconds) / 1e6
        );
        println!(
            "statistics:        {:.2} s = {:.1} M steps/s (goal >= 30 on 2 cores)",
            self.stats_seconds,
            self.rate(self.stats_seconds) / 1e6
        );
        if let Some(rss) = self.peak_rss {
            println!("peak RSS:          {} MiB", rss >> 20);
        }
        println!(
            "Parquet export:    {:.2} s = {:.1} M steps/s, {:.2} bytes per step",
            self.export_seconds,
            self.rate(self.export_seconds) / 1e6,
            self.export_bytes_per_step
        );
        if let Some(rss) = self.export_peak_rss {
            println!("peak RSS, export:  {} MiB", rss >> 20);
        }
    }
}
