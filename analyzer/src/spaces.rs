//! The address-space table: each CR3 seen, its steps, the switches into
//! it, the code it ran (as address ranges) and its busiest routines (the
//! old analyzer's per-process table). On a trace of several CPUs, of all
//! CPUs or of `--cpu N`'s, a switch being one CPU's.

use std::fmt::Write as _;

use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;
use std::collections::BTreeMap;

use vtrace_storage::{Event, RecordRef};

use crate::error::Result;
use crate::input::{Progress, Records, SegmentInfo, Trace};
use crate::levels::FuncResolver;
use crate::naming::{percent, routine_label};
use vtrace_image::symbols::{cr3_root, Symbolizer};

/// Routines listed per address space.
const TOP_ROUTINES: usize = 10;

/// A routine's steps in one address space.
#[derive(Clone, Debug, Serialize)]
pub struct Routine {
    /// The routine.
    pub name: String,
    /// Its steps there.
    pub steps: u64,
}

/// One address space's row.
#[derive(Clone, Debug, Serialize)]
pub struct AddressSpace {
    /// The page-table root (CR3 without its flag bits).
    pub cr3: u64,
    /// Steps in it.
    pub steps: u64,
    /// Of which at CPL 0.
    pub kernel_steps: u64,
    /// Of which at CPL 3.
    pub user_steps: u64,
    /// Times execution switched into it from another address space.
    pub switches_in: u64,
    /// Its first step.
    pub first_step: u64,
    /// Its last step.
    pub last_step: u64,
    /// Code executed, as `[start, end)` ranges of 4 KiB pages.
    pub code_ranges: Vec<(u64, u64)>,
    /// Its busiest routines, at most ten.
    pub routines: Vec<Routine>,
}

/// What `vtrace analyze spaces` reports.
#[derive(Clone, Debug, Serialize)]
pub struct SpaceTable {
    /// Steps in the trace.
    pub steps: u64,
    /// Switches between address spaces.
    pub switches: u64,
    /// One row per address space, busiest first.
    pub spaces: Vec<AddressSpace>,
}

#[derive(Default)]
struct Acc {
    steps: u64,
    kernel: u64,
    switches_in: u64,
    first: u64,
    last: u64,
    pages: FxHashSet<u64>,
    funcs: FxHashMap<u32, u64>,
}

struct Part {
    spaces: FxHashMap<u64, Acc>,
    /// Each CPU's first and last address space in the segment.
    first_cr3: BTreeMap<u32, u64>,
    last_cr3: BTreeMap<u32, u64>,
}

/// Counts one segment: of CPU `only`'s steps where it names one. A switch
/// is a CPU's move from one address space to another (CPUs taking turns
/// in different ones switch nothing).
fn count_segment(
    info: &SegmentInfo,
    records: &mut Records<'_>,
    symbols: &Symbolizer,
    only: Option<u32>,
) -> Part {
    let mut spaces: FxHashMap<u64, Acc> = FxHashMap::default();
    let mut funcs = FuncResolver::new(symbols);
    let mut prev: BTreeMap<u32, u64> = BTreeMap::new();
    let mut first_cr3 = BTreeMap::new();
    let mut cpu = 0u32;
    let mut number = info.first_step;
    // Consecutive steps mostly share a page and a routine: count those
    // runs once rather than touch two hash tables every step.
    let mut last_page: Option<(u64, u64)> = None;
    let mut run: Option<(u64, u32, u64)> = None;
    let flush = |spaces: &mut FxHashMap<u64, Acc>, run: Option<(u64, u32, u64)>| {
        if let Some((root, func, steps)) = run {
            if let Some(a) = spaces.get_mut(&root) {
                *a.funcs.entry(func).or_default() += steps;
            }
        }
    };
    while let Some(r) = records.next_record() {
        let s = match r {
            RecordRef::Step(s) => s,
            RecordRef::Event(Event::Cpu(c)) => {
                cpu = *c;
                continue;
            }
            RecordRef::Event(_) => continue,
        };
        if only.is_some_and(|o| o != cpu) {
            number = number.saturating_add(1);
            continue;
        }
        let root = cr3_root(s.cr3);
        let a = spaces.entry(root).or_insert_with(|| Acc {
            first: number,
            ..Default::default()
        });
        a.steps += 1;
        if s.cpl == 0 {
            a.kernel += 1;
        }
        a.last = number;
        let page = s.pc >> 12;
        if last_page != Some((root, page)) {
            a.pages.insert(page);
            last_page = Some((root, page));
        }
        if prev.get(&cpu).is_some_and(|&p| p != root) {
            a.switches_in += 1;
        }
        let func = funcs.func(s.pc, s.cr3);
        match &mut run {
            Some((r, f, steps)) if *r == root && *f == func => *steps += 1,
            _ => flush(&mut spaces, run.replace((root, func, 1))),
        }
        first_cr3.entry(cpu).or_insert(root);
        prev.insert(cpu, root);
        number = number.saturating_add(1);
    }
    flush(&mut spaces, run);
    Part {
        spaces,
        first_cr3,
        last_cr3: prev,
    }
}

fn ranges(pages: &FxHashSet<u64>) -> Vec<(u64, u64)> {
    let mut sorted: Vec<u64> = pages.iter().copied().collect();
    sorted.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for p in sorted {
        match out.last_mut() {
            Some(r) if r.1 == p << 12 => r.1 = (p + 1) << 12,
            _ => out.push((p << 12, (p + 1) << 12)),
        }
    }
    out
}

