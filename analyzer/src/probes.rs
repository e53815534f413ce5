//! The probes of a trace (`vtrace run --probe`): how often each fired
//! and, for one argument, its power-of-two histogram as DTrace's
//! `quantize()` prints it.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use vtrace_storage::{Event, ProbeField, RecordRef};

use crate::event_text::{probe_number, probe_value_text};

use crate::error::Result;
use crate::input::{Progress, Trace};

/// One probe's fires.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProbeTally {
    /// `provider:name` (`sched:switch`, `fn:schedule`).
    pub probe: String,
    /// Times it fired.
    pub count: u64,
    /// The histogram asked for (`--quantize`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantize: Option<Quantize>,
    /// A typed probe's values (`fn:ROUTINE(filename:string)`): per value
    /// it fetched, how often each value came.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<FieldValues>,
}

/// How often each value of one typed probe value came.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FieldValues {
    /// The value as the probe named it (`how->flags`).
    pub field: String,
    /// Each value as text, most frequent first (at most 1000: a pointer
    /// differs every fire, and memory stays bounded).
    pub counts: Vec<ValueCount>,
    /// Fires whose value was not among those kept.
    pub others: u64,
}

/// One value and how often it came.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ValueCount {
    /// As text (`"/dev/console"`, `-100`, `0xffff888003c1e000`).
    pub value: String,
    /// Fires that had it.
    pub count: u64,
}

/// Distinct values kept per typed value: memory stays bounded whatever
/// a probe fetched (a pointer differs every fire).
pub const DISTINCT_VALUES: usize = 1000;

/// A power-of-two histogram of one argument, as a signed 64-bit number.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Quantize {
    /// The argument (0 is the first, DTrace's `arg0`).
    pub arg: usize,
    /// Or the typed value, by the name the probe gave it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The buckets that hold values, lowest first.
    pub buckets: Vec<Bucket>,
    /// Fires that passed fewer arguments (or no integer of that name).
    pub without: u64,
}

/// What `--quantize` takes: an argument's number, or a typed value's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuantizeOn {
    /// Argument N (0 is the first).
    Arg(usize),
    /// The typed value of this name.
    Field(String),
}

/// Values from `value` up to the next bucket's (0; 1; 2 to 3; 4 to 7...;
/// -1; -2 to -3...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// The bucket's lowest value.
    pub value: i64,
    /// Values in it.
    pub count: u64,
}

/// The bucket `v` falls in.
fn bucket_of(v: i64) -> i64 {
    match v {
        0 => 0,
        v if v > 0 => 1i64 << (63 - v.leading_zeros()),
        // |v| of i64::MIN does not fit an i64: its bucket is itself.
        i64::MIN => i64::MIN,
        v => -(1i64 << (63 - (-v).leading_zeros())),
    }
}

/// One fire, with its typed values where the probe has them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Fire {
    /// The step it came before.
    pub step: u64,
    /// The probe.
    pub probe: String,
    /// Its arguments (registers, for a `fn:` probe).
    pub args: Vec<u64>,
    /// Its typed values, as text, by name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<(String, String)>,
}

/// What one segment held of probes, in order.
enum Seen {
    Fire(Fire),
    Values(Vec<ProbeField>),
}

/// Every fire of the trace, in order, with its typed values.
pub fn fires(trace: &Trace, progress: Progress<'_>) -> Result<Vec<Fire>> {
    let mut all: Vec<Fire> = Vec::new();
    read_fires(trace, progress, |seen| match seen {
        Seen::Fire(f) => all.push(f),
        // Values belong to the fire just before them.
        Seen::Values(fields) => {
            if let Some(last) = all.last_mut() {
                last.values = fields
                    .iter()
                    .map(|f| (f.name.clone(), probe_value_text(&f.value)))
                    .collect();
            }
        }
    })?;
    Ok(all)
}

fn read_fires(trace: &Trace, progress: Progress<'_>, mut each: impl FnMut(Seen)) -> Result<()> {
    trace.for_each_ordered(
        &trace.segments,
        |info, records| {
            let mut seen = Vec::new();
            let mut step = info.first_step;
            while let Some(r) = records.next_record() {
                match r {
                    RecordRef::Step(_) => step = step.saturating_add(1),
                    RecordRef::Event(Event::Probe { name, args, .. }) => {
                        seen.push(Seen::Fire(Fire {
                            step,
                            probe: name.clone(),
                            args: args.clone(),
                            values: Vec::new(),
                        }))
                    }
                    RecordRef::Event(Event::ProbeValues(fields)) => {
                        seen.push(Seen::Values(fields.clone()))
                    }
                    RecordRef::Event(_) => {}
                }
            }
            seen
        },
        |chunk| {
            // A damaged segment's fires are lost with it; the trace's
            // problems say which.
            for s in chunk.result.into_iter().flatten() {
                each(s);
            }
            Ok::<(), crate::error::AnalyzeError>(())
        },
        progress,
    )
}

