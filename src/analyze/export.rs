//! `vtrace analyze export` (a row per step for data tools) and `vtrace
//! analyze diff` (two traces' statistics side by side).

use super::*;

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

pub(super) fn export(a: ExportArgs) -> Result<()> {
    let (format, destination) = export_destination(&a)?;
    let (trace, symbols) = open(&a.trace)?;
    let bar = StepsBar::new(&trace, &a.trace, "export");
    let started = Instant::now();
    // A Ctrl-C ends the export at the next segment, and the file being
    // written goes (a second one kills).
    vtrace_vmm::stop_signals::catch()?;
    let stopped = || vtrace_vmm::stop_signals::caught().is_some();
    let exported = vtrace_export::export(
        &trace,
        &symbols,
        format,
        &destination,
        &|d, _| bar.update(d),
        &stopped,
    );
    let report = match (exported, vtrace_vmm::stop_signals::caught()) {
        (Ok(report), _) => report,
        (Err(_), Some(signal)) => {
            bar.finish();
            let left = match &destination {
                Destination::File(path) => format!("no file is left under {}", path.display()),
                Destination::Directory { dir, .. } => format!(
                    "the files in {} hold whole segments up to there, the one being written \
                     was removed",
                    dir.display()
                ),
                Destination::Stdout => "the lines end at a whole segment".to_string(),
            };
            return Err(anyhow::Error::new(crate::exit_status::Stopped(signal))
                .context(format!("the export was not completed ({left})")));
        }
        (Err(e), None) => {
            return Err(e).with_context(|| format!("exporting to {}", a.output.display()))
        }
    };
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
    say!(
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
        cpu: None,
    };
    let (trace, symbols) = open(&args)?;
    let bar = StepsBar::new(&trace, &args, what);
    let s = collect_stats(
        &trace,
        &symbols,
        &vtrace_analyzer::TaskFilter::default(),
        &|d, _| bar.update(d),
    )?;
    bar.finish();
    Ok(s)
}

pub(super) fn diff(a: DiffArgs) -> Result<()> {
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
