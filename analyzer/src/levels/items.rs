//! Per-segment work: turns a segment's records into [`Item`]s, the
//! engine's input, with each step's routine resolved and runs of steps
//! within one routine folded.

use vtrace_storage::{Event, FunctionEdge, RecordRef, Step, TraceReason};

use crate::input::SegmentInfo;
use crate::insn::{InsnCache, InsnInfo};
use crate::tasks::{TaskId, TaskTracker};
use vtrace_image::symbols::{cr3_root, FuncId, Symbolizer, Thunk, UNKNOWN_FUNC};
use vtrace_x86::Flow;

/// A record as per-segment work sees it: a step comes with its decoded
/// instruction, looked up once for all the work on it.
#[derive(Clone, Copy, Debug)]
pub enum SegmentRecord<'a> {
    /// A step and its decoded instruction.
    Step(&'a Step, &'a InsnInfo),
    /// An event.
    Event(&'a Event),
}

impl<'a> SegmentRecord<'a> {
    /// `record`, with a step's instruction from the segment's `cache`.
    pub fn new(record: RecordRef<'a>, cache: &'a mut InsnCache) -> Self {
        match record {
            RecordRef::Step(s) => SegmentRecord::Step(s, cache.get(s)),
            RecordRef::Event(e) => SegmentRecord::Event(e),
        }
    }
}

/// One step or boundary, as the engine needs it. Built in parallel per
/// segment by an `ItemBuilder`, consumed in order by
/// [`LevelEngine::push`](super::LevelEngine::push).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    /// One step.
    Step {
        /// Its number in the trace.
        step: u64,
        /// Its pc.
        pc: u64,
        /// Its address space.
        cr3: u64,
        /// Its routine.
        func: FuncId,
        /// Where it sends control.
        flow: Flow,
        /// Its length in bytes.
        len: u8,
    },
    /// `steps` more steps in the routine and address space of the step
    /// (or run) just before, each reached from the one before it by
    /// falling through or by a jump within the routine, with no other item
    /// between. They cannot change the call stack, so the engine only
    /// counts them; `step`, `pc`, `len` and `flow` are the last one's.
    /// Most of a trace is such runs, and folding them keeps the in-order
    /// part of the analysis, the one that cannot run in parallel, short.
    Run {
        /// The last one's number.
        step: u64,
        /// How many.
        steps: u32,
        /// The last one's pc.
        pc: u64,
        /// The last one's length.
        len: u8,
        /// The last one's flow.
        flow: Flow,
    },
    /// An interrupt or exception, entered before the next step.
    Interrupt {
        /// Its vector.
        vector: u8,
    },
    /// The next step is this system call (see `crate::syscalls`).
    SystemCall(crate::syscalls::SystemCall),
    /// From the next step on, this task runs (or the running one took
    /// this name).
    Task(TaskId),
    /// A guest mark (hypercall or `vtrace ctl mark`).
    Mark {
        /// The mark's id.
        id: u64,
        /// Its value.
        value: u64,
    },
    /// The next step is a `ret` and this is RAX after it: the value the
    /// routine it leaves returns (`funcgraph-retval`).
    ReturnValue(u64),
    /// Steps the trace does not have: a gap, a `--trace-function`
    /// routine's task switched out and in again, or a damaged segment
    /// skipped. The call stack holds across it.
    Break,
    /// Tracing started again after the guest ran untraced: what was on
    /// the call stack is over (a `--trace-function` routine returned with
    /// the step before).
    Restart,
    /// A note between steps (a capture): the text is the segment's
    /// `index`-th (see `ItemBuilder::finish_with_notes`), which keeps
    /// items small and `Copy`.
    Note {
        /// The note's index in the segment's notes.
        index: u32,
    },
}

/// A step's routine is the one the step before ran in: a return thunk's
/// steps at the start of a segment, whose owner only the in-order engine
/// knows. Never a symbol's id (ids count symbols).
pub(super) const PREVIOUS_FUNC: FuncId = u32::MAX - 1;

/// Routines a [`FuncResolver`] remembers.
const RECENT_ROUTINES: usize = 4;

/// Resolves routines with a cache of the last few: consecutive steps are
/// almost always in the same routine, and a kernel's calls mostly go back
/// and forth between a caller, its callee and a helper every function
/// calls (`__fentry__`), while a table lookup per step would dominate.
pub struct FuncResolver<'a> {
    symbols: &'a Symbolizer,
    /// (start, end, address-space root, routine), most recent first.
    recent: [(u64, u64, u64, FuncId); RECENT_ROUTINES],
}

impl<'a> std::fmt::Debug for FuncResolver<'a> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FuncResolver").finish_non_exhaustive()
    }
}

