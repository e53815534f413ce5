//! Two traces side by side: steps per routine (self and total), routines
//! only one of them ran, the instruction mix and interrupts, from each
//! trace's [`Stats`]; and a differential flame graph (inferno's), red
//! where the second trace spent more steps.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;

use serde::Serialize;

use crate::error::{AnalyzeError, Result};
use crate::naming::percent;
use crate::stats::{Count, Stats};

/// One trace of the two.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    /// The trace file, as given.
    pub trace: String,
    /// Steps its statistics counted.
    pub steps: u64,
}

/// A routine's steps in both traces (0 where it did not run).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct RoutineDiff {
    /// The routine's name (routines of one name add up).
    pub name: String,
    /// Self steps in A.
    pub self_a: u64,
    /// Self steps in B.
    pub self_b: u64,
    /// `self_b - self_a`.
    pub self_delta: i128,
    /// Total steps (with callees and interrupts) in A.
    pub total_a: u64,
    /// Total steps in B.
    pub total_b: u64,
    /// `total_b - total_a`.
    pub total_delta: i128,
    /// Calls in A.
    pub calls_a: u64,
    /// Calls in B.
    pub calls_b: u64,
}

/// A share of all steps in both traces: an instruction class or mnemonic.
#[derive(Clone, Debug, Serialize)]
pub struct ShareDiff {
    /// The class, mnemonic or vector.
    pub name: String,
    /// How many steps (or interrupts) in A.
    pub count_a: u64,
    /// How many in B.
    pub count_b: u64,
    /// Percent of A's steps.
    pub percent_a: f64,
    /// Percent of B's steps.
    pub percent_b: f64,
    /// `percent_b - percent_a`, in percentage points.
    pub points: f64,
}

/// Everything `vtrace analyze diff` reports.
#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    /// The baseline.
    pub a: Side,
    /// The trace compared with it.
    pub b: Side,
    /// Every routine of either trace, by the size of its self-step
    /// change, largest first.
    pub routines: Vec<RoutineDiff>,
    /// Routines with steps in B and none in A.
    pub new: Vec<String>,
    /// Routines with steps in A and none in B.
    pub vanished: Vec<String>,
    /// Instruction classes.
    pub classes: Vec<ShareDiff>,
    /// Mnemonics.
    pub mnemonics: Vec<ShareDiff>,
    /// Interrupts and exceptions by vector name.
    pub interrupts: Vec<ShareDiff>,
}

fn delta(a: u64, b: u64) -> i128 {
    i128::from(b) - i128::from(a)
}

/// Adds up a routine table by name: a program's routines share names
/// across the address spaces it ran in.
fn routines_by_name(s: &Stats) -> BTreeMap<String, (u64, u64, u64)> {
    let mut m: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for r in &s.routines {
        let e = m.entry(r.name.clone()).or_default();
        e.0 = e.0.saturating_add(r.self_steps);
        e.1 = e.1.saturating_add(r.total_steps);
        e.2 = e.2.saturating_add(r.calls);
    }
    m
}

fn shares(a: &[Count], steps_a: u64, b: &[Count], steps_b: u64) -> Vec<ShareDiff> {
    let mut both: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for c in a {
        both.entry(&c.name).or_default().0 += c.count;
    }
    for c in b {
        both.entry(&c.name).or_default().1 += c.count;
    }
    let mut out: Vec<ShareDiff> = both
        .into_iter()
        .map(|(name, (count_a, count_b))| {
            let (percent_a, percent_b) = (percent(count_a, steps_a), percent(count_b, steps_b));
            ShareDiff {
                name: name.to_string(),
                count_a,
                count_b,
                percent_a,
                percent_b,
                points: percent_b - percent_a,
            }
        })
        .collect();
    out.sort_by(|x, y| {
        y.points
            .abs()
            .total_cmp(&x.points.abs())
            .then_with(|| x.name.cmp(&y.name))
    });
    out
}

