//! The nest diagram's filters (`--exclude`, `--min-steps`, `--min-time`)
//! checked against the unfiltered diagram of the same trace, and
//! `--retval` against the listing's registers.

mod common;

use std::collections::HashSet;

use common::{demo_trace, kvm_available, run, stderr, stdout};

/// One routine line of a nest diagram.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Call {
    step: u64,
    /// Total and self steps, where the line has them.
    counts: Option<(u64, u64)>,
    /// Call level within its block (indentation / 2).
    level: usize,
    /// The routine column, trimmed.
    body: String,
}

impl Call {
    /// The routine the line names (`name();`, `name() {`, `} /* name */`).
    fn name(&self) -> &str {
        let body = self.body.trim_start_matches("} /* ");
        body.split(['(', ' ', ',']).next().unwrap_or(body)
    }

    fn is_close(&self) -> bool {
        self.body.starts_with('}')
    }
}

/// Body column of a line of the demo's diagram: after the step, the two
/// counts and the duration (the demo's clock is per step).
const BODY: usize = 2 + 10 + 1 + 10 + 1 + 8 + 15 + 2;

fn nest(extra: &[&str]) -> Vec<Call> {
    let mut args = vec!["analyze", "nest", demo_trace().to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = run(&args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    let mut calls = Vec::new();
    for line in stdout(&out).lines().filter(|l| !l.starts_with('#')) {
        let body = &line[BODY.min(line.len())..];
        let cols: Vec<&str> = line.split_whitespace().collect();
        // Big-level lines, divided-level marks and notes name no call.
        let text = body.trim();
        if text.starts_with("==>") || text.starts_with("##") || text.starts_with("/*") {
            continue;
        }
        let counts = match (
            cols.get(1).and_then(|t| t.parse().ok()),
            cols.get(2).and_then(|s| s.parse().ok()),
        ) {
            (Some(t), Some(s)) => Some((t, s)),
            _ => None,
        };
        calls.push(Call {
            step: cols[0].parse().unwrap(),
            counts,
            level: (body.len() - body.trim_start().len()) / 2,
            body: body.trim().to_string(),
        });
    }
    calls
}

/// An entry line's step, counts and routine.
type Entry = (u64, Option<(u64, u64)>, String);

/// The entry lines: what a filter keeps or drops, whatever form (leaf or
/// open) the line takes.
fn entries(calls: &[Call]) -> HashSet<Entry> {
    calls
        .iter()
        .filter(|c| !c.is_close())
        .map(|c| (c.step, c.counts, c.name().to_string()))
        .collect()
}

#[test]
fn exclude_drops_the_routine_and_what_it_calls_and_nothing_else() {
    if !kvm_available() {
        return;
    }
    let all = nest(&[]);
    let filtered = nest(&["--exclude", "vfmt", "--exclude", "serial_w*"]);
    let excluded = |name: &str| name == "vfmt" || name.starts_with("serial_w");
    assert!(
        all.iter().any(|c| c.name() == "vfmt"),
        "the demo prints: {all:?}"
    );
    assert!(!filtered.iter().any(|c| excluded(c.name())), "{filtered:?}");
    // Every line left is the unfiltered diagram's.
    let every = entries(&all);
    let kept = entries(&filtered);
    assert!(
        kept.is_subset(&every),
        "{:?}",
        kept.difference(&every).collect::<Vec<_>>()
    );
    // What the excluded calls ran (leaves of known length, and calls
    // closed in the same block) is all that went, with them.
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for c in all.iter().filter(|c| excluded(c.name()) && !c.is_close()) {
        if let Some((total, _)) = c.counts {
            spans.push((c.step, c.step + total));
        }
    }
    let inside = |step: u64| spans.iter().any(|(a, b)| (*a..*b).contains(&step));
    for e in every.difference(&kept) {
        assert!(
            excluded(&e.2) || inside(e.0),
            "{e:?} went, and is in no excluded call"
        );
    }
    // kprintf, which calls them, is still there every time, with its
    // counts (its steps include theirs).
    let kprintf = |calls: &[Call]| {
        calls
            .iter()
            .filter(|c| c.name() == "kprintf" && !c.is_close())
            .count()
    };
    assert_eq!(kprintf(&filtered), kprintf(&all));
    assert!(kprintf(&all) >= 5, "{all:?}");
}

#[test]
fn min_steps_keeps_exactly_the_calls_that_long() {
    if !kvm_available() {
        return;
    }
    let all = nest(&[]);
    let min = 300;
    let filtered = nest(&["--min-steps", &min.to_string()]);
    let expected: HashSet<_> = entries(&all)
        .into_iter()
        .filter(|(_, counts, _)| counts.is_none_or(|(total, _)| total >= min))
        .collect();
    assert_eq!(entries(&filtered), expected);
    // Shorter calls were there to drop.
    assert!(entries(&filtered).len() + 50 < entries(&all).len());
    // The same threshold in virtual time: the demo's clock is 1 ns a step.
    assert_eq!(entries(&nest(&["--min-time", "300ns"])), expected);
}

/// `--retval` shows RAX after each `ret`: a leaf's value is the last RAX
/// the listing shows being written inside the call.
#[test]
fn retval_is_rax_as_the_listing_last_wrote_it() {
    if !kvm_available() {
        return;
    }
    let calls = nest(&["--retval"]);
    let trace = demo_trace().to_str().unwrap();
    let mut checked = 0;
    for c in calls
        .iter()
        .filter(|c| c.body.contains("(); /* = "))
        .take(40)
    {
        let (total, own) = c.counts.unwrap();
        if total != own {
            continue;
        }
        let value = c
            .body
            .rsplit("/* = ")
            .next()
            .unwrap()
            .trim_end_matches(" */");
        let from = c.step.to_string();
        let count = total.to_string();
        let listing = run(&[
            "analyze", "listing", trace, "--from", &from, "--count", &count,
        ]);
        let text = stdout(&listing);
        let last = text
            .lines()
            .rev()
            .find_map(|l| l.split(" rax=").nth(1))
            .map(|v| v.split_whitespace().next().unwrap().to_string());
        let Some(last) = last else { continue };
        let expected = u64::from_str_radix(last.trim_start_matches("0x"), 16).unwrap();
        let shown = match value.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
            None => value.parse::<i64>().unwrap() as u64,
        };
        assert_eq!(shown, expected, "{c:?}\n{text}");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} leaves checked");
}

/// Folded stacks of the demo trace with `extra` options: (stack, steps).
fn folded(extra: &[&str]) -> Vec<(String, u64)> {
    let mut args = vec![
        "analyze",
        "flame",
        demo_trace().to_str().unwrap(),
        "--folded",
        "-o",
        "-",
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| {
            let (stack, steps) = l.rsplit_once(' ').unwrap();
            (stack.to_string(), steps.parse().unwrap())
        })
        .collect()
}

/// The flame graph takes the same filters: an excluded routine's steps
/// go to its caller, a depth limit folds deeper steps into the last level
/// kept, and every step is still counted once.
#[test]
fn flame_folds_excluded_and_deep_calls_into_their_callers() {
    if !kvm_available() {
        return;
    }
    let all = folded(&[]);
    let total = |f: &[(String, u64)]| f.iter().map(|s| s.1).sum::<u64>();
    let no_vfmt = folded(&["--exclude", "vfmt"]);
    assert!(all.iter().any(|(s, _)| s.contains(";vfmt")));
    assert!(
        !no_vfmt.iter().any(|(s, _)| s.contains(";vfmt")),
        "{no_vfmt:?}"
    );
    assert_eq!(total(&no_vfmt), total(&all));
    // kprintf's own steps there are its self steps and all of vfmt's.
    let at = |f: &[(String, u64)], suffix: &str| -> u64 {
        f.iter()
            .filter(|(s, _)| s.ends_with(suffix))
            .map(|s| s.1)
            .sum()
    };
    let under = |f: &[(String, u64)], part: &str| -> u64 {
        f.iter()
            .filter(|(s, _)| s.contains(part))
            .map(|s| s.1)
            .sum()
    };
    assert_eq!(
        at(&no_vfmt, ";kprintf"),
        at(&all, ";kprintf") + under(&all, ";kprintf;vfmt")
    );
    let shallow = folded(&["--depth", "1"]);
    assert!(
        shallow.iter().all(|(s, _)| s.matches(';').count() <= 1),
        "{shallow:?}"
    );
    assert_eq!(total(&shallow), total(&all));
}

#[test]
fn the_report_takes_the_same_filters() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("r.html");
    let trace = demo_trace().to_str().unwrap();
    let out = run(&[
        "analyze",
        "report",
        trace,
        "-o",
        page.to_str().unwrap(),
        "--exclude",
        "vfmt",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let html = std::fs::read_to_string(&page).unwrap();
    // Its nest diagram and flame graph leave vfmt out; its tables (every
    // routine's steps) still name it.
    let (before, nest) = html.split_once("<section id=\"nest\">").unwrap();
    let nest = nest.split("</section>").next().unwrap();
    assert!(nest.contains("kprintf() {"), "{nest}");
    assert!(!nest.contains("vfmt"), "{nest}");
    assert!(before.contains("vfmt"), "the routine table names it");
}
