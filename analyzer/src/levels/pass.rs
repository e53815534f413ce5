//! The pass over a trace: items built in parallel per segment, with any
//! other per-segment work in the same reading, fed in order to the
//! engine.

use super::engine::LevelEngine;
use super::items::{Item, ItemBuilder, SegmentRecord};
use super::sink::LevelSink;
use crate::error::{AnalyzeError, Result};
use crate::input::{Progress, SegmentInfo, Trace};
use crate::insn::InsnCache;
use vtrace_image::symbols::{FuncId, Symbolizer};
use vtrace_storage::{Event, RecordRef};

/// Work done on each segment in the same pass over its records as the
/// level items (see [`LevelPass::run_with`]).
pub trait SegmentPass {
    /// What the pass makes of one segment.
    type Output: Send;
    /// Sees each record in order.
    fn record(&mut self, record: SegmentRecord<'_>);
    /// A step another CPU ran, left out (`--cpu N`): the next step's
    /// number is one more.
    fn pass_over_step(&mut self) {}
    /// What it made of the segment.
    fn finish(self) -> Self::Output;
}

/// No extra work.
impl SegmentPass for () {
    type Output = ();
    fn record(&mut self, _: SegmentRecord<'_>) {}
    fn finish(self) {}
}

/// A pass of the level engine over a trace, set up as a builder: items
/// are built in parallel across segments and fed to a sink in order, and
/// missing steps between segments become breaks. Of the steps of the CPU
/// the trace's own choice gives ([`Trace::one_cpu`]) unless
/// [`LevelPass::cpu`] names one; then one of three runs:
/// [`LevelPass::run`] (the items alone), [`LevelPass::run_with`] (plus
/// per-segment work in the same reading) or [`LevelPass::run_following`]
/// (that work with the routine each step ran in).
#[derive(Clone, Copy)]
pub struct LevelPass<'a> {
    trace: &'a Trace,
    symbols: &'a Symbolizer,
    /// `Some(only)`: CPU `only`'s records (`None`: every record).
    cpu: Option<Option<u32>>,
    progress: Progress<'a>,
}

impl std::fmt::Debug for LevelPass<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LevelPass")
            .field("cpu", &self.cpu)
            .finish_non_exhaustive()
    }
}

impl<'a> LevelPass<'a> {
    /// A pass over `trace`, its routines named by `symbols`, saying no
    /// progress.
    pub fn new(trace: &'a Trace, symbols: &'a Symbolizer) -> Self {
        LevelPass {
            trace,
            symbols,
            cpu: None,
            progress: &crate::input::no_progress,
        }
    }

    /// Of CPU `only`'s records alone (`None`: every record), whatever the
    /// trace's own choice: a timeline that gives each CPU its own tracks,
    /// an export of every CPU one after another.
    pub fn cpu(self, only: Option<u32>) -> Self {
        LevelPass {
            cpu: Some(only),
            ..self
        }
    }

    /// Saying how far it got to `progress`.
    pub fn progress(self, progress: Progress<'a>) -> Self {
        LevelPass { progress, ..self }
    }

    /// The CPU whose records the pass reads (`None`: every record).
    fn only(&self) -> Result<Option<u32>> {
        match self.cpu {
            Some(only) => Ok(only),
            None => self.trace.one_cpu(),
        }
    }

    /// Runs the engine, feeding `sink`.
    pub fn run(self, sink: &mut impl LevelSink) -> Result<LevelEngine> {
        self.run_with(sink, |_| (), |_| {})
    }

    /// Runs the engine, feeding `sink`, with per-segment work done in
    /// parallel in the same pass as the items: `pass` makes it for a
    /// segment, and `merge` gets its output in trace order.
    pub fn run_with<P: SegmentPass>(
        self,
        sink: &mut impl LevelSink,
        pass: impl Fn(&SegmentInfo) -> P + Sync,
        mut merge: impl FnMut(P::Output),
    ) -> Result<LevelEngine> {
        let merge = |part, _: &SegmentInfo, _: &[RoutineRun]| {
            merge(part);
            Ok(())
        };
        self.read::<P, AnalyzeError, false>(sink, pass, merge)
    }

    /// [`LevelPass::run_with`], where `merge` also gets, for its segment,
    /// the routine each step ran in (in order, as [`RoutineRun`]s) and the
    /// segment: what a per-step export needs, and what a return thunk's
    /// steps at a segment's start owe to the segment before. An error from
    /// `merge` ends the pass with it.
    pub fn run_following<P: SegmentPass, E: From<AnalyzeError>>(
        self,
        sink: &mut impl LevelSink,
        pass: impl Fn(&SegmentInfo) -> P + Sync,
        merge: impl FnMut(P::Output, &SegmentInfo, &[RoutineRun]) -> Result<(), E>,
    ) -> Result<LevelEngine, E> {
        self.read::<P, E, true>(sink, pass, merge)
    }
}

