//! The analyses that read a trace and print or write what they make: one
//! function a `vtrace analyze` command, each opening the trace, running
//! the library's entry point with a progress bar, and saying what it
//! wrote.

use super::*;
use crate::cli::TimelineFormatArg;
use vtrace_analyzer::{filter_stacks, NestDiagram, StackFilter, TimelineFormat};

/// `vtrace analyze listing`: every step, as text or into files.
pub(super) fn listing(a: ListingArgs) -> Result<()> {
    let (trace, symbols) = open(&a.trace)?;
    let options = ListingOptions {
        from: a.from,
        count: a.count,
        att: a.syntax == SyntaxArg::Att,
        lines: !a.no_lines,
        tasks: task_filter(&trace, &a.tasks)?,
        task_columns: trace.metadata.names_tasks(),
        // Both from the trace (its CPUs, and --cpu N).
        cpu_column: false,
        cpu: None,
        values: a.values,
    };
    let bar = StepsBar::new(&trace, &a.trace, "listing");
    let progress = |done, _| bar.update(done);
    match &a.out {
        Some(dir) => {
            let (files, shown) = write_listing_files(&trace, &symbols, &options, dir, &progress)?;
            bar.finish();
            warn_if_nothing(&options.tasks, shown);
            say!("vtrace: wrote {} listing files to {}", files, dir.display());
        }
        None => {
            let mut out = output(&a.to)?;
            let shown = write_listing(&trace, &symbols, &options, &mut out, &progress)?;
            out.flush()?;
            bar.finish();
            warn_if_nothing(&options.tasks, shown);
            warn_if_no_step_of_the_cpu(&trace, &a, shown);
        }
    }
    Ok(())
}

/// A window that holds none of the chosen CPU's steps says why: `--from`
/// and `--count` number the trace's steps, every CPU's.
fn warn_if_no_step_of_the_cpu(trace: &vtrace_analyzer::Trace, a: &ListingArgs, shown: u64) {
    let (Some(cpu), 0) = (trace.selected_cpu(), shown) else {
        return;
    };
    if a.from.is_none() && a.count.is_none() {
        return;
    }
    let from = a.from.unwrap_or(0);
    let to = a.count.map_or("the end".to_string(), |c| {
        from.saturating_add(c).to_string()
    });
    say!(
        "vtrace: warning: steps {from} to {to} of the trace hold no step of CPU {cpu}: --from \
         and --count number the trace's steps, every CPU's (`vtrace analyze stats --cpu all` \
         shows each CPU's share)"
    );
}

/// `vtrace analyze nest`: the nest diagram of call levels.
pub(super) fn nest(a: NestArgs) -> Result<()> {
    let (trace, symbols) = open(&a.trace)?;
    let filter = task_filter(&trace, &a.tasks)?;
    let bar = StepsBar::new(&trace, &a.trace, "nest");
    let progress = |done, _| bar.update(done);
    let out: Box<dyn Write> = match &a.output {
        Some(path) => Box::new(create(path)?),
        None => Box::new(stdout()),
    };
    if let Some(name) = &a.function {
        if symbols.addresses_of(name).is_empty() {
            say!(
                "vtrace: warning: no routine named {name} in the trace's symbols: \
                 the diagram will be empty"
            );
        }
    }
    let ns_per_step = trace.metadata.ns_per_step();
    let min_steps = match (a.min_steps, a.min_time) {
        (Some(steps), _) => Some(steps),
        (None, Some(time)) => Some(min_time_in_steps(&trace, time, ns_per_step)?),
        (None, None) => None,
    };
    let options = NestOptions {
        ns_per_step,
        depth: a.depth.and_then(|d| usize::try_from(d).ok()),
        function: a.function.clone(),
        from: a.from,
        to: a.to,
        space: a.space,
        exclude: a.calls.filter().map_err(|e| BadArgument(e.to_string()))?,
        min_steps,
        retval: a.retval,
    };
    let only = if filter.is_everything() {
        String::new()
    } else {
        format!(", only {}", filter.describe())
    };
    let title = format!(
        "vtrace nest diagram of {} ({} steps{only})",
        a.trace.trace.display(),
        trace.steps()
    );
    let (totals, _) = NestDiagram::new(&trace, &symbols)
        .tasks(&filter)
        .options(options)
        .title(&title)
        .progress(&progress)
        .write(out)?;
    warn_if_nothing(&filter, totals.lines);
    if let (Some(space), 0) = (a.space, totals.lines) {
        say!(
            "vtrace: warning: nothing ran in address space {space:#x} (`vtrace analyze \
             spaces` lists the trace's)"
        );
    }
    bar.finish();
    if a.output.is_some() {
        let counts = totals.counts;
        say!(
            "vtrace: {} steps, {} calls, {} interrupts, {} switches, \
             {} divided levels, deepest stack {}",
            counts.steps,
            counts.calls,
            counts.interrupts,
            counts.switches,
            totals.divided,
            counts.max_depth
        );
    }
    Ok(())
}

