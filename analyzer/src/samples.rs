//! The peeper's samples (`vtrace run --peep`): the time series of the
//! sampled variables, and where samples carry the running pc, a profile by
//! routine and a flame graph of it.

use std::fmt::Write as _;

use serde::Serialize;
use vtrace_storage::SampleVariable;
use vtrace_storage::{Event, RecordRef};

use crate::error::Result;
use crate::input::{Progress, Trace};
use vtrace_image::symbols::Symbolizer;

/// One sample, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The guest's virtual time when it was taken.
    pub virtual_ns: u64,
    /// Host nanoseconds since the run started.
    pub host_ns: u64,
    /// In the order of [`Samples::variables`].
    pub values: Vec<u64>,
    /// The running pc and CR3.
    pub pc: Option<(u64, u64)>,
}

/// A trace's samples and what they are of.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    /// The variables, as the trace's metadata names them.
    pub variables: Vec<SampleVariable>,
    /// The interval asked for, as given.
    pub interval: Option<String>,
    /// In the order taken.
    pub samples: Vec<Sample>,
}

/// Reads every sample of `trace`.
pub fn samples(trace: &Trace, progress: Progress<'_>) -> Result<Samples> {
    let mut out = Samples {
        variables: trace.metadata.sample_variables(),
        interval: trace.metadata.peep.clone(),
        samples: Vec::new(),
    };
    trace.for_each_ordered(
        &trace.segments,
        |_, records| {
            let mut found = Vec::new();
            while let Some(r) = records.next_record() {
                if let RecordRef::Event(Event::Sample {
                    virtual_ns,
                    host_ns,
                    values,
                    pc,
                }) = r
                {
                    found.push(Sample {
                        virtual_ns: *virtual_ns,
                        host_ns: *host_ns,
                        values: values.clone(),
                        pc: *pc,
                    });
                }
            }
            found
        },
        |chunk| {
            // A damaged segment's samples are lost with it; the trace's
            // problems say which.
            out.samples.extend(chunk.result.into_iter().flatten());
            Ok::<(), crate::error::AnalyzeError>(())
        },
        progress,
    )?;
    // Batches reach the trace in order; the last sample of a run is taken
    // as the run ends, and a ring may have overwritten the oldest.
    out.samples.sort_by_key(|s| s.host_ns);
    Ok(out)
}

impl Samples {
    /// The variables' names, with `value N` for values the metadata does
    /// not name.
    fn names(&self) -> Vec<String> {
        let count = self
            .samples
            .iter()
            .map(|s| s.values.len())
            .max()
            .unwrap_or(0)
            .max(self.variables.len());
        (0..count)
            .map(|i| match self.variables.get(i) {
                Some(v) => v.name.clone(),
                None => format!("value {i}"),
            })
            .collect()
    }

    /// Value `i` of `sample` as a number of its variable's type.
    fn number(&self, sample: &Sample, i: usize) -> Option<i128> {
        let raw = *sample.values.get(i)?;
        Some(match self.variables.get(i) {
            Some(v) => v.kind.number(raw),
            None => i128::from(raw),
        })
    }

    fn has_pc(&self) -> bool {
        self.samples.iter().any(|s| s.pc.is_some())
    }

