//! The statistics as text: `vtrace analyze stats` without `--json`.

use std::fmt::Write as _;

use super::{Count, Stats};
use crate::naming::percent;

fn table(out: &mut String, title: &str, total: u64, rows: &[Count], top: usize) {
    let _ = writeln!(out, "\n{title}");
    for r in rows.iter().take(top) {
        let _ = writeln!(
            out,
            "  {:>12} {:>6.2}%  {}",
            r.count,
            percent(r.count, total),
            r.name
        );
    }
    if rows.len() > top {
        let _ = writeln!(
            out,
            "  ... {} more (--top, or --json for all)",
            rows.len() - top
        );
    }
}

impl Stats {
    /// The text report, `top` rows a table.
    pub fn to_text(&self, top: usize) -> String {
        let mut out = String::new();
        if let Some(tasks) = &self.tasks {
            let _ = writeln!(out, "tasks: {tasks}");
        }
        if let Some(cpus) = self.cpus_added_up {
            let _ = writeln!(
                out,
                "CPUs: {cpus}, their steps added up (`--cpu N` for one CPU's, `--cpu all` for \
                 each one's share)"
            );
        }
        let _ = write!(
            out,
            "steps: {}\ncalls: {}, returns: {}, switches (task or address space): {}, deepest stack: {}, \
             divided levels: {}, breaks: {}\n",
            self.steps,
            self.calls,
            self.returns,
            self.address_space_switches,
            self.deepest_stack,
            self.divided_levels,
            self.breaks
        );
        let _ = writeln!(out, "\nroutines by self steps (self, total, calls)");
        for r in self.routines.iter().take(top) {
            let _ = writeln!(
                out,
                "  {:>12} {:>6.2}% {:>12} {:>8}  {}",
                r.self_steps,
                percent(r.self_steps, self.steps),
                r.total_steps,
                r.calls,
                r.name
            );
        }
        table(
            &mut out,
            "instruction classes",
            self.steps,
            &self.classes,
            top,
        );
        table(&mut out, "mnemonics", self.steps, &self.mnemonics, top);
        let refs: u64 = self.addressing_modes.iter().map(|c| c.count).sum();
        table(
            &mut out,
            "addressing modes (instructions with a memory operand)",
            refs,
            &self.addressing_modes,
            top,
        );
        let l = &self.locality;
        let _ = writeln!(
            out,
            "\nmemory locality: {} references, {} distinct 64-byte lines, {} distinct pages, \
             {:.1}% of references to a line touched before",
            l.references,
            l.distinct_lines,
            l.distinct_pages,
            100.0 * l.reuse_ratio
        );
        let _ = writeln!(out, "\ninterrupts and exceptions");
        for v in &self.interrupts {
            let _ = writeln!(out, "  {:>12}  vector {:>3} {}", v.count, v.vector, v.name);
        }
        let d = &self.interrupts_disabled;
        let _ = writeln!(
            out,
            "\ninterrupts disabled: {} steps ({:.2}%) in {} stretches; longest {} steps{}",
            d.steps,
            percent(d.steps, self.steps),
            d.stretches,
            d.longest,
            match (&d.longest_from, &d.longest_in) {
                (Some(s), Some(f)) => format!(" from step {s} in {f}"),
                (Some(s), None) => format!(" from step {s}"),
                _ => String::new(),
            }
        );
        out
    }
}