impl<'a> FuncResolver<'a> {
    /// A resolver over `symbols`, its cache empty.
    pub fn new(symbols: &'a Symbolizer) -> Self {
        FuncResolver {
            symbols,
            // Empty ranges: never hit.
            recent: [(1, 0, 0, UNKNOWN_FUNC); RECENT_ROUTINES],
        }
    }

    /// The routine of `pc` in address space `cr3`.
    pub fn func(&mut self, pc: u64, cr3: u64) -> FuncId {
        let root = cr3_root(cr3);
        let hit = self
            .recent
            .iter()
            .position(|&(start, end, r, _)| pc >= start && pc < end && r == root);
        if let Some(i) = hit {
            let entry = self.recent[i];
            self.recent.copy_within(0..i, 1);
            self.recent[0] = entry;
            return entry.3;
        }
        match self.symbols.resolve(pc, cr3) {
            Some(r) => {
                self.recent.copy_within(0..RECENT_ROUTINES - 1, 1);
                self.recent[0] = (r.start, r.end, root, r.func);
                r.func
            }
            None => UNKNOWN_FUNC,
        }
    }
}

/// A step inside an indirect-branch trampoline, held until the routine it
/// leads to is known.
#[derive(Clone, Copy, Debug)]
struct InTransit {
    step: u64,
    pc: u64,
    cr3: u64,
    func: FuncId,
    len: u8,
}

/// Builds one segment's level items, a record at a time.
///
/// Trampolines ([`Thunk`]) are folded into the routines around them: the
/// steps of a return thunk count as the routine that jumped to it (its
/// `ret` then returns from that routine), and the steps of an
/// indirect-branch thunk (with any return thunk it goes through) count as
/// the routine it reaches, with their own calls and returns ignored, so an
/// indirect call through a retpoline enters its target like a direct call.
pub struct ItemBuilder<'a> {
    symbols: &'a Symbolizer,
    funcs: FuncResolver<'a>,
    out: Vec<Item>,
    step: u64,
    /// What the next step follows after a start of tracing.
    restarted: Option<Item>,
    /// Address space and routine a next step in them may join the last
    /// item as part of a run: set only after a step that neither calls nor
    /// returns.
    open: Option<(u64, FuncId)>,
    /// The last routine looked up and whether it is a trampoline.
    last_thunk: Option<(FuncId, Option<Thunk>)>,
    /// Routine of the last step outside trampolines, since the last
    /// interrupt or break.
    behind: Option<FuncId>,
    transit: Vec<InTransit>,
    tasks: TaskTracker,
    notes: Vec<String>,
}

impl<'a> std::fmt::Debug for ItemBuilder<'a> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ItemBuilder").finish_non_exhaustive()
    }
}

impl<'a> ItemBuilder<'a> {
    /// A builder for the segment `info`, naming routines with `symbols`.
    pub fn new(info: &SegmentInfo, symbols: &'a Symbolizer) -> Self {
        ItemBuilder {
            symbols,
            funcs: FuncResolver::new(symbols),
            out: Vec::new(),
            step: info.first_step,
            restarted: None,
            open: None,
            last_thunk: None,
            behind: None,
            transit: Vec::new(),
            tasks: TaskTracker::default(),
            notes: Vec::new(),
        }
    }

    fn boundary(&mut self, item: Item) {
        self.flush_transit(None);
        self.out.push(item);
        self.open = None;
        self.behind = None;
    }

    fn thunk(&mut self, func: FuncId) -> Option<Thunk> {
        match self.last_thunk {
            Some((f, kind)) if f == func => kind,
            _ => {
                let kind = self.symbols.thunk(func);
                self.last_thunk = Some((func, kind));
                kind
            }
        }
    }

    /// Emits the held trampoline steps as part of `target`, or of their
    /// own routine when what they lead to is not known (an interrupt or
    /// the segment's end came first). Their calls and returns are
    /// internal, so they go as plain jumps either way.
    fn flush_transit(&mut self, target: Option<FuncId>) {
        for t in std::mem::take(&mut self.transit) {
            self.push_step(
                t.step,
                t.pc,
                t.cr3,
                target.unwrap_or(t.func),
                Flow::Jump,
                t.len,
            );
        }
    }

    fn push_step(&mut self, step: u64, pc: u64, cr3: u64, func: FuncId, flow: Flow, len: u8) {
        let joins = self.open == Some((cr3, func));
        let extended = joins
            && match self.out.last_mut() {
                Some(Item::Run {
                    step: last,
                    steps,
                    pc: p,
                    len: l,
                    flow: f,
                }) if *steps < u32::MAX => {
                    (*last, *p, *l, *f) = (step, pc, len, flow);
                    *steps += 1;
                    true
                }
                _ => false,
            };
        if !extended {
            self.out.push(if joins {
                Item::Run {
                    step,
                    steps: 1,
                    pc,
                    len,
                    flow,
                }
            } else {
                Item::Step {
                    step,
                    pc,
                    cr3,
                    func,
                    flow,
                    len,
                }
            });
        }
        self.open = (flow.in_line() || flow.jumps()).then_some((cr3, func));
    }