    /// A header of `#` lines, then a row per sample: virtual and host
    /// seconds, the values, and the pc's routine where samples have one;
    /// then the profile by routine.
    pub fn format_table(&self, symbols: &Symbolizer) -> String {
        let names = self.names();
        let mut out = String::new();
        let mut what: Vec<String> = self
            .variables
            .iter()
            .map(|v| format!("{} ({} at {:#x})", v.name, v.kind.name(), v.address))
            .collect();
        if self.has_pc() {
            what.push("the pc".into());
        }
        let _ = writeln!(
            out,
            "# peeping every {}: {}",
            self.interval.as_deref().unwrap_or("?"),
            what.join(", ")
        );
        if let (Some(first), Some(last)) = (self.samples.first(), self.samples.last()) {
            let _ = writeln!(
                out,
                "# {} samples over {:.6} s of virtual time, {:.6} s of host time",
                self.samples.len(),
                last.virtual_ns.saturating_sub(first.virtual_ns) as f64 / 1e9,
                last.host_ns.saturating_sub(first.host_ns) as f64 / 1e9
            );
        }
        let _ = write!(out, "{:>14} {:>14}", "virtual s", "host s");
        for n in &names {
            let _ = write!(out, " {n:>20}");
        }
        if self.has_pc() {
            let _ = write!(out, "  pc");
        }
        out.push('\n');
        for s in &self.samples {
            let _ = write!(
                out,
                "{:>14.9} {:>14.9}",
                s.virtual_ns as f64 / 1e9,
                s.host_ns as f64 / 1e9
            );
            for i in 0..names.len() {
                match self.number(s, i) {
                    Some(v) => {
                        let _ = write!(out, " {v:>20}");
                    }
                    None => {
                        let _ = write!(out, " {:>20}", "-");
                    }
                }
            }
            if let Some((pc, cr3)) = s.pc {
                let _ = write!(out, "  {}", symbols.format(pc, cr3));
            }
            out.push('\n');
        }
        if self.has_pc() {
            out.push('\n');
            out.push_str(&format_profile(&self.profile(symbols)));
        }
        out
    }

    /// Comma-separated values with a header: `virtual_ns,host_ns`, a
    /// column per variable, and `pc,cr3,routine` where samples have a pc.
    pub fn format_csv(&self, symbols: &Symbolizer) -> String {
        let names = self.names();
        let pc = self.has_pc();
        let mut out = String::from("virtual_ns,host_ns");
        for n in &names {
            out.push(',');
            out.push_str(&csv_field(n));
        }
        if pc {
            out.push_str(",pc,cr3,routine");
        }
        out.push('\n');
        for s in &self.samples {
            let _ = write!(out, "{},{}", s.virtual_ns, s.host_ns);
            for i in 0..names.len() {
                out.push(',');
                if let Some(v) = self.number(s, i) {
                    let _ = write!(out, "{v}");
                }
            }
            if pc {
                match s.pc {
                    Some((pc, cr3)) => {
                        let routine = routine(symbols, pc, cr3);
                        let _ = write!(out, ",{pc:#x},{cr3:#x},{}", csv_field(&routine));
                    }
                    None => out.push_str(",,,"),
                }
            }
            out.push('\n');
        }
        out
    }

    /// A JSON object: `interval`, `variables` (name, type, address) and
    /// `samples` (virtual_ns, host_ns, values by name, and pc, cr3 and
    /// routine where taken); with pc samples, `profile` (routine, samples).
    pub fn to_json(&self, symbols: &Symbolizer) -> serde_json::Value {
        let names = self.names();
        let samples: Vec<serde_json::Value> = self
            .samples
            .iter()
            .map(|s| {
                let mut values = serde_json::Map::new();
                for (i, n) in names.iter().enumerate() {
                    if let Some(v) = self.number(s, i) {
                        values.insert(n.clone(), json_number(v));
                    }
                }
                let mut row = serde_json::json!({
                    "virtual_ns": s.virtual_ns,
                    "host_ns": s.host_ns,
                    "values": values,
                });
                if let Some((pc, cr3)) = s.pc {
                    row["pc"] = format!("{pc:#x}").into();
                    row["cr3"] = format!("{cr3:#x}").into();
                    row["routine"] = routine(symbols, pc, cr3).into();
                }
                row
            })
            .collect();
        let variables: Vec<serde_json::Value> = self
            .variables
            .iter()
            .map(|v| {
                serde_json::json!({
                    "name": v.name, "type": v.kind.name(), "address": format!("{:#x}", v.address)
                })
            })
            .collect();
        let mut out = serde_json::json!({
            "interval": self.interval,
            "variables": variables,
            "samples": samples,
        });
        if self.has_pc() {
            out["profile"] = serde_json::to_value(self.profile(symbols)).unwrap_or_default();
        }
        out
    }

