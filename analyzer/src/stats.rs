//! Statistics: instruction mix, steps per routine, addressing modes,
//! memory locality, interrupts and interrupt-disabled stretches. Per-step
//! counts are gathered in parallel per segment and merged in order; totals
//! per routine and the call-stack profile come from the level engine.

use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;
use vtrace_storage::{Event, Regs};

use crate::error::Result;
use crate::input::{Progress, SegmentInfo, Trace};
use crate::insn::{memory_addresses, AddressingMode, Class};
use crate::levels::SelectedTasks;
use crate::levels::{
    EntryKind, ExitKind, FrameView, LevelCounts, LevelEngine, LevelPass, LevelSink, SegmentPass,
    SegmentRecord,
};
use crate::naming::{routine_label, space_root, vector_name};
use crate::tasks::{Comm, Selection, TaskFilter};
use vtrace_image::symbols::{FuncId, Symbolizer};

mod text;

const IF: u64 = 1 << 9;

/// A name and how many steps (or events) it had.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Count {
    /// The name.
    pub name: String,
    /// How many.
    pub count: u64,
}

/// One routine's row.
#[derive(Clone, Debug, Serialize)]
pub struct RoutineCount {
    /// The routine.
    pub name: String,
    /// Steps executed in the routine itself.
    pub self_steps: u64,
    /// Steps in it and in everything it called or was interrupted by
    /// (recursive activations counted once).
    pub total_steps: u64,
    /// Times it was entered by a call.
    pub calls: u64,
}

/// How the memory references spread over cache lines and pages.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Locality {
    /// Memory references (explicit operands and implied stack accesses).
    pub references: u64,
    /// Distinct 64-byte lines touched.
    pub distinct_lines: u64,
    /// Distinct 4 KiB pages touched.
    pub distinct_pages: u64,
    /// References to a 64-byte line touched before: references minus
    /// distinct lines.
    pub reused: u64,
    /// `reused` over `references`.
    pub reuse_ratio: f64,
}

/// Where interrupts were disabled.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DisabledStretches {
    /// Steps with RFLAGS.IF clear.
    pub steps: u64,
    /// Stretches of consecutive such steps.
    pub stretches: u64,
    /// Steps in the longest.
    pub longest: u64,
    /// Step number where the longest began, and the routine there.
    pub longest_from: Option<u64>,
    /// The routine where it began.
    pub longest_in: Option<String>,
}

/// Interrupts and exceptions of one vector.
#[derive(Clone, Debug, Serialize)]
pub struct VectorCount {
    /// The vector.
    pub vector: u8,
    /// Its name ("page fault", "timer").
    pub name: String,
    /// How many were entered.
    pub count: u64,
}

/// Everything `vtrace analyze stats` reports.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    /// The tasks counted (`--pid`, `--comm`), in words; `None` for all.
    pub tasks: Option<String>,
    /// On a trace of several CPUs with none selected, how many CPUs'
    /// steps are added up here; `None` for one CPU's.
    pub cpus_added_up: Option<u32>,
    /// Steps counted.
    pub steps: u64,
    /// Steps by mnemonic, most first.
    pub mnemonics: Vec<Count>,
    /// Steps by instruction class, most first.
    pub classes: Vec<Count>,
    /// Routines, by self steps.
    pub routines: Vec<RoutineCount>,
    /// Memory operands by addressing mode.
    pub addressing_modes: Vec<Count>,
    /// How the memory references spread.
    pub locality: Locality,
    /// Interrupts and exceptions, by vector.
    pub interrupts: Vec<VectorCount>,
    /// Where interrupts were disabled.
    pub interrupts_disabled: DisabledStretches,
    /// Calls made (with a task filter: routines entered by a call).
    pub calls: u64,
    /// Returns run (with a task filter: routines left by a return).
    pub returns: u64,
    /// Switches between call stacks: tasks where the trace names them,
    /// else address spaces (of the whole trace, filter or not).
    pub address_space_switches: u64,
    /// Irregular flows (`## divided level ##`).
    pub divided_levels: u64,
    /// The deepest call stack.
    pub deepest_stack: usize,
    /// Steps the trace does not have (gaps, paused tracing, bad segments).
    pub breaks: u64,
    /// Self steps by call stack (outermost first), for flame graphs.
    #[serde(skip)]
    pub folded: Vec<(Vec<String>, u64)>,
}

/// Counts that add up across segments as they are.
#[derive(Default)]
struct Counts {
    steps: u64,
    mnemonics: FxHashMap<iced_x86::Mnemonic, u64>,
    classes: FxHashMap<Class, u64>,
    addressing: FxHashMap<AddressingMode, u64>,
    references: u64,
    lines: FxHashSet<u64>,
    pages: FxHashSet<u64>,
    vectors: FxHashMap<u8, u64>,
    disabled_steps: u64,
}

