//! Each CPU's share of a trace of several CPUs (`vtrace analyze stats
//! --cpu`): its steps, interrupts and halts, and where it spun waiting.
//!
//! Spinning is found by the instruction made for it: PAUSE, the spin-wait
//! hint every lock and flag-polling loop of Linux and the demo OS runs
//! (`cpu_relax`). A spin is a run of PAUSEs of one CPU in one routine; its
//! steps are the CPU's steps from the first PAUSE of the run to the last.
//! A spin that a segment boundary cuts counts as two.

use rustc_hash::FxHashMap;
use serde::Serialize;
use vtrace_storage::{Event, RecordRef};

use crate::error::Result;
use crate::input::{Progress, Trace};
use vtrace_image::symbols::Symbolizer;

/// PAUSE: `rep nop`.
const PAUSE: [u8; 2] = [0xf3, 0x90];

/// One CPU's share of the trace.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct CpuShare {
    /// The CPU.
    pub cpu: u32,
    /// Its steps.
    pub steps: u64,
    /// Its steps in every CPU's, in percent.
    pub percent: f64,
    /// Interrupts and exceptions it took.
    pub interrupts: u64,
    /// Times it halted.
    pub halts: u64,
    /// Its steps in spin loops (see the module documentation).
    pub spinning: u64,
}

/// Where a CPU spun.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SpinSite {
    /// The CPU.
    pub cpu: u32,
    /// The routine the loop is in.
    pub routine: String,
    /// Spins (runs of PAUSE).
    pub spins: u64,
    /// PAUSEs executed.
    pub pauses: u64,
    /// Steps from each spin's first PAUSE to its last.
    pub steps: u64,
}

/// What `vtrace analyze stats --cpu` shows.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct CpuStats {
    /// Every CPU that ran a step, in CPU order.
    pub cpus: Vec<CpuShare>,
    /// Where CPUs spun, most steps first.
    pub spinning: Vec<SpinSite>,
}

/// A spin in progress: its routine (pc's symbol), the CPU's step count at
/// its first and last PAUSE, and its PAUSEs.
#[derive(Clone, Copy)]
struct Spin {
    routine: u64,
    first: u64,
    last: u64,
    pauses: u64,
}

/// One segment's counts.
#[derive(Default)]
struct Part {
    cpus: FxHashMap<u32, CpuShare>,
    /// By (CPU, routine start): spins, PAUSEs, steps.
    spins: FxHashMap<(u32, u64), (u64, u64, u64)>,
}

impl Part {
    fn end_spin(&mut self, cpu: u32, spin: Spin) {
        let e = self.spins.entry((cpu, spin.routine)).or_default();
        e.0 += 1;
        e.1 += spin.pauses;
        e.2 += spin.last - spin.first + 1;
        self.cpus.entry(cpu).or_default().spinning += spin.last - spin.first + 1;
    }
}

/// Steps from a spin's last PAUSE to the next of the same routine that
/// still continue it: a loop that long between hints is not spinning.
const SPIN_LOOP_MAX: u64 = 64;