    /// Samples with a pc, by routine, most first.
    pub fn profile(&self, symbols: &Symbolizer) -> Vec<RoutineSamples> {
        let mut counts: std::collections::HashMap<String, u64> = Default::default();
        for (pc, cr3) in self.samples.iter().filter_map(|s| s.pc) {
            *counts.entry(routine(symbols, pc, cr3)).or_default() += 1;
        }
        let mut out: Vec<RoutineSamples> = counts
            .into_iter()
            .map(|(routine, samples)| RoutineSamples { routine, samples })
            .collect();
        out.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.routine.cmp(&b.routine)));
        out
    }

    /// Folded stacks of the pc samples for a flame graph: an address
    /// space, then the routine (a pc sample has no call stack).
    pub fn folded(&self, symbols: &Symbolizer) -> Vec<(Vec<String>, u64)> {
        let mut counts: std::collections::BTreeMap<Vec<String>, u64> = Default::default();
        for (pc, cr3) in self.samples.iter().filter_map(|s| s.pc) {
            let space = crate::naming::space_root(cr3);
            *counts
                .entry(vec![space, routine(symbols, pc, cr3)])
                .or_default() += 1;
        }
        counts.into_iter().collect()
    }
}

/// One routine's share of the pc samples.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RoutineSamples {
    /// The routine.
    pub routine: String,
    /// pc samples in it.
    pub samples: u64,
}

/// The profile as a table with percentages.
pub fn format_profile(profile: &[RoutineSamples]) -> String {
    let total: u64 = profile.iter().map(|r| r.samples).sum();
    let mut out = format!("{:>10} {:>7}  routine (pc samples)\n", "samples", "%");
    for r in profile {
        let _ = writeln!(
            out,
            "{:>10} {:>7.2}  {}",
            r.samples,
            r.samples as f64 * 100.0 / total.max(1) as f64,
            r.routine
        );
    }
    out
}

fn routine(symbols: &Symbolizer, pc: u64, cr3: u64) -> String {
    match symbols.resolve(pc, cr3) {
        Some(r) => r.name.to_string(),
        None => format!("{pc:#x}"),
    }
}

fn json_number(v: i128) -> serde_json::Value {
    match (u64::try_from(v), i64::try_from(v)) {
        (Ok(u), _) => u.into(),
        (_, Ok(i)) => i.into(),
        _ => v.to_string().into(),
    }
}

/// Quotes a CSV field where it needs it (RFC 4180).
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtrace_storage::SampleType;

    fn series() -> Samples {
        Samples {
            variables: vec![
                SampleVariable {
                    name: "ticks".into(),
                    kind: SampleType::U64,
                    address: 0x1000,
                },
                SampleVariable {
                    name: "delta, signed".into(),
                    kind: SampleType::I64,
                    address: 0x1008,
                },
            ],
            interval: Some("100us".into()),
            samples: vec![
                Sample {
                    virtual_ns: 100_000,
                    host_ns: 120_000,
                    values: vec![1, u64::MAX],
                    pc: Some((0x10_0000, 0x5000)),
                },
                Sample {
                    virtual_ns: 200_000,
                    host_ns: 220_000,
                    values: vec![2, 3],
                    pc: None,
                },
            ],
        }
    }

    #[test]
    fn csv_has_a_column_per_variable_typed_and_quoted() {
        let csv = series().format_csv(&Symbolizer::new());
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines,
            vec![
                "virtual_ns,host_ns,ticks,\"delta, signed\",pc,cr3,routine",
                "100000,120000,1,-1,0x100000,0x5000,0x100000",
                "200000,220000,2,3,,,",
            ]
        );
    }

    #[test]
    fn json_and_profile_name_values_and_routines() {
        let s = series();
        let json = s.to_json(&Symbolizer::new());
        assert_eq!(json["samples"][0]["values"]["delta, signed"], -1);
        assert_eq!(json["samples"][1]["values"]["ticks"], 2);
        assert_eq!(json["profile"][0]["samples"], 1);
        let folded = s.folded(&Symbolizer::new());
        assert_eq!(
            folded,
            vec![(vec!["cr3=0x5000".to_string(), "0x100000".to_string()], 1)]
        );
    }
}
