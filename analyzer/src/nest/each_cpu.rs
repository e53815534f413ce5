//! A whole nest diagram, written from a trace: on a trace of several CPUs,
//! each CPU's in turn.

use std::io::Write;

use super::{NestOptions, NestWriter};
use crate::error::Result;
use crate::input::{pass_progress, Progress, Trace};
use crate::levels::{run_with_on, LevelCounts, LevelSink, SelectedTasks};
use crate::tasks::TaskFilter;
use vtrace_image::symbols::Symbolizer;

/// What writing a diagram saw, every CPU's added up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiagramTotals {
    /// Lines written (the legend and CPU lines not counted).
    pub lines: u64,
    /// `## divided level ##` markers among them.
    pub divided: u64,
    /// What the level engine counted.
    pub counts: LevelCounts,
}

/// Writes the nest diagram of the steps of the tasks `filter` selects to
/// `out`, after the legend titled `title`, and gives `out` back, with
/// `beside`, a sink told all the diagram is (`()` for none). On a
/// trace of several CPUs with none selected, each CPU's diagram in turn,
/// each after a `# CPU N` line: a CPU has call stacks of its own, so its
/// calls nest only among its own steps (ftrace's function graph tells
/// them apart by a CPU column instead). Step numbers are the trace's.
#[allow(clippy::too_many_arguments)] // each a different thing the caller has
pub fn write_diagram<W: Write, S: LevelSink>(
    trace: &Trace,
    symbols: &Symbolizer,
    filter: &TaskFilter,
    options: &NestOptions,
    title: &str,
    out: W,
    beside: S,
    progress: Progress<'_>,
) -> Result<(DiagramTotals, W, S)> {
    let cpus = trace.each_cpu();
    let passes = cpus.len() as u64;
    let several = cpus.len() > 1;
    let mut totals = DiagramTotals::default();
    let (mut out, mut beside) = (out, beside);
    for (pass, only) in (0u64..).zip(cpus) {
        let mut writer = NestWriter::with_options(out, symbols, options.clone());
        if pass == 0 {
            writer.header(title);
        }
        if let (true, Some(cpu)) = (several, only) {
            writer.comment(&format!("CPU {cpu}"));
        }
        let mut sink = SelectedTasks::new((writer, beside), filter);
        let progress = pass_progress(progress, pass, passes);
        let engine = run_with_on(trace, only, symbols, &mut sink, |_| (), |_| {}, &progress)?;
        let writer;
        (writer, beside) = sink.inner;
        totals.lines = totals.lines.saturating_add(writer.lines);
        totals.divided = totals.divided.saturating_add(writer.divided);
        totals.counts.add(&engine.counts);
        out = writer.finish()?;
    }
    Ok((totals, out, beside))
}
