//! `vtrace analyze`: wiring from the command line to the analyzer crate.

use crate::exit_status::{BadArgument, BadData, Unreadable};
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use vtrace_analyzer::{
    add_user_symbols, captures, collect_processes, collect_spaces, collect_stats, folded_stats,
    format_captures, format_probes, mapped_paths, probes, recorded_maps, run_levels, samples,
    write_listing, write_listing_files, write_report, write_timeline, ListingOptions, NestOptions,
    NestWriter, RecordedMap, TimelineOptions, Trace, UserFiles,
};
use vtrace_image::symbols::{discover, Scope, Symbolizer};

use vtrace_analyzer::SelectedTasks;
use vtrace_analyzer::TaskFilter;

use crate::cli::{
    AnalyzeArgs, AnalyzeCommand, DiffArgs, ExportArgs, ExportFormatArg, OutputArgs, SyntaxArg,
    TaskArgs, TraceArgs,
};
use vtrace_analyzer::{Destination, ExportFormat};

/// Work that ends sooner shows no bar at all.
const SHOW_BAR_AFTER: Duration = Duration::from_secs(1);

/// A progress bar on stderr, when it is a terminal, that appears once the
/// work has taken a second: how long an analysis takes depends on what it
/// does per step (a listing formats every one, a nest diagram mostly
/// counts), so elapsed time decides, not the trace's length.
struct Progress {
    bar: ProgressBar,
    started: Instant,
    enabled: bool,
}

