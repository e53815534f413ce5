//! A whole nest diagram, written from a trace: on a trace of several CPUs,
//! each CPU's in turn.

use std::io::Write;

use super::{NestOptions, NestWriter};
use crate::error::Result;
use crate::input::{no_progress, pass_progress, Progress, Trace};
use crate::levels::{LevelCounts, LevelPass, LevelSink, SelectedTasks};
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

/// The nest diagram of a trace, set up as a builder and then written
/// ([`NestDiagram::write`]). By default: every task's steps, no options
/// beyond the defaults, the title "nest diagram", no progress said. On a
/// trace of several CPUs with no CPU chosen, each CPU's diagram in turn,
/// each after a `# CPU N` line: a CPU has call stacks of its own, so its
/// calls nest only among its own steps (ftrace's function graph tells
/// them apart by a CPU column instead). Step numbers are the trace's.
pub struct NestDiagram<'a> {
    trace: &'a Trace,
    symbols: &'a Symbolizer,
    tasks: Option<&'a TaskFilter>,
    options: NestOptions,
    title: &'a str,
    progress: Progress<'a>,
}

impl std::fmt::Debug for NestDiagram<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NestDiagram")
            .field("options", &self.options)
            .field("title", &self.title)
            .finish_non_exhaustive()
    }
}

impl<'a> NestDiagram<'a> {
    /// The diagram of `trace`, its routines named by `symbols`.
    pub fn new(trace: &'a Trace, symbols: &'a Symbolizer) -> Self {
        NestDiagram {
            trace,
            symbols,
            tasks: None,
            options: NestOptions::default(),
            title: "nest diagram",
            progress: &no_progress,
        }
    }

    /// Of the steps of the tasks `filter` selects.
    pub fn tasks(self, filter: &'a TaskFilter) -> Self {
        NestDiagram {
            tasks: Some(filter),
            ..self
        }
    }

    /// Showing what `options` say.
    pub fn options(self, options: NestOptions) -> Self {
        NestDiagram { options, ..self }
    }

    /// Its legend titled `title`.
    pub fn title(self, title: &'a str) -> Self {
        NestDiagram { title, ..self }
    }

    /// Saying how far it got to `progress`.
    pub fn progress(self, progress: Progress<'a>) -> Self {
        NestDiagram { progress, ..self }
    }

    /// Writes the diagram to `out`, and gives `out` back.
    pub fn write<W: Write>(self, out: W) -> Result<(DiagramTotals, W)> {
        let (totals, out, ()) = self.write_beside(out, ())?;
        Ok((totals, out))
    }

    /// Writes the diagram to `out`, with `beside` a sink told all the
    /// diagram is, and gives both back.
    pub fn write_beside<W: Write, S: LevelSink>(
        self,
        out: W,
        beside: S,
    ) -> Result<(DiagramTotals, W, S)> {
        let everything = TaskFilter::default();
        let filter = self.tasks.unwrap_or(&everything);
        let cpus = self.trace.each_cpu();
        let passes = cpus.len() as u64;
        let several = cpus.len() > 1;
        let mut totals = DiagramTotals::default();
        let (mut out, mut beside) = (out, beside);
        for (pass, only) in (0u64..).zip(cpus) {
            let mut writer = NestWriter::with_options(out, self.symbols, self.options.clone());
            if pass == 0 {
                writer.header(self.title);
            }
            if let (true, Some(cpu)) = (several, only) {
                writer.comment(&format!("CPU {cpu}"));
            }
            let mut sink = SelectedTasks::new((writer, beside), filter);
            let progress = pass_progress(self.progress, pass, passes);
            let engine = LevelPass::new(self.trace, self.symbols)
                .cpu(only)
                .progress(&progress)
                .run(&mut sink)?;
            let writer;
            (writer, beside) = sink.inner;
            totals.lines = totals.lines.saturating_add(writer.lines);
            totals.divided = totals.divided.saturating_add(writer.divided);
            totals.counts.add(&engine.counts);
            out = writer.finish()?;
        }
        Ok((totals, out, beside))
    }
}