    /// Before a `ret`: the value it returns. The `ret` then starts an
    /// item of its own rather than ending a run, so the value stays next
    /// to it.
    fn return_value(&mut self, flow: Flow, step: &Step) {
        if flow == Flow::Return {
            self.out.push(Item::ReturnValue(step.regs.gpr[0]));
            self.open = None;
        }
    }

    /// Counts a step left out (another CPU's): the steps after it keep
    /// their numbers in the trace.
    pub fn pass_over_step(&mut self) {
        self.step = self.step.saturating_add(1);
        // A run holds consecutive steps only.
        self.open = None;
    }

    /// Adds one record.
    pub fn record(&mut self, record: SegmentRecord<'_>) {
        match record {
            SegmentRecord::Step(s, insn) => {
                if let Some(item) = self.restarted.take() {
                    self.boundary(item);
                }
                let func = self.funcs.func(s.pc, s.cr3);
                let flow = insn.flow;
                if let Some(call) = crate::syscalls::made_by(s) {
                    self.out.push(Item::SystemCall(call));
                }
                let len = s.bytes.len() as u8;
                let step = self.step;
                self.step = self.step.saturating_add(1);
                let held = InTransit {
                    step,
                    pc: s.pc,
                    cr3: s.cr3,
                    func,
                    len,
                };
                match self.thunk(func) {
                    Some(Thunk::IndirectBranch) => self.transit.push(held),
                    Some(Thunk::Return) if !self.transit.is_empty() => self.transit.push(held),
                    Some(Thunk::Return) => {
                        // Where this segment has not shown the routine that
                        // jumped here (the segment starts in the thunk),
                        // the engine knows it.
                        let owner = self.behind.unwrap_or(PREVIOUS_FUNC);
                        // SRSO's thunk calls a stub that drops the return
                        // address again: only its `ret` returns, from the
                        // owner.
                        let flow = if flow == Flow::Call { Flow::Jump } else { flow };
                        self.return_value(flow, s);
                        self.push_step(step, s.pc, s.cr3, owner, flow, len);
                    }
                    None => {
                        self.flush_transit(Some(func));
                        self.behind = Some(func);
                        self.return_value(flow, s);
                        self.push_step(step, s.pc, s.cr3, func, flow, len);
                    }
                }
            }
            SegmentRecord::Event(Event::Interrupt { vector, .. }) => {
                self.boundary(Item::Interrupt { vector: *vector })
            }
            SegmentRecord::Event(Event::Mark { id, value }) => self.boundary(Item::Mark {
                id: *id,
                value: *value,
            }),
            SegmentRecord::Event(Event::Gap { .. }) => self.boundary(Item::Break),
            // A stop seals its segment: the start that follows is where
            // the next segment tells that steps are missing.
            SegmentRecord::Event(Event::TraceStart(reason)) => {
                self.restarted = Some(match reason {
                    TraceReason::Function {
                        edge: FunctionEdge::SwitchedIn,
                        ..
                    } => Item::Break,
                    _ => Item::Restart,
                })
            }
            SegmentRecord::Event(
                e @ (Event::Task { .. } | Event::Running { .. } | Event::TaskName { .. }),
            ) => {
                if self.tasks.follow(e) {
                    if let Some(task) = self.tasks.current().copied() {
                        // Steps held in a trampoline were the task's before.
                        self.flush_transit(None);
                        self.out.push(Item::Task(task));
                        self.open = None;
                    }
                }
            }
            SegmentRecord::Event(
                e @ (Event::Capture { .. } | Event::Probe { .. } | Event::ProbeValues(_)),
            ) => self.note_event(e),
            SegmentRecord::Event(_) => {}
        }
    }

    /// A capture, a probe fire or its values: a note between steps.
    fn note_event(&mut self, e: &Event) {
        let text = match e {
            Event::Capture {
                name,
                addr,
                length,
                bytes,
            } => crate::event_text::describe_capture(name, *addr, *length, bytes),
            Event::Probe { name, pc, args } => crate::event_text::describe_probe(name, *pc, args),
            Event::ProbeValues(fields) => crate::event_text::describe_probe_values(fields),
            _ => return,
        };
        if let Ok(index) = u32::try_from(self.notes.len()) {
            self.notes.push(text);
            self.boundary(Item::Note { index });
        }
    }

    /// The items, in order (notes dropped).
    #[cfg(test)]
    pub fn finish(self) -> Vec<Item> {
        self.finish_with_notes().0
    }

    /// The items, and the texts of their [`Item::Note`]s.
    pub fn finish_with_notes(mut self) -> (Vec<Item>, Vec<String>) {
        self.flush_transit(None);
        (self.out, self.notes)
    }
}
