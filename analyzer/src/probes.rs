//! The probes of a trace (`vtrace run --probe`): how often each fired
//! and, for one argument, its power-of-two histogram as DTrace's
//! `quantize()` prints it.

use serde::Serialize;
use vtrace_storage::{Event, RecordRef};

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
}

/// A power-of-two histogram of one argument, as a signed 64-bit number.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Quantize {
    /// The argument (0 is the first, DTrace's `arg0`).
    pub arg: usize,
    /// The buckets that hold values, lowest first.
    pub buckets: Vec<Bucket>,
    /// Fires that passed fewer arguments.
    pub without: u64,
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

/// Counts every probe's fires (and quantizes argument `quantize` of each),
/// sorted by name.
pub fn probes(
    trace: &Trace,
    quantize: Option<usize>,
    progress: Progress<'_>,
) -> Result<Vec<ProbeTally>> {
    let mut tallies: Vec<(ProbeTally, std::collections::BTreeMap<i64, u64>)> = Vec::new();
    trace.for_each_ordered(
        &trace.segments,
        |_, records| {
            let mut fires = Vec::new();
            while let Some(r) = records.next_record() {
                if let RecordRef::Event(Event::Probe { name, args, .. }) = r {
                    let arg = quantize.map(|i| args.get(i).map(|&a| a as i64));
                    fires.push((name.clone(), arg));
                }
            }
            fires
        },
        |chunk| {
            // A damaged segment's fires are lost with it; the trace's
            // problems say which.
            for (name, arg) in chunk.result.into_iter().flatten() {
                let i = match tallies.iter().position(|(t, _)| t.probe == name) {
                    Some(i) => i,
                    None => {
                        let quantize = quantize.map(|arg| Quantize {
                            arg,
                            ..Quantize::default()
                        });
                        let tally = ProbeTally {
                            probe: name,
                            count: 0,
                            quantize,
                        };
                        tallies.push((tally, Default::default()));
                        tallies.len() - 1
                    }
                };
                let (tally, buckets) = &mut tallies[i];
                tally.count += 1;
                match (arg, tally.quantize.as_mut()) {
                    (Some(Some(v)), _) => *buckets.entry(bucket_of(v)).or_default() += 1,
                    (Some(None), Some(q)) => q.without += 1,
                    _ => {}
                }
            }
            Ok::<(), crate::error::AnalyzeError>(())
        },
        progress,
    )?;
    let mut out: Vec<ProbeTally> = tallies
        .into_iter()
        .map(|(mut tally, buckets)| {
            if let Some(q) = tally.quantize.as_mut() {
                q.buckets = buckets
                    .into_iter()
                    .map(|(value, count)| Bucket { value, count })
                    .collect();
            }
            tally
        })
        .collect();
    out.sort_by(|a, b| a.probe.cmp(&b.probe));
    Ok(out)
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
        if let Some(q) = &t.quantize {
            out.push_str(&format_quantize(q));
        }
    }
    out
}

/// A histogram as DTrace prints `quantize()`: a row per power of two, from
/// the bucket below the lowest that holds values to the one above the
/// highest, each with a bar of 40 `@` for all fires.
pub fn format_quantize(q: &Quantize) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "\n  arg{}\n{:>16}  ------------- Distribution ------------- count\n",
        q.arg, "value"
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
        let _ = writeln!(
            out,
            "{:>16}  ({} fires passed no arg{})",
            "", q.without, q.arg
        );
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