fn add_all<K: std::hash::Hash + Eq>(to: &mut FxHashMap<K, u64>, from: FxHashMap<K, u64>) {
    for (k, v) in from {
        *to.entry(k).or_default() += v;
    }
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.steps += other.steps;
        add_all(&mut self.mnemonics, other.mnemonics);
        add_all(&mut self.classes, other.classes);
        add_all(&mut self.addressing, other.addressing);
        add_all(&mut self.vectors, other.vectors);
        self.references += other.references;
        self.lines.extend(other.lines);
        self.pages.extend(other.pages);
        self.disabled_steps += other.disabled_steps;
    }
}

/// One segment's counts.
#[derive(Default)]
struct Part {
    counts: Counts,
    /// Number of the segment's first step.
    first_step: u64,
    /// IF-clear runs: the one open at the segment's start (length), the
    /// longest inside (length, first step, pc), the one open at the end.
    leading: u64,
    first_pc: u64,
    all_disabled: bool,
    inner: Option<(u64, u64, u64)>,
    trailing: Option<(u64, u64, u64)>,
    /// IF-clear runs that began and ended inside the segment.
    stretches: u64,
}

/// Counts one segment, a record at a time.
struct SegmentCounter<'a> {
    /// The running task, whose steps are counted where selected.
    tasks: Selection<'a>,
    p: Part,
    before: Option<Regs>,
    number: u64,
    /// The IF-clear run in progress: (length, first step, pc), and whether
    /// it began at the segment's first step.
    run: Option<(u64, u64, u64)>,
    run_from_start: bool,
}

impl<'a> SegmentCounter<'a> {
    fn new(info: &SegmentInfo, filter: &'a TaskFilter) -> Self {
        SegmentCounter {
            tasks: Selection::new(filter),
            p: Part {
                all_disabled: true,
                first_step: info.first_step,
                ..Default::default()
            },
            before: None,
            number: info.first_step,
            run: None,
            run_from_start: false,
        }
    }
}

impl SegmentPass for SegmentCounter<'_> {
    type Output = Part;

    fn pass_over_step(&mut self) {
        self.number = self.number.saturating_add(1);
    }

    fn record(&mut self, record: SegmentRecord<'_>) {
        let (s, info) = match record {
            SegmentRecord::Step(_, _) if !self.tasks.selected() => {
                // Another task's step: what follows is not compared with
                // the last counted one.
                self.before = None;
                self.number = self.number.saturating_add(1);
                return;
            }
            SegmentRecord::Step(s, info) => (s, info),
            SegmentRecord::Event(Event::Interrupt { vector, .. }) => {
                if self.tasks.selected() {
                    *self.p.counts.vectors.entry(*vector).or_default() += 1;
                }
                // Its delivery moved the stack: the handler's first step
                // does not address memory from the registers before.
                self.before = None;
                return;
            }
            SegmentRecord::Event(Event::Gap { .. } | Event::TraceStop(_)) => {
                self.before = None;
                return;
            }
            SegmentRecord::Event(e) => {
                self.tasks.follow(e);
                return;
            }
        };
        let p = &mut self.p;
        let c = &mut p.counts;
        if c.steps == 0 {
            p.first_pc = s.pc;
        }
        *c.mnemonics.entry(info.mnemonic).or_default() += 1;
        *c.classes.entry(info.class).or_default() += 1;
        if let Some(mode) = info.addressing {
            *c.addressing.entry(mode).or_default() += 1;
        }
        if let Some(regs) = &self.before {
            for addr in memory_addresses(info, regs) {
                c.references += 1;
                c.lines.insert(addr >> 6);
                c.pages.insert(addr >> 12);
            }
        }
        if s.regs.rflags & IF == 0 {
            c.disabled_steps += 1;
            match &mut self.run {
                Some(r) => r.0 += 1,
                None => {
                    self.run_from_start = c.steps == 0;
                    self.run = Some((1, self.number, s.pc));
                }
            }
        } else {
            p.all_disabled = false;
            if let Some(r) = self.run.take() {
                if self.run_from_start {
                    p.leading = r.0;
                } else {
                    p.stretches += 1;
                    if p.inner.is_none_or(|i| r.0 > i.0) {
                        p.inner = Some(r);
                    }
                }
            }
        }
        self.before = Some(s.regs);
        p.counts.steps += 1;
        self.number = self.number.saturating_add(1);
    }

    fn finish(self) -> Part {
        let mut p = self.p;
        if p.all_disabled {
            p.leading = p.counts.steps;
        } else {
            p.trailing = self.run;
        }
        p
    }
}

