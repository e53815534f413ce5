//! `vtrace analyze`: wiring from the command line to the analyzer crate.

mod commands;
mod export;
mod gdb;
mod symbolize;

use crate::exit_status::{BadArgument, BadData, Unreadable};
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use vtrace_analyzer::{
    add_user_symbols, captures, collect_processes, collect_spaces, collect_stats, folded_stats,
    format_captures, format_probes, mapped_paths, probes, recorded_maps, samples, write_listing,
    write_listing_files, write_report, write_timeline, ListingOptions, NestOptions, RecordedMap,
    TimelineOptions, Trace, UserFiles,
};
use vtrace_image::symbols::{discover, Scope, Symbolizer};

use vtrace_analyzer::TaskFilter;

use crate::cli::{
    AnalyzeArgs, AnalyzeCommand, CapturesArgs, CpuChoice, DiffArgs, ExportArgs, ExportFormatArg,
    FlameArgs, ListingArgs, NestArgs, OutputArgs, ProbesTraceArgs, ReportArgs, SamplesArgs,
    SpacesArgs, StatsArgs, SyntaxArg, TaskArgs, TimelineArgs, TraceArgs,
};
use vtrace_export::{Destination, ExportFormat};

/// Work that ends sooner shows no bar at all.
const SHOW_BAR_AFTER: Duration = Duration::from_secs(1);

/// A progress bar on stderr, when it is a terminal, that appears once the
/// work has taken a second: how long an analysis takes depends on what it
/// does per step (a listing formats every one, a nest diagram mostly
/// counts), so elapsed time decides, not the trace's length.
struct StepsBar {
    bar: ProgressBar,
    started: Instant,
    enabled: bool,
}

impl StepsBar {
    fn new(trace: &Trace, args: &TraceArgs, what: &str) -> StepsBar {
        let bar = ProgressBar::with_draw_target(Some(trace.steps()), ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:40}] {human_pos}/{human_len} steps ({rate}, {eta} left)",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .with_key(
                "rate",
                |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = write!(w, "{:.1} M steps/s", state.per_sec() / 1e6);
                },
            )
            .progress_chars("=> "),
        );
        bar.set_message(what.to_string());
        StepsBar {
            bar,
            started: Instant::now(),
            enabled: !args.quiet && std::io::stderr().is_terminal(),
        }
    }

    fn update(&self, done: u64) {
        if self.enabled && self.bar.is_hidden() && self.started.elapsed() >= SHOW_BAR_AFTER {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        self.bar.set_position(done);
    }

    fn finish(&self) {
        self.bar.finish();
    }
}

/// Opens the trace and gathers its symbols, telling the user what was
/// found and what was not.
fn open(args: &TraceArgs) -> Result<(Trace, Symbolizer)> {
    let mut trace = open_trace(&args.trace)?;
    require_steps(&trace)?;
    if let Some(CpuChoice::One(cpu)) = args.cpu {
        trace.select_cpu(cpu)?;
    }
    let symbols = symbols(&trace, args)?;
    Ok((trace, symbols))
}

fn require_steps(trace: &Trace) -> Result<()> {
    if trace.steps() == 0 {
        return Err(BadData(format!(
            "{} has no readable steps (was tracing ever started? `vtrace info` tells)",
            trace.path().display()
        ))
        .into());
    }
    Ok(())
}

/// The symbols `args` asks for, and the traced kernel's.
fn symbols(trace: &Trace, args: &TraceArgs) -> Result<Symbolizer> {
    let mut symbols = Symbolizer::new();
    add_symbol_files(&mut symbols, &args.symbols)?;
    user_programs(trace, args, &mut symbols)?;
    if !args.no_kernel_symbols {
        let found = discover(
            &trace.metadata,
            &vtrace_session::builtin_kernels(),
            &mut symbols,
        );
        // Symbols given for every address space fill in for the kernel's
        // own: that none were found for it is then no news.
        let told = args.symbols.iter().any(|spec| !spec.contains('@'));
        let not_found: &[String] = if told { &[] } else { &found.not_found };
        for w in found.warnings.iter().chain(not_found) {
            vtrace_vmm::user_message(&format!("vtrace: warning: {w}"));
        }
    }
    Ok(symbols)
}

/// Adds the symbol files of `--symbols FILE[@ASPACE]` (a bzImage's
/// vmlinux where the file is one).
fn add_symbol_files(symbols: &mut Symbolizer, specs: &[String]) -> Result<()> {
    for spec in specs {
        let (file, scope) = match spec.rsplit_once('@') {
            Some((file, aspace)) => (file, Scope::parse(aspace)?),
            None => (spec.as_str(), Scope::Any),
        };
        let bytes = vtrace_image::symbols::read_symbol_file(Path::new(file))?;
        match vtrace_image::bzimage::vmlinux_inside(&bytes) {
            Some(vmlinux) => {
                symbols.add_bytes(&vmlinux, &format!("{file} (vmlinux inside)"), scope)?
            }
            None => symbols.add_bytes(&bytes, file, scope)?,
        }
    }
    Ok(())
}