/// `--min-time` as steps of the trace's clock: the fewest steps that last
/// at least `time`.
fn min_time_in_steps(trace: &Trace, time: Duration, ns_per_step: Option<u64>) -> Result<u64> {
    let Some(ns) = ns_per_step.filter(|ns| *ns > 0) else {
        return Err(BadArgument(format!(
            "--min-time needs a trace whose clock turns steps into time, and {} was made with              the host's clock (`vtrace info` shows it); give --min-steps",
            trace.path().display()
        ))
        .into());
    };
    let time = u64::try_from(time.as_nanos()).unwrap_or(u64::MAX);
    Ok(time.div_ceil(ns))
}

/// `vtrace analyze spaces`: the address spaces and what ran in each.
pub(super) fn spaces(a: SpacesArgs) -> Result<()> {
    let (trace, symbols) = open(&a.trace)?;
    let bar = StepsBar::new(&trace, &a.trace, "spaces");
    let table = collect_spaces(&trace, &symbols, &|d, _| bar.update(d))?;
    bar.finish();
    print_to(Some(&a.to), a.json, &table, || table.to_text())?;
    Ok(())
}

/// `vtrace analyze processes`: the Linux processes and their programs.
pub(super) fn processes(a: SpacesArgs) -> Result<()> {
    let (trace, _) = open(&a.trace)?;
    let bar = StepsBar::new(&trace, &a.trace, "processes");
    let table = collect_processes(&trace, &|d, _| bar.update(d))?;
    bar.finish();
    print_to(Some(&a.to), a.json, &table, || table.to_text())?;
    Ok(())
}

/// `vtrace analyze stats`: instruction statistics and routine counts.
pub(super) fn stats(a: StatsArgs) -> Result<()> {
    let (trace, symbols) = open(&a.trace)?;
    if a.trace.cpu == Some(CpuChoice::Each) {
        let bar = StepsBar::new(&trace, &a.trace, "stats");
        let s = vtrace_analyzer::collect_cpus(&trace, &symbols, &|d, _| bar.update(d))?;
        bar.finish();
        print_to(Some(&a.to), a.json, &s, || s.to_text(a.top))?;
        return Ok(());
    }
    let bar = StepsBar::new(&trace, &a.trace, "stats");
    let filter = task_filter(&trace, &a.tasks)?;
    let s = collect_stats(&trace, &symbols, &filter, &|d, _| bar.update(d))?;
    bar.finish();
    warn_if_nothing(&filter, s.steps);
    print_to(Some(&a.to), a.json, &s, || s.to_text(a.top))?;
    Ok(())
}

/// `vtrace analyze flame`: a flame graph (SVG or folded stacks).
pub(super) fn flame(a: FlameArgs) -> Result<()> {
    let (trace, symbols) = open(&a.trace)?;
    let bar = StepsBar::new(&trace, &a.trace, "flame");
    let filter = task_filter(&trace, &a.tasks)?;
    let folded = folded_stats(&trace, &symbols, &filter, &|d, _| bar.update(d))?;
    let stacks = StackFilter {
        exclude: a.calls.filter().map_err(|e| BadArgument(e.to_string()))?,
        depth: a.depth.and_then(|d| usize::try_from(d).ok()),
        function: a.function.clone(),
    };
    let folded = filter_stacks(&folded, &stacks);
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
    Ok(())
}