/// Merges parts in order; IF-clear runs join across segment borders.
#[derive(Default)]
struct Totals {
    counts: Counts,
    disabled: DisabledStretches,
    longest_pc: Option<u64>,
    /// The run open at the end of what was merged so far.
    open: Option<(u64, u64, u64)>,
}

impl Totals {
    fn close(&mut self, run: (u64, u64, u64)) {
        self.disabled.stretches += 1;
        self.consider(run);
    }

    fn consider(&mut self, run: (u64, u64, u64)) {
        if run.0 > self.disabled.longest {
            self.disabled.longest = run.0;
            self.disabled.longest_from = Some(run.1);
            self.longest_pc = Some(run.2);
        }
    }

    fn merge(&mut self, p: Part) {
        self.counts.add(p.counts);
        self.disabled.stretches += p.stretches;
        // The run open before this segment goes on through its leading run.
        let open = self.open.take();
        if p.leading > 0 {
            let joined = match open {
                Some((len, from, pc)) => (len + p.leading, from, pc),
                None => (p.leading, p.first_step, p.first_pc),
            };
            if p.all_disabled {
                self.open = Some(joined);
            } else {
                self.close(joined);
            }
        } else if let Some(run) = open {
            self.close(run);
        }
        if let Some(inner) = p.inner {
            self.consider(inner);
        }
        if !p.all_disabled {
            self.open = p.trailing;
        }
    }
}

/// What a flame graph's stacks start from: the task's name where the
/// trace names tasks (as perf's start from the command), else the address
/// space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum FlameRoot {
    Task(Comm),
    Space(u64),
}

/// Gathers what the level engine knows per routine and per call path.
#[derive(Default)]
pub(crate) struct Profile {
    self_steps: FxHashMap<FuncId, u64>,
    total_steps: FxHashMap<FuncId, u64>,
    calls: FxHashMap<FuncId, u64>,
    /// Self steps by the name of the task they ran in (where the trace
    /// names tasks) and call path.
    by_node: FxHashMap<(FlameRoot, u32), u64>,
    divided: u64,
    entered_by_call: u64,
    left_by_return: u64,
}

impl LevelSink for Profile {
    fn enter(&mut self, frame: &FrameView) {
        if frame.kind == EntryKind::Call {
            self.entered_by_call += 1;
        }
        *self.calls.entry(frame.func).or_default() += 1;
    }

    fn exit(&mut self, frame: &FrameView, how: ExitKind) {
        *self.self_steps.entry(frame.func).or_default() += frame.self_steps;
        if !frame.recursive {
            *self.total_steps.entry(frame.func).or_default() += frame.total_steps;
        }
        *self
            .by_node
            .entry((
                frame
                    .task
                    .map_or(FlameRoot::Space(frame.cr3), |t| FlameRoot::Task(t.comm)),
                frame.node,
            ))
            .or_default() += frame.self_steps;
        if how == ExitKind::Return {
            self.left_by_return += 1;
        }
    }

    fn irregular(&mut self, _: u64, _: usize, _: crate::levels::Irregular) {
        self.divided += 1;
    }
}

fn sorted(map: impl IntoIterator<Item = (String, u64)>) -> Vec<Count> {
    let mut v: Vec<Count> = map
        .into_iter()
        .map(|(name, count)| Count { name, count })
        .collect();
    v.sort_by(|a, b| b.count.cmp(&a.count).then(a.name.cmp(&b.name)));
    v
}

/// Self steps by call path (outermost routine first) as they come,
/// unsorted, a path maybe more than once (see [`added_up`]); where the
/// trace names tasks, a path starts with the task's name, as perf's
/// flame graphs start with the command.
pub(crate) fn call_paths<'a>(
    engine: &'a LevelEngine,
    profile: &'a Profile,
    symbols: &'a Symbolizer,
) -> impl Iterator<Item = (Vec<String>, u64)> + 'a {
    profile
        .by_node
        .iter()
        .filter(|(_, c)| **c > 0)
        .map(|((root, node), c)| {
            let path = engine.path(*node);
            let root = match root {
                FlameRoot::Task(comm) => comm.to_string(),
                FlameRoot::Space(cr3) => space_root(*cr3),
            };
            (
                std::iter::once(root)
                    .chain(path.into_iter().map(|f| routine_label(symbols, f)))
                    .collect(),
                *c,
            )
        })
}

/// `folded` sorted, each path once with the steps of all its copies.
pub(crate) fn added_up(mut folded: Vec<(Vec<String>, u64)>) -> Vec<(Vec<String>, u64)> {
    folded.sort();
    folded.dedup_by(|b, a| {
        let same = a.0 == b.0;
        if same {
            a.1 = a.1.saturating_add(b.1);
        }
        same
    });
    folded
}