/// Opens the trace, warning of what cannot be read.
fn open_trace(path: &Path) -> Result<Trace> {
    crate::cli::check_default_trace(path)?;
    let trace = Trace::open(path)?;
    for p in &trace.problems {
        vtrace_vmm::user_message(&format!("vtrace: warning: {}: {p}", path.display()));
    }
    let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    opened.push(Opened {
        path: path.to_path_buf(),
        at_open: trace.problems.clone(),
        found: trace.damage_found(),
    });
    Ok(trace)
}

/// A trace this command opened, and its damage.
struct Opened {
    path: PathBuf,
    /// Its problems known at opening (said then).
    at_open: Vec<String>,
    /// The damage its analyses found reading it.
    found: vtrace_analyzer::DamageLog,
}

/// Every trace this command opened.
static OPENED: std::sync::Mutex<Vec<Opened>> = std::sync::Mutex::new(Vec::new());

/// An analysis's JSON object with the damage it passed over added, so a
/// script sees it where it reads the results (an empty list: none).
#[derive(serde::Serialize)]
struct WithProblems<'a, T: serde::Serialize> {
    #[serde(flatten)]
    value: &'a T,
    problems: &'a [Problem],
}

/// One damage an analysis passed over, as `--json` gives it.
#[derive(serde::Serialize)]
struct Problem {
    /// The trace it is in.
    trace: String,
    /// What it took, in words.
    problem: String,
}

/// Every problem of the traces this command opened, known at opening or
/// found reading; `None` where it opened none (not an analysis of traces).
fn problems_of_opened_traces() -> Option<Vec<Problem>> {
    let opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    if opened.is_empty() {
        return None;
    }
    let mut all = Vec::new();
    for o in opened.iter() {
        let found = o.found.lock().unwrap_or_else(|e| e.into_inner());
        for p in o.at_open.iter().chain(found.iter()) {
            all.push(Problem {
                trace: o.path.display().to_string(),
                problem: p.clone(),
            });
        }
    }
    Some(all)
}

/// Says the damage the analyses passed over while reading (what was known
/// at opening is said already), and whether there was any.
fn damage_passed_over() -> bool {
    let opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    let mut any = false;
    for o in opened.iter() {
        let found = o.found.lock().unwrap_or_else(|e| e.into_inner());
        for p in found.iter() {
            vtrace_vmm::user_message(&format!("vtrace: warning: {}: {p}", o.path.display()));
        }
        any |= !o.at_open.is_empty() || !found.is_empty();
    }
    any
}

/// The `--pid`/`--comm` filter, where the trace can answer it.
fn task_filter(trace: &Trace, args: &TaskArgs) -> Result<TaskFilter> {
    let filter = args.filter();
    if !filter.is_everything() && !trace.metadata.names_tasks() {
        return Err(BadArgument(format!(
            "--pid and --comm need a trace that names Linux tasks, and {} names none \
             (its guest is not Linux, vtrace could not read the kernel's task layout, or \
             an older vtrace wrote it); `vtrace info` shows how it was made",
            trace.path().display()
        ))
        .into());
    }
    Ok(filter)
}

/// Says so when a filter left nothing to show.
fn warn_if_nothing(filter: &TaskFilter, steps: u64) {
    if steps == 0 && !filter.is_everything() {
        say!(
            "vtrace: warning: no step of {} in the trace (`vtrace analyze processes` lists \
             its tasks)",
            filter.describe()
        );
    }
}

/// Names the user code of a Linux trace: the programs its processes
/// mapped, from `--sysroot`, `--initramfs` or the initramfs the run booted
/// (where it is still there). Says what it could not use.
fn user_programs(trace: &Trace, args: &TraceArgs, symbols: &mut Symbolizer) -> Result<()> {
    /// Where to look: the sysroot, or an initramfs read once maps are known.
    enum Look {
        Ready(UserFiles),
        Initramfs(PathBuf),
    }
    // Where to look, and the option that said so (none for the default).
    let (look, option) = match (&args.sysroot, &args.initramfs) {
        (Some(dir), _) => {
            if !dir.is_dir() {
                return Err(Unreadable(format!(
                    "--sysroot {}: not a directory (give the guest's root file system)",
                    dir.display()
                ))
                .into());
            }
            (
                Look::Ready(UserFiles::Sysroot(dir.clone())),
                Some("--sysroot"),
            )
        }
        (None, Some(file)) => (Look::Initramfs(file.clone()), Some("--initramfs")),
        (None, None) => match (trace.metadata.names_tasks(), &trace.metadata.initrd) {
            (true, Some(file)) => (Look::Initramfs(PathBuf::from(file)), None),
            _ => return Ok(()),
        },
    };
    let label = option.map(|o| format!("{o}: ")).unwrap_or_default();
    let progress = StepsBar::new(trace, args, "finding user programs");
    let maps = recorded_maps(trace, &|done, _| progress.update(done))?;
    progress.finish();
    if maps.is_empty() {
        if option.is_some() {
            say!(
                "vtrace: warning: {label}the trace records no process's memory map \
                 (not a Linux trace, or its kernel's maps could not be read)"
            );
        }
        return Ok(());
    }
    let files = match look {
        Look::Ready(files) => files,
        Look::Initramfs(file) => match initramfs_files(&file, &maps) {
            Ok(files) => files,
            Err(why) => {
                say!("vtrace: warning: user programs are not named: {why}; give --sysroot DIR");
                return Ok(());
            }
        },
    };
    for w in add_user_symbols(symbols, &maps, &files) {
        vtrace_vmm::user_message(&format!("vtrace: warning: {label}{w}"));
    }
    Ok(())
}

