//! One self-contained HTML page for people: a summary of what ran and
//! where the steps went, bar charts (routines, address spaces or
//! processes, instruction classes), the flame graph, the routine,
//! interrupt and system-call tables, the instruction mix, a navigable
//! nest diagram (a level per big level, expand and collapse all, search)
//! and a listing window of each busiest routine's first call, linked
//! from its rows. Nothing is loaded from the network: the charts are SVG
//! drawn here, the script and style are inline.
//!
//! The page is `page.html`, a minijinja template (auto-escaped); this
//! module gathers what it shows.

mod charts;

use std::io::Write;

use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::error::{AnalyzeError, Result};
use crate::input::{no_progress, Progress, Trace};
use crate::levels::{FrameView, LevelSink};
use crate::listing::{self, ListingOptions};
use crate::naming::percent;
use crate::nest::NestOptions;
use crate::stats::{collect, Count, Stats};
use charts::{bar_chart, thousands, Bar};
use vtrace_image::symbols::{FuncId, Symbolizer, UNKNOWN_FUNC};

/// Routines whose first call gets a listing window in the page.
const LISTED_ROUTINES: usize = 10;
/// Steps in each listing window.
const WINDOW_STEPS: u64 = 40;
/// Rows of the bar charts.
const CHART_BARS: usize = 15;
/// The flame graph's width in pixels: the page's, less its margins.
const FLAME_WIDTH: usize = 1280;

/// Keeps the first `limit` lines written to it and counts the rest.
struct Capped {
    text: Vec<u8>,
    lines: usize,
    limit: usize,
    dropped: usize,
}