fn count_segment(records: &mut crate::input::Records<'_>, symbols: &Symbolizer) -> Part {
    let mut part = Part::default();
    let mut cpu = 0u32;
    let mut spins: FxHashMap<u32, Spin> = FxHashMap::default();
    while let Some(r) = records.next_record() {
        match r {
            RecordRef::Event(Event::Cpu(c)) => cpu = *c,
            RecordRef::Event(Event::Interrupt { .. }) => {
                part.cpus.entry(cpu).or_default().interrupts += 1
            }
            RecordRef::Event(Event::Halt) => part.cpus.entry(cpu).or_default().halts += 1,
            RecordRef::Event(_) => {}
            RecordRef::Step(s) => {
                let share = part.cpus.entry(cpu).or_default();
                share.steps += 1;
                let n = share.steps;
                if s.bytes.as_slice() != PAUSE {
                    if let Some(spin) = spins.get(&cpu).copied() {
                        if n - spin.last > SPIN_LOOP_MAX {
                            spins.remove(&cpu);
                            part.end_spin(cpu, spin);
                        }
                    }
                    continue;
                }
                let routine = symbols.resolve(s.pc, s.cr3).map_or(s.pc, |r| r.start);
                match spins.get_mut(&cpu) {
                    Some(spin) if spin.routine == routine => {
                        spin.last = n;
                        spin.pauses += 1;
                    }
                    other => {
                        let fresh = Spin {
                            routine,
                            first: n,
                            last: n,
                            pauses: 1,
                        };
                        if let Some(old) = other.map(|o| std::mem::replace(o, fresh)) {
                            part.end_spin(cpu, old);
                        } else {
                            spins.insert(cpu, fresh);
                        }
                    }
                }
            }
        }
    }
    for (cpu, spin) in spins {
        part.end_spin(cpu, spin);
    }
    part
}

/// Reads the trace (every CPU, whatever `--cpu N` chose) and sums up each
/// CPU's share.
pub fn collect(trace: &Trace, symbols: &Symbolizer, progress: Progress<'_>) -> Result<CpuStats> {
    let mut total = Part::default();
    trace.for_each_ordered(
        &trace.segments,
        |_, records| count_segment(records, symbols),
        |chunk| {
            if let Ok(part) = chunk.result {
                for (cpu, s) in part.cpus {
                    let t = total.cpus.entry(cpu).or_default();
                    t.steps += s.steps;
                    t.interrupts += s.interrupts;
                    t.halts += s.halts;
                    t.spinning += s.spinning;
                }
                for (key, (spins, pauses, steps)) in part.spins {
                    let t = total.spins.entry(key).or_default();
                    (t.0, t.1, t.2) = (t.0 + spins, t.1 + pauses, t.2 + steps);
                }
            }
            Ok::<(), crate::error::AnalyzeError>(())
        },
        progress,
    )?;
    let steps: u64 = total.cpus.values().map(|c| c.steps).sum();
    let mut cpus: Vec<CpuShare> = total
        .cpus
        .into_iter()
        .map(|(cpu, s)| CpuShare {
            cpu,
            percent: 100.0 * s.steps as f64 / steps.max(1) as f64,
            ..s
        })
        .collect();
    cpus.sort_by_key(|c| c.cpu);
    let mut spinning: Vec<SpinSite> = total
        .spins
        .into_iter()
        .map(|((cpu, routine), (spins, pauses, steps))| SpinSite {
            cpu,
            routine: symbols.format(routine, 0),
            spins,
            pauses,
            steps,
        })
        .collect();
    spinning.sort_by(|a, b| b.steps.cmp(&a.steps).then(a.cpu.cmp(&b.cpu)));
    Ok(CpuStats { cpus, spinning })
}

impl CpuStats {
    /// The tables as text.
    pub fn to_text(&self, top: usize) -> String {
        use std::fmt::Write as _;
        let mut out = String::from("CPUs\n");
        let _ = writeln!(
            out,
            "  {:>4} {:>12} {:>7} {:>11} {:>7} {:>12}",
            "cpu", "steps", "share", "interrupts", "halts", "spinning"
        );
        for c in &self.cpus {
            let _ = writeln!(
                out,
                "  {:>4} {:>12} {:>6.1}% {:>11} {:>7} {:>12}",
                c.cpu, c.steps, c.percent, c.interrupts, c.halts, c.spinning
            );
        }
        out.push_str("\nSpinning (runs of PAUSE: the routine, spins, PAUSEs, steps)\n");
        if self.spinning.is_empty() {
            out.push_str("  none: no CPU executed PAUSE\n");
        }
        for s in self.spinning.iter().take(top) {
            let _ = writeln!(
                out,
                "  CPU {:<3} {:<40} {:>8} {:>8} {:>10}",
                s.cpu, s.routine, s.spins, s.pauses, s.steps
            );
        }
        out
    }
}