/// Steps that ran in one routine, as the engine saw them: the routine on
/// top of the call stack after each of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutineRun {
    /// Number of the first step.
    pub first: u64,
    /// How many steps.
    pub steps: u64,
    /// The routine on top of the call stack.
    pub func: FuncId,
}

impl LevelPass<'_> {
    /// The pass; `FOLLOW` says whether routines are gathered per step, so the
    /// analyses that do not want them pay nothing for them.
    fn read<P: SegmentPass, E: From<AnalyzeError>, const FOLLOW: bool>(
        self,
        sink: &mut impl LevelSink,
        pass: impl Fn(&SegmentInfo) -> P + Sync,
        mut merge: impl FnMut(P::Output, &SegmentInfo, &[RoutineRun]) -> Result<(), E>,
    ) -> Result<LevelEngine, E> {
        let (trace, symbols, progress) = (self.trace, self.symbols, self.progress);
        let only = self.only()?;
        let mut engine = LevelEngine::new();
        let mut expected: Option<u64> = None;
        let mut runs: Vec<RoutineRun> = Vec::new();
        let read = trace.for_each_ordered(
            &trace.segments,
            |info, records| segment_items(info, records, symbols, &pass, only),
            |chunk| {
                if expected.is_some_and(|e| e != chunk.info.first_step) {
                    engine.push(Item::Break, sink);
                }
                expected = Some(chunk.info.first_step.saturating_add(chunk.info.steps));
                match chunk.result {
                    Ok(((items, notes), part)) => {
                        runs.clear();
                        for item in items {
                            let stepped = match item {
                                Item::Note { index } => {
                                    if let Some(text) = notes.get(index as usize) {
                                        engine.note(text, sink);
                                    }
                                    continue;
                                }
                                Item::Step { step, .. } => Some((step, 1)),
                                Item::Run { step, steps, .. } => Some((
                                    step.saturating_add(1).saturating_sub(u64::from(steps)),
                                    u64::from(steps),
                                )),
                                _ => None,
                            };
                            engine.push(item, sink);
                            if FOLLOW {
                                if let (Some((first, steps)), Some(func)) =
                                    (stepped, engine.top_func())
                                {
                                    match runs.last_mut() {
                                        Some(r)
                                            if r.func == func
                                                && r.first.saturating_add(r.steps) == first =>
                                        {
                                            r.steps += steps
                                        }
                                        _ => runs.push(RoutineRun { first, steps, func }),
                                    }
                                }
                            }
                        }
                        merge(part, &chunk.info, &runs).map_err(Halt::Failed)?;
                    }
                    Err(_) => engine.push(Item::Break, sink),
                }
                match sink.stopped() {
                    true => Err(Halt::SinkStopped),
                    false => Ok(()),
                }
            },
            progress,
        );
        match read {
            Ok(()) => engine.finish(sink),
            // The sink wants nothing more, not even the frames still open.
            Err(Halt::SinkStopped) => tracing::info!(
                "the output went away: stopped reading after step {} of {}",
                expected.unwrap_or(0),
                trace.steps()
            ),
            Err(Halt::Failed(e)) => return Err(e),
        }
        Ok(engine)
    }
}

/// Why a pass ended before the trace did.
enum Halt<E> {
    /// The sink wants no more ([`LevelSink::stopped`]).
    SinkStopped,
    /// Merging a segment's work failed.
    Failed(E),
}

/// One segment's items and its pass's result; where `only` names a CPU,
/// of that CPU's records alone.
fn segment_items<P: SegmentPass>(
    info: &SegmentInfo,
    records: &mut crate::input::Records<'_>,
    symbols: &Symbolizer,
    pass: &(impl Fn(&SegmentInfo) -> P + Sync),
    only: Option<u32>,
) -> ((Vec<Item>, Vec<String>), P::Output) {
    let mut cache = InsnCache::default();
    let mut items = ItemBuilder::new(info, symbols);
    let mut extra = pass(info);
    // A segment's records are CPU 0's until one names another.
    let mut cpu = 0;
    while let Some(r) = records.next_record() {
        if let Some(only) = only {
            match r {
                RecordRef::Event(Event::Cpu(c)) => {
                    cpu = *c;
                    continue;
                }
                // Another CPU's step keeps its number.
                RecordRef::Step(_) if cpu != only => {
                    items.pass_over_step();
                    extra.pass_over_step();
                    continue;
                }
                // Tracing starts and stops on every CPU at once.
                RecordRef::Event(Event::TraceStart(_) | Event::TraceStop(_)) => {}
                RecordRef::Event(_) if cpu != only => continue,
                _ => {}
            }
        }
        let r = SegmentRecord::new(r, &mut cache);
        items.record(r);
        extra.record(r);
    }
    (items.finish_with_notes(), extra.finish())
}