/// Compares the statistics of trace A (`a`, read from `path_a`) with
/// those of trace B.
pub fn compare(path_a: &str, a: &Stats, path_b: &str, b: &Stats) -> Diff {
    let (ra, rb) = (routines_by_name(a), routines_by_name(b));
    let mut names: Vec<&String> = ra.keys().chain(rb.keys()).collect();
    names.sort();
    names.dedup();
    let mut routines: Vec<RoutineDiff> = names
        .into_iter()
        .map(|name| {
            let (sa, ta, ca) = ra.get(name).copied().unwrap_or_default();
            let (sb, tb, cb) = rb.get(name).copied().unwrap_or_default();
            RoutineDiff {
                name: name.clone(),
                self_a: sa,
                self_b: sb,
                self_delta: delta(sa, sb),
                total_a: ta,
                total_b: tb,
                total_delta: delta(ta, tb),
                calls_a: ca,
                calls_b: cb,
            }
        })
        .collect();
    routines.sort_by(|x, y| {
        y.self_delta
            .abs()
            .cmp(&x.self_delta.abs())
            .then_with(|| y.total_delta.abs().cmp(&x.total_delta.abs()))
            .then_with(|| x.name.cmp(&y.name))
    });
    let ran = |r: &RoutineDiff, in_a: bool| {
        if in_a {
            r.self_a > 0 || r.calls_a > 0
        } else {
            r.self_b > 0 || r.calls_b > 0
        }
    };
    let new = routines
        .iter()
        .filter(|r| ran(r, false) && !ran(r, true))
        .map(|r| r.name.clone())
        .collect();
    let vanished = routines
        .iter()
        .filter(|r| ran(r, true) && !ran(r, false))
        .map(|r| r.name.clone())
        .collect();
    let vectors = |s: &Stats| -> Vec<Count> {
        s.interrupts
            .iter()
            .map(|v| Count {
                name: format!("{} ({})", v.vector, v.name),
                count: v.count,
            })
            .collect()
    };
    Diff {
        a: Side {
            trace: path_a.to_string(),
            steps: a.steps,
        },
        b: Side {
            trace: path_b.to_string(),
            steps: b.steps,
        },
        routines,
        new,
        vanished,
        classes: shares(&a.classes, a.steps, &b.classes, b.steps),
        mnemonics: shares(&a.mnemonics, a.steps, &b.mnemonics, b.steps),
        interrupts: shares(&vectors(a), a.steps, &vectors(b), b.steps),
    }
}

fn signed(d: i128) -> String {
    if d > 0 {
        format!("+{d}")
    } else {
        d.to_string()
    }
}

fn share_table(out: &mut String, title: &str, rows: &[ShareDiff], top: usize) {
    let _ = writeln!(
        out,
        "\n{title} (share of steps; by change)\n  {:>12} {:>12} {:>8} {:>8} {:>8}  name",
        "A", "B", "A %", "B %", "points"
    );
    for r in rows.iter().take(top) {
        let _ = writeln!(
            out,
            "  {:>12} {:>12} {:>8.2} {:>8.2} {:>+8.2}  {}",
            r.count_a, r.count_b, r.percent_a, r.percent_b, r.points, r.name
        );
    }
    if rows.len() > top {
        let _ = writeln!(out, "  ... {} more (--top, or --json)", rows.len() - top);
    }
}

fn name_list(out: &mut String, title: &str, names: &[String], top: usize) {
    let _ = write!(out, "\n{title}: {}", names.len());
    if !names.is_empty() {
        let shown: Vec<&str> = names.iter().take(top).map(String::as_str).collect();
        let _ = write!(out, ": {}", shown.join(", "));
        if names.len() > top {
            let _ = write!(out, ", ... {} more", names.len() - top);
        }
    }
    out.push('\n');
}