impl Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for line in buf.split_inclusive(|b| *b == b'\n') {
            if self.lines < self.limit {
                self.text.extend_from_slice(line);
            } else {
                self.dropped += 1;
            }
            if line.ends_with(b"\n") {
                self.lines += 1;
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The step each routine was first entered at.
#[derive(Default)]
struct FirstEntries(FxHashMap<FuncId, u64>);

impl LevelSink for FirstEntries {
    fn enter(&mut self, frame: &FrameView) {
        self.0.entry(frame.func).or_insert(frame.entry_step);
    }
}

#[derive(Serialize)]
struct Fact {
    name: &'static str,
    value: String,
}

#[derive(Serialize)]
struct Share {
    name: String,
    count: u64,
    percent: f64,
    /// Anchor of the routine's listing window, where the page has one.
    listing: Option<String>,
}

#[derive(Serialize)]
struct RoutineRow {
    name: String,
    self_steps: u64,
    percent: f64,
    total_steps: u64,
    calls: u64,
    listing: Option<String>,
}

#[derive(Serialize)]
struct VectorRow {
    vector: u8,
    name: String,
    count: u64,
}

#[derive(Serialize)]
struct Chart {
    title: String,
    svg: String,
}

#[derive(Serialize)]
struct Level {
    summary: String,
    /// What began it (interrupt, return, switch, ...), for styling.
    kind: &'static str,
    lines: usize,
    text: String,
}

#[derive(Serialize)]
struct Window {
    id: String,
    routine: String,
    step: u64,
    command: String,
    text: String,
}

#[derive(Serialize)]
struct Page {
    title: String,
    facts: Vec<Fact>,
    problems: Vec<String>,
    went: Vec<Share>,
    charts: Vec<Chart>,
    flame: String,
    flame_height: u64,
    routines: Vec<RoutineRow>,
    routines_more: usize,
    interrupts: Vec<VectorRow>,
    tasks_named: bool,
    syscalls: Vec<Share>,
    classes: Vec<Share>,
    mnemonics: Vec<Share>,
    addressing: Vec<Share>,
    locality: String,
    disabled: String,
    nest_legend: String,
    levels: Vec<Level>,
    nest_dropped: usize,
    listings: Vec<Window>,
}

fn shares(rows: &[Count], total: u64, top: usize) -> Vec<Share> {
    rows.iter()
        .take(top)
        .map(|r| Share {
            name: r.name.clone(),
            count: r.count,
            percent: percent(r.count, total),
            listing: None,
        })
        .collect()
}

/// The nest text as levels: its legend, and a level per `==>` line.
fn levels(text: &str) -> (String, Vec<Level>) {
    let mut legend = String::new();
    let mut out: Vec<Level> = Vec::new();
    for line in text.lines() {
        if let Some(cpu) = line.strip_prefix("# CPU ") {
            out.push(Level {
                summary: format!("CPU {cpu}"),
                kind: "cpu",
                lines: 0,
                text: String::new(),
            });
        } else if line.starts_with('#') {
            legend.push_str(line);
            legend.push('\n');
        } else if let Some(at) = line.find("==> ") {
            let summary = line[at + 4..].to_string();
            let kind = match summary.split_whitespace().next().unwrap_or_default() {
                "interrupt:" => "interrupt",
                "return" => "return",
                "system" => "syscall",
                "switch" | "address" => "switch",
                _ => "other",
            };
            out.push(Level {
                summary: format!("{} {summary}", line[..at].trim()),
                kind,
                lines: 0,
                text: String::new(),
            });
        } else {
            if out.is_empty() {
                out.push(Level {
                    summary: "start".into(),
                    kind: "other",
                    lines: 0,
                    text: String::new(),
                });
            }
            if let Some(level) = out.last_mut() {
                level.text.push_str(line);
                level.text.push('\n');
                level.lines += 1;
            }
        }
    }
    (legend, out)
}

fn routine_bars(stats: &Stats, anchors: &FxHashMap<String, String>) -> Vec<Bar> {
    stats
        .routines
        .iter()
        .take(CHART_BARS)
        .map(|r| Bar {
            label: r.name.clone(),
            value: r.self_steps,
            link: anchors.get(&r.name).map(|a| format!("#{a}")),
        })
        .collect()
}

/// Steps per process where the trace names tasks, else per address space.
fn place_bars(
    trace: &Trace,
    progress: Progress<'_>,
    symbols: &Symbolizer,
) -> Result<(String, Vec<Bar>)> {
    if trace.metadata.names_tasks() {
        let table = crate::processes::collect(trace, progress)?;
        let mut by: FxHashMap<String, u64> = FxHashMap::default();
        for p in &table.processes {
            let name = match p.pid {
                Some(pid) => format!("{}-{pid}", p.comm),
                None => "(no task named)".into(),
            };
            *by.entry(name).or_default() += p.user_steps + p.kernel_steps;
        }
        let mut bars: Vec<Bar> = by
            .into_iter()
            .map(|(label, value)| Bar {
                label,
                value,
                link: None,
            })
            .collect();
        bars.sort_by(|a, b| b.value.cmp(&a.value).then(a.label.cmp(&b.label)));
        bars.truncate(CHART_BARS);
        return Ok(("Steps by process".into(), bars));
    }
    let table = crate::spaces::collect(trace, symbols, progress)?;
    let mut bars: Vec<Bar> = table
        .spaces
        .iter()
        .map(|s| Bar {
            label: format!(
                "{:#x}{}",
                s.cr3,
                s.routines
                    .first()
                    .map(|r| format!(" ({})", r.name))
                    .unwrap_or_default()
            ),
            value: s.steps,
            link: None,
        })
        .collect();
    bars.sort_by(|a, b| b.value.cmp(&a.value).then(a.label.cmp(&b.label)));
    bars.truncate(CHART_BARS);
    Ok(("Steps by address space (its busiest routine)".into(), bars))
}

/// System calls by name over all tasks, where the trace names them.
fn syscalls(trace: &Trace) -> Result<Vec<Share>> {
    if !trace.metadata.names_tasks() {
        return Ok(Vec::new());
    }
    let table = crate::processes::collect(trace, &no_progress)?;
    let mut by: FxHashMap<String, u64> = FxHashMap::default();
    for p in &table.processes {
        for (name, count) in &p.system_calls {
            *by.entry(name.clone()).or_default() += count;
        }
    }
    let total: u64 = by.values().sum();
    let mut rows: Vec<Share> = by
        .into_iter()
        .map(|(name, count)| Share {
            name,
            count,
            percent: percent(count, total),
            listing: None,
        })
        .collect();
    rows.sort_by(|a, b| b.count.cmp(&a.count).then(a.name.cmp(&b.name)));
    Ok(rows)
}

/// The height an SVG document asks for (its root element's `height`).
fn svg_height(svg: &str) -> u64 {
    svg.find("<svg")
        .and_then(|at| {
            let tag = &svg[at..at + svg[at..].find('>')?];
            let value = tag.split("height=\"").nth(1)?;
            value[..value.find('"')?].parse().ok()
        })
        .unwrap_or(600)
}

/// A virtual duration for people.
fn duration(ns: u64) -> String {
    match ns {
        n if n >= 1_000_000_000 => format!("{:.3} s", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.3} ms", n as f64 / 1e6),
        n => format!("{:.3} µs", n as f64 / 1e3),
    }
}

/// The page's template, with its `num` filter (`1,234,567`) and
/// auto-escaping.
fn environment() -> Result<minijinja::Environment<'static>> {
    let mut env = minijinja::Environment::new();
    env.add_filter("num", |n: u64| thousands(n));
    env.add_filter("pct", |p: f64| format!("{p:.2}"));
    env.add_template("page.html", include_str!("page.html"))
        .map_err(AnalyzeError::Report)?;
    Ok(env)
}

/// Writes the report. Reads the trace a few times (statistics, places,
/// the nest diagram, a listing window per busiest routine);
/// `nest_lines` caps the diagram's lines in the page, and `calls` says
/// which calls the diagram and the flame graph show (its `ns_per_step` is
/// the trace's).
pub fn write(
    trace: &Trace,
    symbols: &Symbolizer,
    nest_lines: usize,
    calls: &NestOptions,
    out: &mut impl Write,
    progress: Progress<'_>,
) -> Result<()> {
    let stats = collect(
        trace,
        symbols,
        &crate::tasks::TaskFilter::default(),
        progress,
    )?;
    let stacks = crate::flame::StackFilter {
        exclude: calls.exclude.clone(),
        depth: calls.depth,
        function: calls.function.clone(),
    };
    let (flame, flame_height) = flame_document(&stats, &stacks)?;
    let nest = nest_part(trace, symbols, nest_lines, calls, progress)?;
    let (listings, anchors) = listing_windows(trace, symbols, &stats, &nest.first);
    let charts = charts(trace, symbols, &stats, &anchors)?;
    let facts = facts(trace, &stats, nest.breaks);
    let page = Page {
        title: format!("vtrace report: {}", trace.path().display()),
        facts,
        problems: trace.problems.clone(),
        went: stats
            .routines
            .iter()
            .take(3)
            .map(|r| Share {
                name: r.name.clone(),
                count: r.self_steps,
                percent: percent(r.self_steps, stats.steps),
                listing: anchors.get(&r.name).cloned(),
            })
            .collect(),
        charts,
        flame,
        flame_height,
        routines_more: stats.routines.len().saturating_sub(ROUTINE_ROWS),
        routines: routine_rows(&stats, &anchors),
        interrupts: stats
            .interrupts
            .iter()
            .map(|v| VectorRow {
                vector: v.vector,
                name: v.name.clone(),
                count: v.count,
            })
            .collect(),
        tasks_named: trace.metadata.names_tasks(),
        syscalls: syscalls(trace)?,
        classes: shares(&stats.classes, stats.steps, 20),
        mnemonics: shares(&stats.mnemonics, stats.steps, 30),
        addressing: shares(
            &stats.addressing_modes,
            stats.addressing_modes.iter().map(|c| c.count).sum(),
            20,
        ),
        locality: locality_line(&stats),
        disabled: disabled_line(&stats),
        nest_legend: nest.legend,
        levels: nest.levels,
        nest_dropped: nest.dropped,
        listings,
    };
    let env = environment()?;
    let html = env
        .get_template("page.html")
        .and_then(|t| t.render(&page))
        .map_err(AnalyzeError::Report)?;
    out.write_all(html.as_bytes())?;
    Ok(())
}

/// Rows of the routine table.
const ROUTINE_ROWS: usize = 60;

/// The flame graph as a document of its own (it goes in an iframe:
/// inferno's script finds "the" SVG as the first in its document, which in
/// the page would be a chart), and its height.
fn flame_document(stats: &Stats, filter: &crate::flame::StackFilter) -> Result<(String, u64)> {
    let mut svg = Vec::new();
    crate::flame::write_svg_with(
        &crate::flame::filter_stacks(&stats.folded, filter),
        "steps by call stack",
        "steps",
        Some(FLAME_WIDTH),
        &mut svg,
    )?;
    let flame = String::from_utf8_lossy(&svg).into_owned();
    let height = svg_height(&flame).saturating_add(12);
    Ok((flame, height))
}

/// What the report takes of the nest diagram.
struct NestPart {
    /// The diagram's legend.
    legend: String,
    /// Its big levels, for folding in the page.
    levels: Vec<Level>,
    /// Lines past the cap, left out.
    dropped: usize,
    /// Each routine's first entry step.
    first: FxHashMap<FuncId, u64>,
    /// Breaks (steps missing) the level engine saw.
    breaks: u64,
}

/// Runs the nest diagram, capped at `nest_lines` lines, noting where each
/// routine was first entered.
fn nest_part(
    trace: &Trace,
    symbols: &Symbolizer,
    nest_lines: usize,
    calls: &NestOptions,
    progress: Progress<'_>,
) -> Result<NestPart> {
    let mut capped = Capped {
        text: Vec::new(),
        lines: 0,
        limit: nest_lines,
        dropped: 0,
    };
    let options = NestOptions {
        ns_per_step: trace.metadata.ns_per_step(),
        ..calls.clone()
    };
    let (totals, _, first) = crate::nest::NestDiagram::new(trace, symbols)
        .options(options)
        .progress(progress)
        .write_beside(&mut capped, FirstEntries::default())?;
    // Each routine's first entry on any CPU.
    let first = first.0;
    let text = String::from_utf8_lossy(&capped.text).into_owned();
    let (legend, levels) = levels(&text);
    Ok(NestPart {
        legend,
        levels,
        dropped: capped.dropped,
        first,
        breaks: totals.counts.breaks,
    })
}

/// A listing window at each busiest routine's first call, and the anchor
/// of each routine that has one.
fn listing_windows(
    trace: &Trace,
    symbols: &Symbolizer,
    stats: &Stats,
    first: &FxHashMap<FuncId, u64>,
) -> (Vec<Window>, FxHashMap<String, String>) {
    let by_name: FxHashMap<&str, FuncId> = first
        .keys()
        .filter(|f| **f != UNKNOWN_FUNC)
        .map(|f| (symbols.name(*f), *f))
        .collect();
    let mut listings = Vec::new();
    let mut anchors: FxHashMap<String, String> = FxHashMap::default();
    let trace_name = trace.path().display().to_string();
    for (i, r) in stats.routines.iter().take(LISTED_ROUTINES).enumerate() {
        let Some(step) = by_name.get(r.name.as_str()).and_then(|f| first.get(f)) else {
            continue;
        };
        let options = ListingOptions {
            from: Some(*step),
            count: Some(WINDOW_STEPS),
            lines: true,
            task_columns: trace.metadata.names_tasks(),
            ..ListingOptions::default()
        };
        let mut text = Vec::new();
        if listing::write(trace, symbols, &options, &mut text, &no_progress).is_err() {
            continue;
        }
        let id = format!("listing-{i}");
        anchors.insert(r.name.clone(), id.clone());
        listings.push(Window {
            id,
            routine: r.name.clone(),
            step: *step,
            command: format!(
                "vtrace analyze listing {trace_name} --from {step} --count {WINDOW_STEPS}"
            ),
            text: String::from_utf8_lossy(&text).into_owned(),
        });
    }
    (listings, anchors)
}

/// The bar charts: steps by routine, by place, by instruction class.
fn charts(
    trace: &Trace,
    symbols: &Symbolizer,
    stats: &Stats,
    anchors: &FxHashMap<String, String>,
) -> Result<Vec<Chart>> {
    let (place_title, place) = place_bars(trace, &no_progress, symbols)?;
    let class_bars: Vec<Bar> = stats
        .classes
        .iter()
        .map(|c| Bar {
            label: c.name.clone(),
            value: c.count,
            link: None,
        })
        .collect();
    Ok(vec![
        Chart {
            title: "Steps by routine (self)".into(),
            svg: bar_chart(
                "steps by routine",
                &routine_bars(stats, anchors),
                stats.steps,
            ),
        },
        Chart {
            svg: bar_chart(&place_title, &place, stats.steps),
            title: place_title,
        },
        Chart {
            title: "Steps by instruction class".into(),
            svg: bar_chart("steps by instruction class", &class_bars, stats.steps),
        },
    ])
}

/// The facts at the top of the page: what was traced, and its counts.
fn facts(trace: &Trace, stats: &Stats, breaks: u64) -> Vec<Fact> {
    let m = &trace.metadata;
    let mut facts = vec![
        Fact {
            name: "trace",
            value: trace.path().display().to_string(),
        },
        Fact {
            name: "guest",
            value: m.guest.clone(),
        },
    ];
    if let Some(k) = &m.kernel {
        facts.push(Fact {
            name: "kernel",
            value: k.clone(),
        });
    }
    facts.push(Fact {
        name: "steps",
        value: thousands(stats.steps),
    });
    if let Some(cpus) = stats.cpus_added_up {
        facts.push(Fact {
            name: "CPUs",
            value: format!("{cpus}: counts add up every CPU's; the nest diagram has each in turn"),
        });
    }
    if let Some(ns) = m.ns_per_step() {
        facts.push(Fact {
            name: "virtual time traced",
            value: format!(
                "{} ({ns} ns a step)",
                duration(stats.steps.saturating_mul(ns))
            ),
        });
    }
    let interrupts: u64 = stats.interrupts.iter().map(|v| v.count).sum();
    for (name, value) in [
        ("calls", stats.calls),
        ("interrupts and exceptions", interrupts),
        (
            "switches (task or address space)",
            stats.address_space_switches,
        ),
        ("divided levels", stats.divided_levels),
        ("deepest stack", stats.deepest_stack as u64),
        ("breaks (steps missing)", breaks),
    ] {
        facts.push(Fact {
            name,
            value: thousands(value),
        });
    }
    if let Some(v) = &m.vtrace_version {
        facts.push(Fact {
            name: "recorded by",
            value: format!("vtrace {v}"),
        });
    }
    facts
}

/// The routine table's rows, busiest first.
fn routine_rows(stats: &Stats, anchors: &FxHashMap<String, String>) -> Vec<RoutineRow> {
    stats
        .routines
        .iter()
        .take(ROUTINE_ROWS)
        .map(|r| RoutineRow {
            name: r.name.clone(),
            self_steps: r.self_steps,
            percent: percent(r.self_steps, stats.steps),
            total_steps: r.total_steps,
            calls: r.calls,
            listing: anchors.get(&r.name).cloned(),
        })
        .collect()
}

/// The memory locality sentence.
fn locality_line(stats: &Stats) -> String {
    let l = &stats.locality;
    format!(
        "{} memory references, {} distinct 64-byte lines, {} distinct pages; \
         {:.1}% of references go to a line touched before.",
        thousands(l.references),
        thousands(l.distinct_lines),
        thousands(l.distinct_pages),
        100.0 * l.reuse_ratio
    )
}

/// The interrupts-disabled sentence.
fn disabled_line(stats: &Stats) -> String {
    let d = &stats.interrupts_disabled;
    format!(
        "{} steps with interrupts disabled, in {} stretches; the longest is {} steps{}.",
        thousands(d.steps),
        thousands(d.stretches),
        thousands(d.longest),
        d.longest_in
            .as_ref()
            .map(|f| format!(" (in {f})"))
            .unwrap_or_default()
    )
}