impl Progress {
    fn new(trace: &Trace, args: &TraceArgs, what: &str) -> Progress {
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
        Progress {
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
    let trace = open_trace(&args.trace)?;
    require_steps(&trace)?;
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
    for spec in &args.symbols {
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
        eprintln!(
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
    let progress = Progress::new(trace, args, "finding user programs");
    let maps = recorded_maps(trace, &|done, _| progress.update(done))?;
    progress.finish();
    if maps.is_empty() {
        if option.is_some() {
            eprintln!(
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
                eprintln!(
                    "vtrace: warning: user programs are not named: {why}; give --sysroot DIR"
                );
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
        Box::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        )
    };
    Ok(BufWriter::with_capacity(1 << 20, out))
}

fn is_stdout(path: &Path) -> bool {
    path == Path::new("-")
}

/// Tells where an output went, unless it was standard output.
fn wrote(path: &Path, what: &str) {
    if !is_stdout(path) {
        eprintln!("vtrace: wrote {}{what}", path.display());
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
        eprintln!(
            "vtrace: the output leaves out what the warnings above say (exit status 1); \
             --allow-damage takes the trace as it is"
        );
        return Ok(1);
    }
    Ok(0)
}

fn dispatch(args: AnalyzeArgs) -> Result<()> {
    match args.what {
        AnalyzeCommand::Listing(a) => {
            let (trace, symbols) = open(&a.trace)?;
            let options = ListingOptions {
                from: a.from,
                count: a.count,
                att: a.syntax == SyntaxArg::Att,
                lines: !a.no_lines,
                tasks: task_filter(&trace, &a.tasks)?,
                task_columns: trace.metadata.names_tasks(),
            };
            let bar = Progress::new(&trace, &a.trace, "listing");
            let progress = |done, _| bar.update(done);
            match &a.out {
                Some(dir) => {
                    let (files, shown) =
                        write_listing_files(&trace, &symbols, &options, dir, &progress)?;
                    bar.finish();
                    warn_if_nothing(&options.tasks, shown);
                    eprintln!("vtrace: wrote {} listing files to {}", files, dir.display());
                }
                None => {
                    let mut out = output(&a.to)?;
                    let shown = write_listing(&trace, &symbols, &options, &mut out, &progress)?;
                    out.flush()?;
                    bar.finish();
                    warn_if_nothing(&options.tasks, shown);
                }
            }
        }
        AnalyzeCommand::Nest(a) => {
            let (trace, symbols) = open(&a.trace)?;
            let filter = task_filter(&trace, &a.tasks)?;
            let bar = Progress::new(&trace, &a.trace, "nest");
            let progress = |done, _| bar.update(done);
            let out: Box<dyn Write> = match &a.output {
                Some(path) => Box::new(create(path)?),
                None => Box::new(stdout()),
            };
            if let Some(name) = &a.function {
                if symbols.addresses_of(name).is_empty() {
                    eprintln!(
                        "vtrace: warning: no routine named {name} in the trace's symbols: \
                         the diagram will be empty"
                    );
                }
            }
            let options = NestOptions {
                ns_per_step: trace.metadata.ns_per_step(),
                depth: a.depth.and_then(|d| usize::try_from(d).ok()),
                function: a.function.clone(),
                from: a.from,
                to: a.to,
                space: a.space,
            };
            let mut writer = NestWriter::with_options(out, &symbols, options);
            let only = if filter.is_everything() {
                String::new()
            } else {
                format!(", only {}", filter.describe())
            };
            writer.header(&format!(
                "vtrace nest diagram of {} ({} steps{only})",
                a.trace.trace.display(),
                trace.steps()
            ));
            let mut sink = SelectedTasks::new(writer, &filter);
            let engine = run_levels(&trace, &symbols, &mut sink, &progress)?;
            let writer = sink.inner;
            let divided = writer.divided;
            warn_if_nothing(&filter, writer.lines);
            if let (Some(space), 0) = (a.space, writer.lines) {
                eprintln!(
                    "vtrace: warning: nothing ran in address space {space:#x} (`vtrace analyze \
                     spaces` lists the trace's)"
                );
            }
            writer.finish()?;
            bar.finish();
            if a.output.is_some() {
                eprintln!(
                    "vtrace: {} steps, {} calls, {} interrupts, {} switches, \
                     {divided} divided levels, deepest stack {}",
                    engine.counts.steps,
                    engine.counts.calls,
                    engine.counts.interrupts,
                    engine.counts.switches,
                    engine.counts.max_depth
                );
            }
        }
        AnalyzeCommand::Spaces(a) => {
            let (trace, symbols) = open(&a.trace)?;
            let bar = Progress::new(&trace, &a.trace, "spaces");
            let table = collect_spaces(&trace, &symbols, &|d, _| bar.update(d))?;
            bar.finish();
            print_to(Some(&a.to), a.json, &table, || table.to_text())?;
        }
        AnalyzeCommand::Processes(a) => {
            let (trace, _) = open(&a.trace)?;
            let bar = Progress::new(&trace, &a.trace, "processes");
            let table = collect_processes(&trace, &|d, _| bar.update(d))?;
            bar.finish();
            print_to(Some(&a.to), a.json, &table, || table.to_text())?;
        }
        AnalyzeCommand::Stats(a) => {
            let (trace, symbols) = open(&a.trace)?;
            let bar = Progress::new(&trace, &a.trace, "stats");
            let filter = task_filter(&trace, &a.tasks)?;
            let s = collect_stats(&trace, &symbols, &filter, &|d, _| bar.update(d))?;
            bar.finish();
            warn_if_nothing(&filter, s.steps);
            print_to(Some(&a.to), a.json, &s, || s.to_text(a.top))?;
        }
        AnalyzeCommand::Flame(a) => {
            let (trace, symbols) = open(&a.trace)?;
            let bar = Progress::new(&trace, &a.trace, "flame");
            let filter = task_filter(&trace, &a.tasks)?;
            let folded = folded_stats(&trace, &symbols, &filter, &|d, _| bar.update(d))?;
            bar.finish();
            warn_if_nothing(&filter, folded.iter().map(|f| f.1).sum());
            let mut out = create(&a.output)?;
            if a.folded {
                for line in vtrace_analyzer::folded_lines(&folded) {
                    writeln!(out, "{line}")?;
                }
            } else {
                vtrace_analyzer::write_flame(
                    &folded,
                    &format!("{} ({} steps)", a.trace.trace.display(), trace.steps()),
                    &mut out,
                )?;
            }
            out.flush()?;
            wrote(&a.output, "");
        }
        AnalyzeCommand::Timeline(a) => {
            let trace = open_trace(&a.trace.trace)?;
            // A trace of samples only is a timeline of counters.
            if trace.metadata.peep.is_none() {
                require_steps(&trace)?;
            }
            let symbols = symbols(&trace, &a.trace)?;
            let bar = Progress::new(&trace, &a.trace, "timeline");
            let mut out = create(&a.output)?;
            let filter = task_filter(&trace, &a.tasks)?;
            let events = write_timeline(
                &trace,
                &symbols,
                &TimelineOptions {
                    min_steps: a.min_steps,
                    tasks: filter,
                },
                &mut out,
                &|d, _| bar.update(d),
            )?;
            out.flush()?;
            bar.finish();
            wrote(
                &a.output,
                &format!(" ({events} events; open it in ui.perfetto.dev or chrome://tracing)"),
            );
        }
        AnalyzeCommand::Export(a) => export(a)?,
        AnalyzeCommand::Diff(a) => diff(a)?,
        AnalyzeCommand::Captures(a) => {
            // Captures taken with tracing off make a trace without steps.
            let trace = open_trace(&a.trace)?;
            let found = captures(&trace, &vtrace_analyzer::no_progress)?;
            if found.is_empty() && !a.json {
                eprintln!(
                    "vtrace: {} holds no captures (`vtrace run --capture` takes them)",
                    a.trace.display()
                );
                return Ok(());
            }
            print_to(
                Some(&a.to),
                a.json,
                &serde_json::json!({ "captures": &found }),
                || format_captures(&found),
            )?;
        }
        AnalyzeCommand::Probes(a) => {
            // Probes recorded with tracing off make a trace without steps.
            let trace = open_trace(&a.trace)?;
            let quantize = a.quantize.map(usize::from);
            let found = probes(&trace, quantize, &vtrace_analyzer::no_progress)?;
            if found.is_empty() && !a.json {
                eprintln!(
                    "vtrace: {} holds no probe fires (`vtrace run --probe` records them)",
                    a.trace.display()
                );
                return Ok(());
            }
            print_to(
                Some(&a.to),
                a.json,
                &serde_json::json!({ "probes": &found }),
                || format_probes(&found),
            )?;
        }
        AnalyzeCommand::Samples(a) => {
            // Peeping needs no tracing: a trace of samples has no steps.
            let trace = open_trace(&a.trace.trace)?;
            let found = samples(&trace, &vtrace_analyzer::no_progress)?;
            if found.samples.is_empty() {
                return Err(BadData(format!(
                    "{} holds no samples (`vtrace run --peep INTERVAL --sample SYMBOL` takes \
                     them)",
                    a.trace.trace.display()
                ))
                .into());
            }
            let has_pc = found.samples.iter().any(|s| s.pc.is_some());
            // Routine names only matter for pc samples.
            let symbols = match has_pc {
                true => symbols(&trace, &a.trace)?,
                false => Symbolizer::new(),
            };
            if let Some(path) = &a.flame {
                if !has_pc {
                    return Err(BadArgument(format!(
                        "--flame: the samples of {} have no pc (`vtrace run --sample-pc` takes \
                         it)",
                        a.trace.trace.display()
                    ))
                    .into());
                }
                let mut out = create(path)?;
                vtrace_analyzer::write_flame_of(
                    &found.folded(&symbols),
                    &format!("{} (pc samples)", a.trace.trace.display()),
                    "samples",
                    &mut out,
                )?;
                out.flush()?;
                wrote(path, "");
            }
            if a.json {
                return print_to(Some(&a.to), true, &found.to_json(&symbols), String::new);
            }
            let mut out = output(&a.to)?;
            if a.csv {
                out.write_all(found.format_csv(&symbols).as_bytes())?;
            } else {
                out.write_all(found.format_table(&symbols).as_bytes())?;
            }
            out.flush()?;
        }
        AnalyzeCommand::Report(a) => {
            let (trace, symbols) = open(&a.trace)?;
            let bar = Progress::new(&trace, &a.trace, "report");
            let mut out = create(&a.output)?;
            write_report(&trace, &symbols, a.nest_lines, &mut out, &|d, _| {
                bar.update(d)
            })?;
            out.flush()?;
            bar.finish();
            wrote(&a.output, "");
        }
    }
    Ok(())
}

/// Where `vtrace analyze export` writes, and in what format.
fn export_destination(a: &ExportArgs) -> Result<(ExportFormat, Destination)> {
    let extension = a.output.extension().and_then(|e| e.to_str());
    let from_extension = match extension {
        Some("parquet") => Some(ExportFormat::Parquet),
        Some("jsonl") => Some(ExportFormat::Jsonl),
        _ => None,
    };
    let format = match (a.format, from_extension) {
        (Some(ExportFormatArg::Parquet), _) => ExportFormat::Parquet,
        (Some(ExportFormatArg::Jsonl), _) => ExportFormat::Jsonl,
        (None, Some(f)) => f,
        (None, None) if is_stdout(&a.output) => ExportFormat::Jsonl,
        (None, None) => ExportFormat::Parquet,
    };
    if from_extension.is_some_and(|f| f != format) {
        return Err(BadArgument(format!(
            "{} names a .{} file but --format is {}: drop --format or rename the file",
            a.output.display(),
            extension.unwrap_or_default(),
            format.extension()
        ))
        .into());
    }
    // Another extension is a file the user meant, of a format export does
    // not write: not a directory of Parquet files by that name.
    if let (Some(other), None, false) = (extension, from_extension, a.output.is_dir()) {
        return Err(BadArgument(format!(
            "{}: export writes .parquet or .jsonl files, not .{other}; name the file so, or \
             name a directory (no extension) for files of whole segments",
            a.output.display()
        ))
        .into());
    }
    let destination = if is_stdout(&a.output) {
        if format == ExportFormat::Parquet {
            return Err(BadArgument(
                "Parquet cannot go to standard output (its index is at the end of the file): \
                 name a file (-o steps.parquet) or use --format jsonl"
                    .to_string(),
            )
            .into());
        }
        Destination::Stdout
    } else if from_extension.is_some() && !a.output.is_dir() {
        Destination::File(a.output.clone())
    } else {
        if a.output.exists() && !a.output.is_dir() {
            return Err(BadArgument(format!(
                "{} is a file: name it .{} for one file, or name a directory",
                a.output.display(),
                format.extension()
            ))
            .into());
        }
        Destination::Directory {
            dir: a.output.clone(),
            steps_per_file: a.steps_per_file,
        }
    };
    Ok((format, destination))
}

fn export(a: ExportArgs) -> Result<()> {
    let (format, destination) = export_destination(&a)?;
    let (trace, symbols) = open(&a.trace)?;
    let bar = Progress::new(&trace, &a.trace, "export");
    let started = Instant::now();
    let report = vtrace_analyzer::export(&trace, &symbols, format, &destination, &|d, _| {
        bar.update(d)
    })
    .with_context(|| format!("exporting to {}", a.output.display()))?;
    bar.finish();
    if destination == Destination::Stdout {
        return Ok(());
    }
    let seconds = started.elapsed().as_secs_f64();
    let bytes = report.bytes();
    let place = match &destination {
        Destination::Directory { dir, .. } => {
            let n = report.files.len();
            format!(
                "{n} file{} in {}",
                if n == 1 { "" } else { "s" },
                dir.display()
            )
        }
        _ => a.output.display().to_string(),
    };
    eprintln!(
        "vtrace: wrote {} steps to {place} ({:.1} MB, {:.2} bytes per step; {:.1} M steps/s)",
        report.steps,
        bytes as f64 / 1e6,
        bytes as f64 / report.steps.max(1) as f64,
        report.steps as f64 / seconds.max(1e-9) / 1e6
    );
    Ok(())
}

/// The statistics of one side of `vtrace analyze diff`.
fn diff_side(path: &Path, a: &DiffArgs, what: &str) -> Result<vtrace_analyzer::Stats> {
    let args = TraceArgs {
        trace: path.to_path_buf(),
        symbols: a.symbols.clone(),
        no_kernel_symbols: a.no_kernel_symbols,
        sysroot: None,
        initramfs: None,
        quiet: a.quiet,
    };
    let (trace, symbols) = open(&args)?;
    let bar = Progress::new(&trace, &args, what);
    let s = collect_stats(
        &trace,
        &symbols,
        &vtrace_analyzer::TaskFilter::default(),
        &|d, _| bar.update(d),
    )?;
    bar.finish();
    Ok(s)
}

fn diff(a: DiffArgs) -> Result<()> {
    let sa = diff_side(&a.a, &a, "A")?;
    let sb = diff_side(&a.b, &a, "B")?;
    let (name_a, name_b) = (a.a.display().to_string(), a.b.display().to_string());
    let d = vtrace_analyzer::compare(&name_a, &sa, &name_b, &sb);
    if let Some(path) = &a.flame {
        let mut out = create(path)?;
        vtrace_analyzer::write_diff_flame(
            &sa.folded,
            &sb.folded,
            &format!("{name_b} against {name_a} (red: more steps in B)"),
            a.normalize,
            &mut out,
        )?;
        out.flush()?;
        wrote(path, "");
    }
    print_to(Some(&a.to), a.json, &d, || d.to_text(a.top))
}
