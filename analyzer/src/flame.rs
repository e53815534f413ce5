//! Flame graphs of steps by call stack, drawn by inferno.

use std::io::Write;

use crate::error::{AnalyzeError, Result};
use crate::input::{Progress, Trace};
use crate::levels::{LevelPass, SelectedTasks};
use crate::routine_filter::RoutineFilter;
use crate::stats::{added_up, call_paths, Profile};
use crate::tasks::TaskFilter;
use vtrace_image::symbols::Symbolizer;

/// Only the call-stack profile a flame graph needs, without the per-step
/// statistics [`crate::collect_stats`] gathers too. On a trace of several
/// CPUs with none selected, every CPU's call stacks added up (as perf's
/// system-wide profiles do), a pass each.
pub fn folded(
    trace: &Trace,
    symbols: &Symbolizer,
    filter: &TaskFilter,
    progress: Progress<'_>,
) -> Result<Vec<(Vec<String>, u64)>> {
    let cpus = trace.each_cpu();
    let passes = cpus.len() as u64;
    let mut folded = Vec::new();
    for (pass, only) in (0u64..).zip(cpus) {
        let mut sink = SelectedTasks::new(Profile::default(), filter);
        let progress = crate::input::pass_progress(progress, pass, passes);
        let engine = LevelPass::new(trace, symbols)
            .cpu(only)
            .progress(&progress)
            .run(&mut sink)?;
        folded.extend(call_paths(&engine, &sink.inner, symbols));
    }
    Ok(added_up(folded))
}

/// Which call stacks a flame graph shows, as the nest diagram's filters.
#[derive(Clone, Debug, Default)]
pub struct StackFilter {
    /// Routines cut from the stacks with all they call: their steps go to
    /// their caller, whose self time they were in the nest diagram's
    /// totals.
    pub exclude: RoutineFilter,
    /// Routine levels kept below the root (the task or address space);
    /// deeper steps count in the routine at the last level kept.
    pub depth: Option<usize>,
    /// Only the stacks through a routine of this name.
    pub function: Option<String>,
}

/// `folded` (a root, then routines outermost first, and steps) as
/// `filter` says, equal stacks added up.
pub fn filter_stacks(
    folded: &[(Vec<String>, u64)],
    filter: &StackFilter,
) -> Vec<(Vec<String>, u64)> {
    let mut out: Vec<(Vec<String>, u64)> = folded
        .iter()
        .filter(|(path, _)| {
            filter
                .function
                .as_ref()
                .is_none_or(|f| path.iter().skip(1).any(|n| n == f))
        })
        .map(|(path, count)| {
            let mut keep = path
                .iter()
                .skip(1)
                .position(|n| filter.exclude.excludes_name(n))
                .map_or(path.len(), |i| i + 1);
            if let Some(depth) = filter.depth {
                keep = keep.min(depth.saturating_add(1));
            }
            (path[..keep].to_vec(), *count)
        })
        .collect();
    out.sort();
    out.dedup_by(|b, a| {
        let same = a.0 == b.0;
        if same {
            a.1 = a.1.saturating_add(b.1);
        }
        same
    });
    out
}

/// Folded stacks (`a;b;c count`), the format flame graph tools read.
pub fn folded_lines(folded: &[(Vec<String>, u64)]) -> Vec<String> {
    folded
        .iter()
        .filter(|(path, _)| !path.is_empty())
        .map(|(path, count)| {
            let names: Vec<String> = path.iter().map(|n| n.replace([';', ' '], "_")).collect();
            format!("{} {count}", names.join(";"))
        })
        .collect()
}

/// Writes an SVG flame graph, widths in steps.
pub fn write_svg(folded: &[(Vec<String>, u64)], title: &str, out: &mut impl Write) -> Result<()> {
    write_svg_of(folded, title, "steps", out)
}

/// Writes an SVG flame graph, widths in `unit` (steps, samples).
pub fn write_svg_of(
    folded: &[(Vec<String>, u64)],
    title: &str,
    unit: &str,
    out: &mut impl Write,
) -> Result<()> {
    write_svg_with(folded, title, unit, None, out)
}

/// [`write_svg_of`], `width` pixels wide where given (else as wide as
/// its viewer: an SVG file opened on its own).
pub fn write_svg_with(
    folded: &[(Vec<String>, u64)],
    title: &str,
    unit: &str,
    width: Option<usize>,
    out: &mut impl Write,
) -> Result<()> {
    let lines = folded_lines(folded);
    let mut options = inferno::flamegraph::Options::default();
    options.image_width = width;
    options.title = title.to_string();
    options.count_name = unit.to_string();
    options.hash = true;
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(|s| s.as_str()), out)
        .map_err(AnalyzeError::Flame)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stacks(list: &[(&str, u64)]) -> Vec<(Vec<String>, u64)> {
        list.iter()
            .map(|(p, c)| (p.split(';').map(str::to_string).collect(), *c))
            .collect()
    }

    #[test]
    fn excluded_routines_and_deep_levels_fold_into_their_callers() {
        let folded = stacks(&[
            ("init;a", 5),
            ("init;a;__fentry__", 1),
            ("init;a;b", 3),
            ("init;a;b;c", 2),
            ("init;d;b", 7),
        ]);
        let hooks = StackFilter {
            exclude: RoutineFilter::new(&[], true).unwrap(),
            ..Default::default()
        };
        assert_eq!(
            filter_stacks(&folded, &hooks),
            stacks(&[
                ("init;a", 6),
                ("init;a;b", 3),
                ("init;a;b;c", 2),
                ("init;d;b", 7)
            ])
        );
        let no_b = StackFilter {
            exclude: RoutineFilter::new(&["b".into()], false).unwrap(),
            ..Default::default()
        };
        assert_eq!(
            filter_stacks(&folded, &no_b),
            stacks(&[("init;a", 10), ("init;a;__fentry__", 1), ("init;d", 7)])
        );
        let shallow = StackFilter {
            depth: Some(1),
            ..Default::default()
        };
        assert_eq!(
            filter_stacks(&folded, &shallow),
            stacks(&[("init;a", 11), ("init;d", 7)])
        );
        let only_c = StackFilter {
            function: Some("c".into()),
            ..Default::default()
        };
        assert_eq!(
            filter_stacks(&folded, &only_c),
            stacks(&[("init;a;b;c", 2)])
        );
        // Every step is still counted once.
        let total = |f: &[(Vec<String>, u64)]| f.iter().map(|s| s.1).sum::<u64>();
        assert_eq!(total(&filter_stacks(&folded, &no_b)), total(&folded));
    }
}