/// Counts every probe's fires (and quantizes what `quantize` names of
/// each, and counts each typed value's values), sorted by name.
pub fn probes(
    trace: &Trace,
    quantize: Option<QuantizeOn>,
    progress: Progress<'_>,
) -> Result<Vec<ProbeTally>> {
    let mut tallies: Vec<Tally> = Vec::new();
    // The tally of the last fire: its values come next.
    let mut last: Option<usize> = None;
    read_fires(trace, progress, |seen| match seen {
        Seen::Fire(fire) => {
            let i = match tallies.iter().position(|t| t.tally.probe == fire.probe) {
                Some(i) => i,
                None => {
                    tallies.push(Tally::new(fire.probe.clone(), quantize.as_ref()));
                    tallies.len() - 1
                }
            };
            tallies[i].fire(&fire.args, quantize.as_ref());
            last = Some(i);
        }
        Seen::Values(fields) => {
            if let Some(t) = last.take().and_then(|i| tallies.get_mut(i)) {
                t.values(&fields, quantize.as_ref());
            }
        }
    })?;
    let mut out: Vec<ProbeTally> = tallies.into_iter().map(Tally::finish).collect();
    out.sort_by(|a, b| a.probe.cmp(&b.probe));
    Ok(out)
}

/// One probe's tally while the trace is read.
struct Tally {
    tally: ProbeTally,
    buckets: BTreeMap<i64, u64>,
    /// Per typed value: its name, and counts by value text.
    fields: Vec<(String, HashMap<String, u64>, u64)>,
}

impl Tally {
    fn new(probe: String, quantize: Option<&QuantizeOn>) -> Tally {
        let quantize = quantize.map(|q| match q {
            QuantizeOn::Arg(arg) => Quantize {
                arg: *arg,
                ..Quantize::default()
            },
            QuantizeOn::Field(name) => Quantize {
                field: Some(name.clone()),
                ..Quantize::default()
            },
        });
        Tally {
            tally: ProbeTally {
                probe,
                count: 0,
                quantize,
                values: Vec::new(),
            },
            buckets: BTreeMap::new(),
            fields: Vec::new(),
        }
    }

    fn fire(&mut self, args: &[u64], quantize: Option<&QuantizeOn>) {
        self.tally.count += 1;
        match quantize {
            Some(QuantizeOn::Arg(i)) => match args.get(*i) {
                Some(&a) => *self.buckets.entry(bucket_of(a as i64)).or_default() += 1,
                None => self.without(),
            },
            // Counted as without until its value comes.
            Some(QuantizeOn::Field(_)) => self.without(),
            None => {}
        }
    }

    fn without(&mut self) {
        if let Some(q) = self.tally.quantize.as_mut() {
            q.without += 1;
        }
    }

    fn values(&mut self, fields: &[ProbeField], quantize: Option<&QuantizeOn>) {
        for f in fields {
            let i = match self.fields.iter().position(|(n, _, _)| *n == f.name) {
                Some(i) => i,
                None => {
                    self.fields.push((f.name.clone(), HashMap::new(), 0));
                    self.fields.len() - 1
                }
            };
            let (_, counts, others) = &mut self.fields[i];
            let text = probe_value_text(&f.value);
            let room = counts.len() < DISTINCT_VALUES;
            match counts.get_mut(&text) {
                Some(c) => *c += 1,
                None if room => {
                    counts.insert(text, 1);
                }
                None => *others += 1,
            }
            if matches!(quantize, Some(QuantizeOn::Field(n)) if *n == f.name) {
                if let Some(v) = probe_number(&f.value) {
                    *self.buckets.entry(bucket_of(v)).or_default() += 1;
                    if let Some(q) = self.tally.quantize.as_mut() {
                        q.without = q.without.saturating_sub(1);
                    }
                }
            }
        }
    }

    fn finish(mut self) -> ProbeTally {
        if let Some(q) = self.tally.quantize.as_mut() {
            q.buckets = self
                .buckets
                .into_iter()
                .map(|(value, count)| Bucket { value, count })
                .collect();
        }
        self.tally.values = self
            .fields
            .into_iter()
            .map(|(field, counts, others)| {
                let mut counts: Vec<ValueCount> = counts
                    .into_iter()
                    .map(|(value, count)| ValueCount { value, count })
                    .collect();
                counts.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.value.cmp(&b.value)));
                FieldValues {
                    field,
                    counts,
                    others,
                }
            })
            .collect();
        self.tally
    }
}

