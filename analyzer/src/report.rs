//! One self-contained HTML page: summary, statistics tables, the flame
//! graph (inline SVG) and a collapsible nest diagram, one `<details>` per
//! big level. Nothing is loaded from the network.

use std::fmt::Write as _;
use std::io::Write;

use crate::error::Result;
use crate::input::{Progress, Trace};
use crate::levels::run;
use crate::naming::percent;
use crate::nest::NestWriter;
use crate::stats::{collect, Count, Stats};
use crate::symbols::Symbolizer;

fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

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

fn count_table(out: &mut String, id: &str, title: &str, rows: &[Count], total: u64, top: usize) {
    let _ = write!(
        out,
        "<h3>{}</h3><table id=\"{id}\"><tr><th>count</th><th>%</th><th>name</th></tr>",
        esc(title)
    );
    for r in rows.iter().take(top) {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{:.2}</td><td>{}</td></tr>",
            r.count,
            percent(r.count, total),
            esc(&r.name)
        );
    }
    out.push_str("</table>");
}

fn stats_html(s: &Stats) -> String {
    let mut out = String::from("<section id=\"statistics\"><h2>Statistics</h2>");
    out.push_str(
        "<h3>Routines by self steps</h3><table id=\"routines\"><tr><th>self</th><th>%</th>\
         <th>total</th><th>calls</th><th>routine</th></tr>",
    );
    for r in s.routines.iter().take(40) {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{:.2}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            r.self_steps,
            percent(r.self_steps, s.steps),
            r.total_steps,
            r.calls,
            esc(&r.name)
        );
    }
    out.push_str("</table>");
    count_table(
        &mut out,
        "classes",
        "Instruction classes",
        &s.classes,
        s.steps,
        20,
    );
    count_table(
        &mut out,
        "mnemonics",
        "Mnemonics",
        &s.mnemonics,
        s.steps,
        30,
    );
    let refs = s.addressing_modes.iter().map(|c| c.count).sum();
    count_table(
        &mut out,
        "addressing",
        "Addressing modes",
        &s.addressing_modes,
        refs,
        20,
    );
    out.push_str("<h3>Interrupts and exceptions</h3><table id=\"interrupts\"><tr><th>count</th><th>vector</th><th>name</th></tr>");
    for v in &s.interrupts {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            v.count,
            v.vector,
            esc(&v.name)
        );
    }
    out.push_str("</table>");
    let l = &s.locality;
    let d = &s.interrupts_disabled;
    let _ = write!(
        out,
        "<h3>Memory locality</h3><p>{} references, {} distinct 64-byte lines, {} distinct pages, \
         {:.1}% of references to a line touched before.</p>\
         <h3>Interrupts disabled</h3><p>{} steps in {} stretches; the longest is {} steps{}.</p></section>",
        l.references,
        l.distinct_lines,
        l.distinct_pages,
        100.0 * l.reuse_ratio,
        d.steps,
        d.stretches,
        d.longest,
        d.longest_in
            .as_ref()
            .map(|f| format!(" (in {})", esc(f)))
            .unwrap_or_default()
    );
    out
}

/// The nest diagram as one `<details>` per big level.
fn nest_html(text: &str, dropped: usize) -> String {
    let mut out = String::from("<section id=\"nest\"><h2>Nest diagram</h2>");
    let mut block = String::new();
    let mut summary: Option<String> = None;
    let flush = |out: &mut String, summary: &Option<String>, block: &mut String| {
        if block.is_empty() && summary.is_none() {
            return;
        }
        let _ = write!(
            out,
            "<details class=\"level\"><summary>{}</summary><pre>{}</pre></details>",
            esc(summary.as_deref().unwrap_or("start")),
            esc(block)
        );
        block.clear();
    };
    for line in text.lines() {
        if line.starts_with('#') {
            let _ = write!(out, "<p class=\"legend\">{}</p>", esc(line));
        } else if line.contains("==> ") {
            flush(&mut out, &summary, &mut block);
            summary = Some(line.trim().to_string());
        } else {
            block.push_str(line);
            block.push('\n');
        }
    }
    flush(&mut out, &summary, &mut block);
    if dropped > 0 {
        let _ = write!(
            out,
            "<p class=\"note\">{dropped} more lines are left out; \
             <code>vtrace analyze nest</code> writes them all.</p>"
        );
    }
    out.push_str("</section>");
    out
}

const STYLE: &str =
    "body{font-family:sans-serif;margin:1em 2em}table{border-collapse:collapse;margin-bottom:1em}\
td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td:last-child{text-align:left}\
pre{font-size:12px;margin:0 0 0 1em}details.level summary{font-family:monospace;cursor:pointer}\
#flame svg{width:100%;height:auto}";

/// Writes the report. Reads the trace twice (statistics, then the nest
/// diagram); `nest_lines` caps the diagram's lines in the page.
pub fn write(
    trace: &Trace,
    symbols: &Symbolizer,
    nest_lines: usize,
    out: &mut impl Write,
    progress: Progress<'_>,
) -> Result<()> {
    let stats = collect(
        trace,
        symbols,
        &crate::tasks::TaskFilter::default(),
        progress,
    )?;
    let mut svg = Vec::new();
    crate::flame::write_svg(&stats.folded, "steps by call stack", &mut svg)?;
    let svg = String::from_utf8_lossy(&svg);
    // The SVG's own XML prologue and doctype cannot sit inside HTML.
    let svg = svg.find("<svg").map(|i| &svg[i..]).unwrap_or(&svg);
    let mut capped = Capped {
        text: Vec::new(),
        lines: 0,
        limit: nest_lines,
        dropped: 0,
    };
    let mut nest = NestWriter::new(&mut capped, symbols);
    nest.header("nest diagram");
    run(trace, symbols, &mut nest, progress)?;
    nest.finish()?;
    let nest_text = String::from_utf8_lossy(&capped.text).into_owned();
    let title = format!("vtrace report: {}", trace.path().display());
    let mut summary = format!(
        "<section id=\"summary\"><h2>Summary</h2><table><tr><th>trace</th><td>{}</td></tr>\
         <tr><th>guest</th><td>{}</td></tr><tr><th>steps</th><td>{}</td></tr>\
         <tr><th>calls</th><td>{}</td></tr><tr><th>switches (task or address space)</th><td>{}</td></tr>\
         <tr><th>divided levels</th><td>{}</td></tr><tr><th>deepest stack</th><td>{}</td></tr>",
        esc(&trace.path().display().to_string()),
        esc(&trace.metadata.guest),
        stats.steps,
        stats.calls,
        stats.address_space_switches,
        stats.divided_levels,
        stats.deepest_stack
    );
    for p in &trace.problems {
        let _ = write!(summary, "<tr><th>problem</th><td>{}</td></tr>", esc(p));
    }
    summary.push_str("</table></section>");
    write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\
         <style>{STYLE}</style></head><body><h1>{}</h1>{summary}{}\
         <section id=\"flame\"><h2>Flame graph</h2>{svg}</section>{}</body></html>\n",
        esc(&title),
        esc(&title),
        stats_html(&stats),
        nest_html(&nest_text, capped.dropped)
    )?;
    Ok(())
}