/// The files of the initramfs `file` that `maps` name.
fn initramfs_files(file: &Path, maps: &[RecordedMap]) -> Result<UserFiles, String> {
    let origin = file.display().to_string();
    let bytes = std::fs::read(file).map_err(|e| format!("{origin} cannot be read ({e})"))?;
    let files = vtrace_image::initramfs::files_in(&bytes, &mapped_paths(maps))
        .map_err(|why| format!("{origin}: {why}"))?;
    Ok(UserFiles::Archive { origin, files })
}

/// The output file `path`; `-` is standard output.
fn create(path: &Path) -> Result<BufWriter<Box<dyn Write>>> {
    let out: Box<dyn Write> = if is_stdout(path) {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::fs::File::create(path).map_err(|e| {
            crate::exit_status::Unwritable(format!("cannot create {}: {e}", path.display()))
        })?)
    };
    Ok(BufWriter::with_capacity(1 << 20, out))
}

fn is_stdout(path: &Path) -> bool {
    path == Path::new("-")
}

/// Tells where an output went, unless it was standard output.
fn wrote(path: &Path, what: &str) {
    if !is_stdout(path) {
        say!("vtrace: wrote {}{what}", path.display());
    }
}

fn stdout() -> BufWriter<std::io::StdoutLock<'static>> {
    BufWriter::with_capacity(1 << 20, std::io::stdout().lock())
}

/// Prints `value` as JSON, or its text.
pub(crate) fn print(
    json: bool,
    value: &impl serde::Serialize,
    text: impl FnOnce() -> String,
) -> Result<()> {
    print_to(None, json, value, text)
}

/// The output `-o` names, standard output without one.
fn output(to: &OutputArgs) -> Result<BufWriter<Box<dyn Write>>> {
    create(to.output.as_deref().unwrap_or(Path::new("-")))
}

/// Writes `value` as JSON, or its text, where `-o` says.
pub(crate) fn print_to(
    to: Option<&OutputArgs>,
    json: bool,
    value: &impl serde::Serialize,
    text: impl FnOnce() -> String,
) -> Result<()> {
    let mut out = match to {
        Some(to) => output(to)?,
        None => create(Path::new("-"))?,
    };
    if json {
        match problems_of_opened_traces() {
            Some(problems) => serde_json::to_writer_pretty(
                &mut out,
                &WithProblems {
                    value,
                    problems: &problems,
                },
            )?,
            None => serde_json::to_writer_pretty(&mut out, value)?,
        }
        writeln!(out)?;
    } else {
        out.write_all(text().as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

/// A write to a closed pipe (`vtrace analyze listing | head`) ends quietly.
fn quiet_on_broken_pipe(r: Result<()>) -> Result<()> {
    match r {
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            Ok(())
        }
        other => other,
    }
}

pub fn analyze(args: AnalyzeArgs) -> Result<i32> {
    let allow_damage = args.allow_damage;
    quiet_on_broken_pipe(dispatch(args))?;
    if damage_passed_over() && !allow_damage {
        say!(
            "vtrace: the output leaves out what the warnings above say (exit status 1); \
             --allow-damage takes the trace as it is"
        );
        return Ok(1);
    }
    Ok(0)
}

/// Runs one analysis.
fn dispatch(args: AnalyzeArgs) -> Result<()> {
    use commands::{
        captures_of, flame, listing, nest, probes_of, processes, report, samples_of, spaces, stats,
        timeline,
    };
    use export::{diff, export};
    match args.what {
        AnalyzeCommand::Listing(a) => listing(a),
        AnalyzeCommand::Nest(a) => nest(a),
        AnalyzeCommand::Spaces(a) => spaces(a),
        AnalyzeCommand::Processes(a) => processes(a),
        AnalyzeCommand::Stats(a) => stats(a),
        AnalyzeCommand::Flame(a) => flame(a),
        AnalyzeCommand::Timeline(a) => timeline(a),
        AnalyzeCommand::Export(a) => export(a),
        AnalyzeCommand::Diff(a) => diff(a),
        AnalyzeCommand::Captures(a) => captures_of(a),
        AnalyzeCommand::Probes(a) => probes_of(a),
        AnalyzeCommand::Samples(a) => samples_of(a),
        AnalyzeCommand::Report(a) => report(a),
        AnalyzeCommand::Symbolize(a) => symbolize::symbolize(a),
        AnalyzeCommand::Gdb(a) => gdb::serve(a),
    }
}