/// `vtrace analyze timeline`: a Perfetto timeline.
pub(super) fn timeline(a: TimelineArgs) -> Result<()> {
    let trace = open_trace(&a.trace.trace)?;
    // A trace of samples only is a timeline of counters.
    if trace.metadata.peep.is_none() {
        require_steps(&trace)?;
    }
    let symbols = symbols(&trace, &a.trace)?;
    let bar = StepsBar::new(&trace, &a.trace, "timeline");
    let mut out = create(&a.output)?;
    let filter = task_filter(&trace, &a.tasks)?;
    let format = match a.format {
        Some(TimelineFormatArg::Json) => TimelineFormat::Json,
        Some(TimelineFormatArg::Perfetto) => TimelineFormat::Perfetto,
        None => timeline_format_of(&a.output),
    };
    let events = write_timeline(
        &trace,
        &symbols,
        &TimelineOptions {
            min_steps: a.min_steps,
            tasks: filter,
            format,
        },
        &mut out,
        &|d, _| bar.update(d),
    )?;
    out.flush()?;
    bar.finish();
    let open_in = match format {
        TimelineFormat::Perfetto => "open it in ui.perfetto.dev",
        TimelineFormat::Json => "open it in ui.perfetto.dev or chrome://tracing",
    };
    wrote(&a.output, &format!(" ({events} events; {open_in})"));
    Ok(())
}

/// The timeline format an output's name asks for: Perfetto's own
/// extensions mean protobuf.
fn timeline_format_of(path: &Path) -> TimelineFormat {
    match path.extension().and_then(|e| e.to_str()) {
        Some("pftrace" | "perfetto-trace" | "pb") => TimelineFormat::Perfetto,
        _ => TimelineFormat::Json,
    }
}

/// `vtrace analyze captures`: the captures taken.
pub(super) fn captures_of(a: CapturesArgs) -> Result<()> {
    // Captures taken with tracing off make a trace without steps.
    let trace = open_trace(&a.trace)?;
    let found = captures(&trace, &vtrace_analyzer::no_progress)?;
    if found.is_empty() && !a.json {
        say!(
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
    Ok(())
}

/// `vtrace analyze probes`: the probes that fired.
pub(super) fn probes_of(a: ProbesTraceArgs) -> Result<()> {
    // Probes recorded with tracing off make a trace without steps.
    let trace = open_trace(&a.trace)?;
    if a.fires {
        let fires = vtrace_analyzer::probe_fires(&trace, &vtrace_analyzer::no_progress)?;
        return print_to(
            Some(&a.to),
            a.json,
            &serde_json::json!({ "fires": &fires }),
            || fires_text(&fires),
        );
    }
    let found = probes(&trace, a.quantize.clone(), &vtrace_analyzer::no_progress)?;
    if found.is_empty() && !a.json {
        say!(
            "vtrace: {} holds no probe fires (`vtrace run --probe` records them)",
            a.trace.display()
        );
        return Ok(());
    }
    print_to(
        Some(&a.to),
        a.json,
        &serde_json::json!({ "probes": &found }),
        // Probe and value names are the trace's: a crafted one must not
        // steer the terminal.
        || {
            format_probes(&found)
                .lines()
                .map(|l| format!("{}\n", vtrace_vmm::escape_within_line(l)))
                .collect()
        },
    )?;
    Ok(())
}

/// One line a fire: step, probe, arguments, and typed values where it
/// has them (with the trace's text escaped: a guest wrote it).
fn fires_text(fires: &[vtrace_analyzer::Fire]) -> String {
    let mut out = String::new();
    for f in fires {
        let line = match f.values.is_empty() {
            true => {
                let args: Vec<String> = f.args.iter().map(|a| (*a as i64).to_string()).collect();
                format!("{:>12}  {}({})", f.step, f.probe, args.join(", "))
            }
            false => {
                let values: Vec<String> =
                    f.values.iter().map(|(n, v)| format!("{n}={v}")).collect();
                format!("{:>12}  {} {}", f.step, f.probe, values.join(" "))
            }
        };
        out.push_str(&vtrace_vmm::escape_within_line(&line));
        out.push('\n');
    }
    out
}

/// `vtrace analyze samples`: the peeper's samples.
pub(super) fn samples_of(a: SamplesArgs) -> Result<()> {
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
    Ok(())
}

/// `vtrace analyze report`: the HTML report.
pub(super) fn report(a: ReportArgs) -> Result<()> {
    let (trace, symbols) = open(&a.trace)?;
    let bar = StepsBar::new(&trace, &a.trace, "report");
    let calls = NestOptions {
        depth: a.depth.and_then(|d| usize::try_from(d).ok()),
        function: a.function.clone(),
        exclude: a.calls.filter().map_err(|e| BadArgument(e.to_string()))?,
        min_steps: a.min_steps,
        retval: a.retval,
        ..NestOptions::default()
    };
    let mut out = create(&a.output)?;
    write_report(&trace, &symbols, a.nest_lines, &calls, &mut out, &|d, _| {
        bar.update(d)
    })?;
    out.flush()?;
    bar.finish();
    wrote(&a.output, "");
    Ok(())
}