impl Diff {
    /// The text report, `top` rows a table.
    pub fn to_text(&self, top: usize) -> String {
        let mut out = String::new();
        let d = delta(self.a.steps, self.b.steps);
        let _ = writeln!(out, "A: {} ({} steps)", self.a.trace, self.a.steps);
        let _ = writeln!(out, "B: {} ({} steps)", self.b.trace, self.b.steps);
        let _ = writeln!(
            out,
            "B - A: {} steps ({:+.2}%)",
            signed(d),
            100.0 * d as f64 / self.a.steps.max(1) as f64
        );
        let _ = writeln!(
            out,
            "\nroutines by change in self steps\n  {:>12} {:>12} {:>12} {:>12} {:>12}  name",
            "self A", "self B", "self B-A", "total B-A", "calls B-A"
        );
        for r in self.routines.iter().take(top) {
            let _ = writeln!(
                out,
                "  {:>12} {:>12} {:>12} {:>12} {:>12}  {}",
                r.self_a,
                r.self_b,
                signed(r.self_delta),
                signed(r.total_delta),
                signed(delta(r.calls_a, r.calls_b)),
                r.name
            );
        }
        if self.routines.len() > top {
            let _ = writeln!(
                out,
                "  ... {} more (--top, or --json)",
                self.routines.len() - top
            );
        }
        name_list(&mut out, "only in B (new)", &self.new, top);
        name_list(&mut out, "only in A (vanished)", &self.vanished, top);
        share_table(&mut out, "instruction classes", &self.classes, top);
        share_table(&mut out, "mnemonics", &self.mnemonics, top);
        let _ = writeln!(
            out,
            "\ninterrupts and exceptions\n  {:>12} {:>12} {:>12}  vector",
            "A", "B", "B-A"
        );
        for r in self.interrupts.iter().take(top) {
            let _ = writeln!(
                out,
                "  {:>12} {:>12} {:>12}  {}",
                r.count_a,
                r.count_b,
                signed(delta(r.count_a, r.count_b)),
                r.name
            );
        }
        out
    }
}

/// Writes a differential flame graph: B's call stacks, widths in B's
/// steps, each frame red where B spent more self steps there than A and
/// blue where fewer (inferno's differential mode; `normalize` scales A to
/// B's total first, to compare shares rather than counts).
pub fn write_flame(
    a: &[(Vec<String>, u64)],
    b: &[(Vec<String>, u64)],
    title: &str,
    normalize: bool,
    out: &mut impl Write,
) -> Result<()> {
    // Address spaces are page-table addresses, which differ between
    // runs: the stacks are compared from their first routine. Tasks'
    // names stay.
    let unrooted = |folded: &[(Vec<String>, u64)]| -> Vec<(Vec<String>, u64)> {
        folded
            .iter()
            .map(|(path, n)| {
                let skip = path
                    .first()
                    .is_some_and(|r| r.starts_with(crate::naming::SPACE_ROOT));
                (path[usize::from(skip)..].to_vec(), *n)
            })
            .collect()
    };
    let text =
        |folded: &[(Vec<String>, u64)]| crate::flame::folded_lines(&unrooted(folded)).join("\n");
    let (before, after) = (text(a), text(b));
    let mut lines = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options {
            normalize,
            strip_hex: false,
        },
        before.as_bytes(),
        after.as_bytes(),
        &mut lines,
    )
    .map_err(AnalyzeError::Flame)?;
    let lines = String::from_utf8_lossy(&lines);
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = "steps".to_string();
    inferno::flamegraph::from_lines(&mut options, lines.lines(), out).map_err(AnalyzeError::Flame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::RoutineCount;

    fn stats(steps: u64, routines: &[(&str, u64, u64, u64)]) -> Stats {
        Stats {
            steps,
            routines: routines
                .iter()
                .map(|(n, s, t, c)| RoutineCount {
                    name: n.to_string(),
                    self_steps: *s,
                    total_steps: *t,
                    calls: *c,
                })
                .collect(),
            mnemonics: vec![Count {
                name: "mov".into(),
                count: steps / 2,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn routines_are_matched_by_name_and_sorted_by_change() {
        let a = stats(100, &[("main", 60, 100, 1), ("old", 40, 40, 2)]);
        let b = stats(
            200,
            &[
                ("main", 50, 200, 1),
                ("new", 140, 140, 3),
                ("new", 10, 10, 1),
            ],
        );
        let d = compare("a.vtd", &a, "b.vtd", &b);
        let names: Vec<&str> = d.routines.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["new", "old", "main"]);
        assert_eq!(d.routines[0].self_b, 150, "same names add up");
        assert_eq!(d.routines[0].self_delta, 150);
        assert_eq!(d.routines[1].self_delta, -40);
        assert_eq!(d.routines[2].total_delta, 100);
        assert_eq!(d.new, ["new"]);
        assert_eq!(d.vanished, ["old"]);
        // mov is half of both: no change in share.
        assert_eq!(d.mnemonics[0].points, 0.0);
        let text = d.to_text(10);
        assert!(text.contains("B - A: +100 steps (+100.00%)"), "{text}");
        assert!(text.contains("only in B (new): 1: new"), "{text}");
    }
}