/// Reads the trace and builds the table.
pub fn collect(trace: &Trace, symbols: &Symbolizer, progress: Progress<'_>) -> Result<SpaceTable> {
    let only = trace.selected_cpu();
    let mut all: FxHashMap<u64, Acc> = FxHashMap::default();
    // Each CPU's address space where the segments so far left it.
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    trace.for_each_ordered(
        &trace.segments,
        |info, records| count_segment(info, records, symbols, only),
        |chunk| {
            let Ok(part) = chunk.result else {
                return Ok::<(), crate::error::AnalyzeError>(());
            };
            for (cpu, first) in &part.first_cr3 {
                if last.get(cpu).is_some_and(|before| before != first) {
                    all.entry(*first).or_default().switches_in += 1;
                }
            }
            last.extend(part.last_cr3);
            for (cr3, p) in part.spaces {
                let a = all.entry(cr3).or_insert_with(|| Acc {
                    first: p.first,
                    ..Default::default()
                });
                if a.steps == 0 {
                    a.first = p.first;
                }
                a.steps += p.steps;
                a.kernel += p.kernel;
                a.switches_in += p.switches_in;
                a.last = p.last;
                a.pages.extend(p.pages);
                for (f, c) in p.funcs {
                    *a.funcs.entry(f).or_default() += c;
                }
            }
            Ok(())
        },
        progress,
    )?;
    let mut spaces: Vec<AddressSpace> = all
        .into_iter()
        .map(|(cr3, a)| {
            let mut routines: Vec<Routine> = a
                .funcs
                .iter()
                .map(|(f, c)| Routine {
                    name: routine_label(symbols, *f),
                    steps: *c,
                })
                .collect();
            routines.sort_by(|x, y| y.steps.cmp(&x.steps).then(x.name.cmp(&y.name)));
            routines.truncate(TOP_ROUTINES);
            AddressSpace {
                cr3,
                steps: a.steps,
                kernel_steps: a.kernel,
                user_steps: a.steps - a.kernel,
                switches_in: a.switches_in,
                first_step: a.first,
                last_step: a.last,
                code_ranges: ranges(&a.pages),
                routines,
            }
        })
        .collect();
    spaces.sort_by_key(|s| s.first_step);
    Ok(SpaceTable {
        steps: spaces.iter().map(|s| s.steps).sum(),
        switches: spaces.iter().map(|s| s.switches_in).sum(),
        spaces,
    })
}

impl SpaceTable {
    /// The table as text.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "{} address spaces, {} steps, {} switches\n\n{:>18} {:>12} {:>7} {:>10} {:>10} {:>10} {:>8}\n",
            self.spaces.len(),
            self.steps,
            self.switches,
            "cr3",
            "steps",
            "%",
            "kernel",
            "user",
            "first",
            "switches"
        );
        for s in &self.spaces {
            let _ = writeln!(
                out,
                "{:>#18x} {:>12} {:>6.2}% {:>10} {:>10} {:>10} {:>8}",
                s.cr3,
                s.steps,
                percent(s.steps, self.steps),
                s.kernel_steps,
                s.user_steps,
                s.first_step,
                s.switches_in
            );
        }
        for s in &self.spaces {
            let _ = writeln!(out, "\naddress space {:#x}", s.cr3);
            let code: Vec<String> = s
                .code_ranges
                .iter()
                .map(|(a, b)| format!("{a:#x}-{b:#x}"))
                .collect();
            // Three ranges a line: a kernel touches dozens of pages.
            for (i, line) in code.chunks(3).enumerate() {
                let label = if i == 0 { "code:" } else { "" };
                let _ = writeln!(out, "  {label:<5} {}", line.join(", "));
            }
            for r in &s.routines {
                let _ = writeln!(out, "  {:>12}  {}", r.steps, r.name);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtrace_storage::{CpuMode, InsnBytes, Regs, SegmentEncoder, Step};

    fn step(enc: &mut SegmentEncoder, cr3: u64) {
        enc.push_step(&Step {
            pc: 0x1000,
            bytes: InsnBytes::new(&[0x90]).expect("short"),
            cr3,
            mode: CpuMode::Long64,
            cpl: 0,
            regs: Regs::default(),
        });
    }

    #[test]
    fn a_switch_is_one_cpus_move_to_another_address_space() {
        let mut enc = SegmentEncoder::new();
        // CPUs 0 and 1 take turns, each in its own space: no switch.
        for _ in 0..3 {
            enc.push_event(&Event::Cpu(0));
            step(&mut enc, 0x1000);
            enc.push_event(&Event::Cpu(1));
            step(&mut enc, 0x2000);
        }
        // CPU 0 moves into CPU 1's space: one switch.
        enc.push_event(&Event::Cpu(0));
        step(&mut enc, 0x2000);
        let payload = enc.take();
        let info = SegmentInfo {
            index: 0,
            first_step: 10,
            steps: 7,
        };
        let symbols = Symbolizer::new();
        let all = count_segment(&info, &mut Records::new(&payload), &symbols, None);
        assert_eq!(all.spaces[&0x1000].switches_in, 0);
        assert_eq!(all.spaces[&0x2000].switches_in, 1);
        assert_eq!(all.spaces[&0x2000].steps, 4);
        assert_eq!(all.last_cr3.get(&0), Some(&0x2000));
        assert_eq!(all.first_cr3.get(&1), Some(&0x2000));

        // `--cpu 1`: its steps alone, numbered as in the trace.
        let one = count_segment(&info, &mut Records::new(&payload), &symbols, Some(1));
        assert!(!one.spaces.contains_key(&0x1000));
        let space = &one.spaces[&0x2000];
        assert_eq!((space.steps, space.first, space.last), (3, 11, 15));
    }
}