/// Reads the trace and computes the statistics of the steps of the tasks
/// `filter` selects (all, when it is empty). On a trace of several CPUs
/// with none selected, every CPU's steps added up, as perf's system-wide
/// counts are: a pass each, since each CPU has call stacks of its own.
pub fn collect(
    trace: &Trace,
    symbols: &Symbolizer,
    filter: &TaskFilter,
    progress: Progress<'_>,
) -> Result<Stats> {
    let mut totals = Totals::default();
    let mut profile = Profile::default();
    let mut counts = LevelCounts::default();
    let mut folded = Vec::new();
    let cpus = trace.each_cpu();
    let passes = cpus.len() as u64;
    let cpus_added_up = (cpus.len() > 1).then_some(trace.metadata.cpu_count());
    for (pass, only) in (0u64..).zip(cpus) {
        let progress = crate::input::pass_progress(progress, pass, passes);
        let mut sink = SelectedTasks::new(profile, filter);
        let engine = LevelPass::new(trace, symbols)
            .cpu(only)
            .progress(&progress)
            .run_with(
                &mut sink,
                |info| SegmentCounter::new(info, filter),
                |part| totals.merge(part),
            )?;
        profile = sink.inner;
        // The stretch with interrupts disabled that was open at the end
        // of this CPU's steps ends there.
        if let Some(run) = totals.open.take() {
            totals.close(run);
        }
        // Call paths are the engine's nodes: each pass's, named.
        folded.extend(call_paths(&engine, &profile, symbols));
        profile.by_node.clear();
        counts.add(&engine.counts);
    }
    // Paths whose routines share names (a program's symbols, added once
    // per address space it ran in, or one CPU's and another's) add up.
    let folded = added_up(folded);
    let routines = routine_counts(&profile, symbols);
    let totals_counts = totals.counts;
    let interrupts = vector_counts(&totals_counts);
    let mut disabled = totals.disabled;
    disabled.steps = totals_counts.disabled_steps;
    disabled.longest_in = totals
        .longest_pc
        .filter(|pc| *pc != 0)
        .map(|pc| symbols.format(pc, 0));
    let totals = totals_counts;
    let (references, distinct_lines) = (totals.references, totals.lines.len() as u64);
    let whole = filter.is_everything();
    Ok(Stats {
        tasks: (!whole).then(|| filter.describe()),
        cpus_added_up,
        steps: totals.steps,
        mnemonics: sorted(
            totals
                .mnemonics
                .iter()
                .map(|(m, c)| (format!("{m:?}").to_lowercase(), *c)),
        ),
        classes: sorted(
            totals
                .classes
                .iter()
                .map(|(k, c)| (k.name().to_string(), *c)),
        ),
        addressing_modes: sorted(
            totals
                .addressing
                .iter()
                .map(|(k, c)| (k.name().to_string(), *c)),
        ),
        routines,
        locality: Locality::of(references, distinct_lines, totals.pages.len() as u64),
        interrupts,
        interrupts_disabled: disabled,
        calls: if whole {
            counts.calls
        } else {
            profile.entered_by_call
        },
        returns: if whole {
            counts.returns
        } else {
            profile.left_by_return
        },
        address_space_switches: counts.switches,
        divided_levels: profile.divided,
        deepest_stack: counts.max_depth,
        breaks: counts.breaks,
        folded,
    })
}

/// Each routine's self and total steps and calls, busiest first.
fn routine_counts(profile: &Profile, symbols: &Symbolizer) -> Vec<RoutineCount> {
    let mut routines: Vec<RoutineCount> = profile
        .self_steps
        .iter()
        .map(|(f, s)| RoutineCount {
            name: routine_label(symbols, *f),
            self_steps: *s,
            total_steps: profile.total_steps.get(f).copied().unwrap_or(0),
            calls: profile.calls.get(f).copied().unwrap_or(0),
        })
        .collect();
    routines.sort_by(|a, b| b.self_steps.cmp(&a.self_steps).then(a.name.cmp(&b.name)));
    routines
}

/// Interrupts and exceptions by vector.
fn vector_counts(counts: &Counts) -> Vec<VectorCount> {
    let mut interrupts: Vec<VectorCount> = counts
        .vectors
        .iter()
        .map(|(v, c)| VectorCount {
            vector: *v,
            name: vector_name(*v),
            count: *c,
        })
        .collect();
    interrupts.sort_by_key(|v| v.vector);
    interrupts
}

impl Locality {
    /// Of `references` memory references to `lines` distinct cache lines
    /// on `pages` distinct pages.
    fn of(references: u64, lines: u64, pages: u64) -> Locality {
        let reused = references.saturating_sub(lines);
        Locality {
            references,
            distinct_lines: lines,
            distinct_pages: pages,
            reused,
            reuse_ratio: if references == 0 {
                0.0
            } else {
                reused as f64 / references as f64
            },
        }
    }
}