/// The counts as a table, and each histogram after its probe's line.
pub fn format_table(tallies: &[ProbeTally]) -> String {
    use std::fmt::Write as _;
    let width = tallies
        .iter()
        .map(|t| t.probe.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!("{:width$}  {:>12}\n", "probe", "count");
    for t in tallies {
        let _ = writeln!(out, "{:width$}  {:>12}", t.probe, t.count);
        for f in &t.values {
            let top: Vec<String> = f
                .counts
                .iter()
                .take(TOP_VALUES)
                .map(|v| format!("{} ({})", v.value, v.count))
                .collect();
            let more = f.counts.len().saturating_sub(TOP_VALUES);
            let _ = write!(out, "  {}: {}", f.field, top.join(", "));
            if more > 0 {
                let _ = write!(out, ", and {more} more value(s)");
            }
            if f.others > 0 {
                let _ = write!(
                    out,
                    " (and {} fire(s) of values past the first {DISTINCT_VALUES})",
                    f.others
                );
            }
            out.push('\n');
        }
        if let Some(q) = &t.quantize {
            out.push_str(&format_quantize(q));
        }
    }
    out
}

/// Values per typed value the table shows (`--json` has them all).
const TOP_VALUES: usize = 5;

/// A histogram as DTrace prints `quantize()`: a row per power of two, from
/// the bucket below the lowest that holds values to the one above the
/// highest, each with a bar of 40 `@` for all fires.
pub fn format_quantize(q: &Quantize) -> String {
    use std::fmt::Write as _;
    let what = q.field.clone().unwrap_or_else(|| format!("arg{}", q.arg));
    let mut out = format!(
        "\n  {what}\n{:>16}  ------------- Distribution ------------- count\n",
        "value"
    );
    let total: u64 = q.buckets.iter().map(|b| b.count).sum();
    if let (Some(first), Some(last)) = (q.buckets.first(), q.buckets.last()) {
        let mut rows = vec![(below(first.value), 0)];
        let mut value = first.value;
        loop {
            let count = q
                .buckets
                .iter()
                .find(|b| b.value == value)
                .map_or(0, |b| b.count);
            rows.push((value, count));
            if value == last.value {
                break;
            }
            value = above(value);
        }
        if let Some(v) = (last.value != i64::MAX).then(|| above(last.value)) {
            rows.push((v, 0));
        }
        for (value, count) in rows {
            let bar = (count as u128 * 40 + total as u128 / 2) / (total.max(1) as u128);
            let _ = writeln!(out, "{value:>16} |{:<40} {count}", "@".repeat(bar as usize));
        }
    }
    if q.without > 0 {
        let _ = writeln!(out, "{:>16}  ({} fires passed no {what})", "", q.without);
    }
    out.push('\n');
    out
}

/// The bucket after `v`'s.
fn above(v: i64) -> i64 {
    match v {
        0 => 1,
        -1 => 0,
        v if v > 0 => v.checked_mul(2).unwrap_or(i64::MAX),
        v => v / 2,
    }
}

/// The bucket before `v`'s.
fn below(v: i64) -> i64 {
    match v {
        0 => -1,
        1 => 0,
        v if v > 0 => v / 2,
        v => v.checked_mul(2).unwrap_or(i64::MIN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_fall_in_powers_of_two() {
        let cases = [
            (0, 0),
            (1, 1),
            (2, 2),
            (3, 2),
            (4, 4),
            (1000, 512),
            (-1, -1),
            (-3, -2),
            (-1000, -512),
            (i64::MAX, 1 << 62),
            (i64::MIN, i64::MIN),
        ];
        for (v, b) in cases {
            assert_eq!(bucket_of(v), b, "{v}");
        }
        for v in [-8, -1, 0, 1, 8] {
            assert_eq!(above(below(v)), v);
        }
    }

    #[test]
    fn a_histogram_prints_as_dtrace_does() {
        let q = Quantize {
            arg: 1,
            field: None,
            buckets: vec![Bucket { value: 1, count: 1 }, Bucket { value: 4, count: 3 }],
            without: 0,
        };
        let text = format_quantize(&q);
        let rows: Vec<&str> = text.lines().filter(|l| l.contains('|')).collect();
        assert_eq!(rows.len(), 5, "{text}");
        assert!(rows[0].trim_start().starts_with("0 |"));
        assert!(
            rows[1].ends_with(&format!("{:<40} 1", "@".repeat(10))),
            "{text}"
        );
        assert!(rows[2].ends_with(" 0"), "2 is an empty bucket: {text}");
        assert!(
            rows[3].ends_with(&format!("{:<40} 3", "@".repeat(30))),
            "{text}"
        );
        assert!(rows[4].trim_start().starts_with("8 |"), "{text}");
    }
}
