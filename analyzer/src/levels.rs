//! The level engine: follows calls, returns, jumps between routines,
//! interrupts and switches through a trace with a call stack per task
//! where the trace names Linux tasks (each has its own kernel stack, and
//! kernel threads borrow address spaces), else per address space, and
//! tells a [`LevelSink`] about routine entries and exits, big-level
//! boundaries and irregular control flow.
//!
//! A *big level* is a stretch of the trace from its start, an interrupt or
//! exception entry, a system-call entry, a return from one of those, or a
//! task or address-space switch, to the next such boundary. *Small levels*
//! are the call depths within it. Memory is the deepest stack times the
//! number of stacks, plus one trie node per distinct call path.

use rustc_hash::FxHashMap;
use vtrace_storage::{Event, RecordRef, Step};

use crate::input::SegmentInfo;
use crate::insn::{Flow, InsnCache, InsnInfo};
use crate::symbols::{cr3_root, FuncId, Symbolizer, Thunk, UNKNOWN_FUNC};
use crate::tasks::{TaskId, TaskTracker};

/// One step or boundary, as the engine needs it. Built in parallel per
/// segment by an [`ItemBuilder`], consumed in order by
/// [`LevelEngine::push`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    Step {
        step: u64,
        pc: u64,
        cr3: u64,
        func: FuncId,
        flow: Flow,
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
        step: u64,
        steps: u32,
        pc: u64,
        len: u8,
        flow: Flow,
    },
    Interrupt {
        vector: u8,
    },
    /// The next step is a system call of this number (see
    /// [`crate::syscalls`]).
    SystemCallNumber(u64),
    /// From the next step on, this task runs (or the running one took
    /// this name).
    Task(TaskId),
    /// A guest mark (hypercall or `vtrace ctl mark`).
    Mark {
        id: u64,
        value: u64,
    },
    /// Steps the trace does not have: a gap, or tracing stopped and started
    /// again, or a damaged segment skipped.
    Break,
}

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

impl<'a> FuncResolver<'a> {
    pub fn new(symbols: &'a Symbolizer) -> Self {
        FuncResolver {
            symbols,
            // Empty ranges: never hit.
            recent: [(1, 0, 0, UNKNOWN_FUNC); RECENT_ROUTINES],
        }
    }

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
    stopped: bool,
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
}

impl<'a> ItemBuilder<'a> {
    pub fn new(info: &SegmentInfo, symbols: &'a Symbolizer) -> Self {
        ItemBuilder {
            symbols,
            funcs: FuncResolver::new(symbols),
            out: Vec::new(),
            step: info.first_step,
            stopped: false,
            open: None,
            last_thunk: None,
            behind: None,
            transit: Vec::new(),
            tasks: TaskTracker::default(),
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
        self.open = matches!(flow, Flow::Next | Flow::Jump).then_some((cr3, func));
    }

    /// Adds one record.
    pub fn record(&mut self, record: SegmentRecord<'_>) {
        match record {
            SegmentRecord::Step(s, insn) => {
                if std::mem::take(&mut self.stopped) {
                    self.boundary(Item::Break);
                }
                let func = self.funcs.func(s.pc, s.cr3);
                let flow = insn.flow;
                if let Some(number) = crate::syscalls::number_of(s) {
                    self.out.push(Item::SystemCallNumber(number));
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
                        let owner = self.behind.unwrap_or(func);
                        self.push_step(step, s.pc, s.cr3, owner, flow, len);
                    }
                    None => {
                        self.flush_transit(Some(func));
                        self.behind = Some(func);
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
            SegmentRecord::Event(Event::TraceStop(_)) => self.stopped = true,
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
            SegmentRecord::Event(_) => {}
        }
    }

    pub fn finish(mut self) -> Vec<Item> {
        self.flush_transit(None);
        self.out
    }
}

/// A record as per-segment work sees it: a step comes with its decoded
/// instruction, looked up once for all the work on it.
#[derive(Clone, Copy, Debug)]
pub enum SegmentRecord<'a> {
    Step(&'a Step, &'a InsnInfo),
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

/// Work done on each segment in the same pass over its records as the
/// level items (see [`run_with`]).
pub trait SegmentPass {
    type Output: Send;
    /// Sees each record in order.
    fn record(&mut self, record: SegmentRecord<'_>);
    fn finish(self) -> Self::Output;
}

/// No extra work.
impl SegmentPass for () {
    type Output = ();
    fn record(&mut self, _: SegmentRecord<'_>) {}
    fn finish(self) {}
}

/// How a routine was entered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// First routine of the trace, of an address space, or after a break.
    Root,
    Call,
    /// Reached by a jump from the routine it replaces at the same depth
    /// (a tail call, or an interrupt stub jumping to common code).
    Jump {
        from: FuncId,
    },
    Interrupt {
        vector: u8,
    },
    SystemCall,
}

/// How a routine was left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitKind {
    Return,
    /// A return or jump went to a frame further down: this one was skipped.
    Unwound,
    /// Replaced by a routine it jumped to.
    JumpedAway,
    TraceEnd,
}

/// A routine activation as sinks see it.
#[derive(Clone, Copy, Debug)]
pub struct FrameView {
    pub func: FuncId,
    pub entry_pc: u64,
    pub entry_step: u64,
    /// Position on its call stack (0 = bottom).
    pub depth: usize,
    pub kind: EntryKind,
    pub cr3: u64,
    /// The task whose stack it is on, where the trace names tasks.
    pub task: Option<TaskId>,
    /// Node in the call-path trie ([`LevelEngine::path`]).
    pub node: u32,
    pub self_steps: u64,
    /// Steps in it and everything it called or was interrupted by.
    pub total_steps: u64,
    /// Whether the same routine is further down the stack (its total is
    /// already counted there).
    pub recursive: bool,
    /// Last step executed in it (valid at exit).
    pub last_step: u64,
}

/// Irregular control flow, marked `## divided level ##` in nest diagrams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Irregular {
    /// A `ret` went somewhere no frame on the stack returns to (a `ret`
    /// used as a jump or call, or a stack switched under the tracer).
    ReturnNotOnStack { to: u64 },
    /// A `ret` returned to a frame below the top, skipping `skipped` frames.
    ReturnPastFrames { skipped: usize },
    /// A jump into a routine already on the stack, below the top.
    JumpIntoStack { skipped: usize },
    /// An interrupt return to a place no interrupt frame returns to.
    InterruptReturnUnmatched { to: u64 },
}

impl Irregular {
    pub fn describe(&self) -> String {
        match self {
            Irregular::ReturnNotOnStack { to } => {
                format!("ret to {to:#x}, which no frame on the stack returns to")
            }
            Irregular::ReturnPastFrames { skipped } => {
                format!("ret past {skipped} frame(s) to one further down the stack")
            }
            Irregular::JumpIntoStack { skipped } => {
                format!("jump back into a routine on the stack, leaving {skipped} frame(s)")
            }
            Irregular::InterruptReturnUnmatched { to } => {
                format!("interrupt return to {to:#x}, which no interrupt frame returns to")
            }
        }
    }
}

/// Why a big level began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BigLevelCause {
    TraceStart,
    Interrupt {
        vector: u8,
    },
    /// A system call: its number where the trace shows it (x86-64
    /// `syscall` from user mode).
    SystemCall {
        number: Option<u64>,
    },
    /// Back from an interrupt or system call into what it interrupted.
    Resume,
    /// Another address space, in a trace that names no tasks.
    Switch {
        from: u64,
    },
    /// Another task runs ([`BigLevel::task`]).
    TaskSwitch {
        from: Option<TaskId>,
    },
    /// After steps the trace does not have.
    Break,
}

/// The start of a big level.
#[derive(Clone, Copy, Debug)]
pub struct BigLevel {
    pub step: u64,
    pub cause: BigLevelCause,
    pub cr3: u64,
    /// The running task, where the trace names tasks.
    pub task: Option<TaskId>,
    /// Interrupt and system-call frames on the stack: how deeply this level
    /// is nested in what it interrupted.
    pub nesting: usize,
    /// The routine that was running when the level began (what an
    /// interrupt interrupted), if any.
    pub interrupted: Option<(FuncId, u64)>,
}

/// What consumes the engine's findings. Every method has a default that
/// ignores it.
pub trait LevelSink {
    fn big_level(&mut self, _level: &BigLevel) {}
    fn enter(&mut self, _frame: &FrameView) {}
    fn exit(&mut self, _frame: &FrameView, _how: ExitKind) {}
    fn irregular(&mut self, _step: u64, _depth: usize, _what: Irregular) {}
    /// A mark between steps; `step` is the number of the next step.
    fn mark(&mut self, _step: u64, _cr3: u64, _id: u64, _value: u64) {}
    /// From the next step on, `task` runs (or the running task was
    /// renamed).
    fn task(&mut self, _task: &TaskId) {}
}

/// Whose call stack frames go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum StackKey {
    /// An address space's (its page-table root), where no task is named.
    Space(u64),
    /// A task's, by thread id.
    Task(u32),
}

impl StackKey {
    /// The stack of `task`'s steps, or of address space `root` where no
    /// task is named.
    fn of(task: Option<TaskId>, root: u64) -> StackKey {
        match task {
            Some(t) => StackKey::Task(t.tid),
            None => StackKey::Space(root),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Prev {
    pc: u64,
    len: u8,
    flow: Flow,
}

#[derive(Clone, Debug)]
struct Frame {
    view: FrameView,
    /// Where a return from it lands; `None` for a frame copied into a new
    /// address space, which matches the first interrupt return.
    ret: Option<u64>,
    /// For interrupt and system-call frames: the step before the entry, to
    /// go on from after the return as if nothing had happened.
    saved_prev: Option<Prev>,
}

impl Frame {
    fn is_entry(&self) -> bool {
        matches!(
            self.view.kind,
            EntryKind::Interrupt { .. } | EntryKind::SystemCall
        ) || self.saved_prev.is_some()
    }
}

/// Counters of what the engine saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LevelCounts {
    pub steps: u64,
    pub calls: u64,
    pub returns: u64,
    pub interrupts: u64,
    pub switches: u64,
    pub irregular: u64,
    pub breaks: u64,
    pub max_depth: usize,
}

/// The engine. Feed it items in trace order, then call [`finish`].
///
/// [`finish`]: LevelEngine::finish
pub struct LevelEngine {
    stack: Vec<Frame>,
    cr3: Option<u64>,
    /// The running task, where the trace names tasks.
    task: Option<TaskId>,
    /// The task that ran the last step: `stack` is its (with `cr3`, the
    /// address space's where no task is named).
    stepped: Option<TaskId>,
    saved: FxHashMap<StackKey, Vec<Frame>>,
    prev: Option<Prev>,
    prev_step: Option<u64>,
    pending_interrupt: Option<u8>,
    /// The number of the system call the next step makes.
    syscall_number: Option<u64>,
    after_break: bool,
    nodes: Vec<(u32, FuncId)>,
    node_index: FxHashMap<(u32, FuncId), u32>,
    pub counts: LevelCounts,
}

/// Trie node of the empty path.
pub const ROOT_NODE: u32 = 0;

impl Default for LevelEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl LevelEngine {
    pub fn new() -> Self {
        LevelEngine {
            stack: Vec::new(),
            cr3: None,
            task: None,
            stepped: None,
            saved: FxHashMap::default(),
            prev: None,
            prev_step: None,
            pending_interrupt: None,
            syscall_number: None,
            after_break: false,
            nodes: vec![(u32::MAX, UNKNOWN_FUNC)],
            node_index: FxHashMap::default(),
            counts: LevelCounts::default(),
        }
    }

    /// Routines from the outermost to `node`.
    pub fn path(&self, mut node: u32) -> Vec<FuncId> {
        let mut out = Vec::new();
        while node != ROOT_NODE {
            let (parent, func) = self.nodes[node as usize];
            out.push(func);
            node = parent;
        }
        out.reverse();
        out
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn node(&mut self, parent: u32, func: FuncId) -> u32 {
        if let Some(n) = self.node_index.get(&(parent, func)) {
            return *n;
        }
        let n = self.nodes.len() as u32;
        self.nodes.push((parent, func));
        self.node_index.insert((parent, func), n);
        n
    }

    /// Index of the innermost interrupt or system-call frame.
    fn innermost_entry(&self) -> Option<usize> {
        self.stack.iter().rposition(|f| f.is_entry())
    }

    fn nesting(&self) -> usize {
        self.stack.iter().filter(|f| f.is_entry()).count()
    }

    fn big_level(&self, sink: &mut impl LevelSink, step: u64, cause: BigLevelCause) {
        let entering = matches!(
            cause,
            BigLevelCause::Interrupt { .. } | BigLevelCause::SystemCall { .. }
        );
        sink.big_level(&BigLevel {
            step,
            cause,
            cr3: self.cr3.unwrap_or(0),
            task: self.task,
            nesting: self.nesting() + usize::from(entering),
            interrupted: self
                .stack
                .last()
                .filter(|_| entering)
                .map(|f| (f.view.func, f.view.entry_pc)),
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn push_frame(
        &mut self,
        sink: &mut impl LevelSink,
        func: FuncId,
        pc: u64,
        step: u64,
        kind: EntryKind,
        ret: Option<u64>,
        saved_prev: Option<Prev>,
    ) {
        let parent = self.stack.last().map(|f| f.view.node).unwrap_or(ROOT_NODE);
        let node = self.node(parent, func);
        let view = FrameView {
            func,
            entry_pc: pc,
            entry_step: step,
            depth: self.stack.len(),
            kind,
            cr3: self.cr3.unwrap_or(0),
            task: self.task,
            node,
            self_steps: 0,
            total_steps: 0,
            recursive: self.stack.iter().any(|f| f.view.func == func),
            last_step: step,
        };
        sink.enter(&view);
        self.stack.push(Frame {
            view,
            ret,
            saved_prev,
        });
        self.counts.max_depth = self.counts.max_depth.max(self.stack.len());
    }

    fn pop_frame(&mut self, sink: &mut impl LevelSink, how: ExitKind) -> Option<Frame> {
        let mut frame = self.stack.pop()?;
        frame.view.total_steps += frame.view.self_steps;
        sink.exit(&frame.view, how);
        if let Some(parent) = self.stack.last_mut() {
            parent.view.total_steps += frame.view.total_steps;
            parent.view.last_step = parent.view.last_step.max(frame.view.last_step);
        }
        Some(frame)
    }

    /// Pops frames above `index`, then the one at `index`.
    fn unwind_to(&mut self, sink: &mut impl LevelSink, index: usize) -> Option<Frame> {
        while self.stack.len() > index + 1 {
            self.pop_frame(sink, ExitKind::Unwound);
        }
        self.pop_frame(sink, ExitKind::Return)
    }

    /// Goes on with the stack of `to`, saving the current one, `from`'s.
    fn switch(
        &mut self,
        sink: &mut impl LevelSink,
        from: StackKey,
        to: StackKey,
        root: u64,
        step: u64,
    ) {
        self.cr3 = Some(root);
        self.counts.switches += 1;
        let next = match self.saved.remove(&to) {
            Some(stack) => stack,
            // Where the trace first names a task, the steps before were
            // that task's: it keeps their stack.
            None if matches!((from, to), (StackKey::Space(_), StackKey::Task(_))) => {
                for f in &mut self.stack {
                    f.view.task = self.task;
                }
                return;
            }
            None => self.seed(root, step),
        };
        let old = std::mem::replace(&mut self.stack, next);
        self.saved.insert(from, old);
        let cause = match from {
            StackKey::Task(_) => BigLevelCause::TaskSwitch { from: self.stepped },
            StackKey::Space(space) => BigLevelCause::Switch { from: space },
        };
        self.big_level(sink, step, cause);
    }

    /// The stack of a task or address space the engine has not seen: it
    /// goes on with the kernel path that switched to it, from the
    /// innermost interrupt entry up (every task is switched out and in
    /// through the same kernel routines); the copied entry frame's return
    /// is not known.
    fn seed(&self, root: u64, step: u64) -> Vec<Frame> {
        let Some(entry) = self.innermost_entry() else {
            return Vec::new();
        };
        let mut seed: Vec<Frame> = self.stack[entry..].to_vec();
        seed[0].ret = None;
        seed[0].saved_prev = None;
        for (i, f) in seed.iter_mut().enumerate() {
            f.view.depth = i;
            f.view.self_steps = 0;
            f.view.total_steps = 0;
            f.view.cr3 = root;
            f.view.task = self.task;
            f.view.entry_step = step;
        }
        seed
    }

    /// Handles control reaching `func` at `pc` other than by call or
    /// return: a jump to another routine, or the place a broken return
    /// landed.
    fn arrive(&mut self, sink: &mut impl LevelSink, func: FuncId, pc: u64, step: u64) {
        let Some(top) = self.stack.last() else {
            self.push_frame(sink, func, pc, step, EntryKind::Root, None, None);
            return;
        };
        if top.view.func == func {
            return;
        }
        // Only frames of the current big level count: a re-entered
        // interrupt stub jumping to common code that an outer, interrupted
        // activation also runs is not a jump back into that activation.
        let level_base = self.innermost_entry().map_or(0, |i| i + 1);
        if func != UNKNOWN_FUNC {
            if let Some(i) = self.stack[level_base..]
                .iter()
                .rposition(|f| f.view.func == func)
                .map(|i| i + level_base)
            {
                let skipped = self.stack.len() - 1 - i;
                self.counts.irregular += 1;
                sink.irregular(step, i, Irregular::JumpIntoStack { skipped });
                while self.stack.len() > i + 1 {
                    self.pop_frame(sink, ExitKind::Unwound);
                }
                return;
            }
        }
        // A jump to another routine: it takes the place of the one that
        // jumped, with its way back and, for an interrupt stub, its kind.
        let Some(old) = self.pop_frame(sink, ExitKind::JumpedAway) else {
            return;
        };
        let kind = match old.view.kind {
            EntryKind::Call | EntryKind::Jump { .. } => EntryKind::Jump {
                from: old.view.func,
            },
            other => other,
        };
        self.push_frame(sink, func, pc, step, kind, old.ret, old.saved_prev);
    }

    /// Handles one step's arrival given the step before it.
    fn transition(
        &mut self,
        sink: &mut impl LevelSink,
        prev: Option<Prev>,
        func: FuncId,
        pc: u64,
        step: u64,
    ) {
        let Some(prev) = prev else {
            self.arrive(sink, func, pc, step);
            return;
        };
        let next_pc = prev.pc.wrapping_add(u64::from(prev.len));
        match prev.flow {
            Flow::Call if pc != next_pc => {
                self.counts.calls += 1;
                self.push_frame(sink, func, pc, step, EntryKind::Call, Some(next_pc), None);
            }
            Flow::SystemCall if pc != next_pc => {
                let number = self.syscall_number.take();
                self.big_level(sink, step, BigLevelCause::SystemCall { number });
                let resume = Prev {
                    flow: Flow::Next,
                    ..prev
                };
                self.push_frame(
                    sink,
                    func,
                    pc,
                    step,
                    EntryKind::SystemCall,
                    Some(next_pc),
                    Some(resume),
                );
            }
            Flow::Return => {
                self.counts.returns += 1;
                match self.stack.iter().rposition(|f| f.ret == Some(pc)) {
                    Some(i) => {
                        let skipped = self.stack.len() - 1 - i;
                        if skipped > 0 {
                            self.counts.irregular += 1;
                            sink.irregular(step, i, Irregular::ReturnPastFrames { skipped });
                        }
                        self.unwind_to(sink, i);
                        self.arrive(sink, func, pc, step);
                    }
                    None => {
                        self.counts.irregular += 1;
                        let depth = self.stack.len().saturating_sub(1);
                        sink.irregular(step, depth, Irregular::ReturnNotOnStack { to: pc });
                        self.arrive(sink, func, pc, step);
                    }
                }
            }
            Flow::InterruptReturn => {
                let found = self
                    .stack
                    .iter()
                    .rposition(|f| f.ret == Some(pc) || (f.is_entry() && f.ret.is_none()));
                match found {
                    Some(i) => {
                        let frame = self.unwind_to(sink, i);
                        self.big_level(sink, step, BigLevelCause::Resume);
                        let resumed = frame.and_then(|f| f.saved_prev);
                        self.transition(sink, resumed, func, pc, step);
                    }
                    None => {
                        self.counts.irregular += 1;
                        let depth = self.stack.len().saturating_sub(1);
                        sink.irregular(step, depth, Irregular::InterruptReturnUnmatched { to: pc });
                        self.big_level(sink, step, BigLevelCause::Resume);
                        self.arrive(sink, func, pc, step);
                    }
                }
            }
            _ => self.arrive(sink, func, pc, step),
        }
    }

    /// Feeds one item.
    pub fn push(&mut self, item: Item, sink: &mut impl LevelSink) {
        match item {
            Item::Interrupt { vector } => {
                self.pending_interrupt = Some(vector);
            }
            Item::SystemCallNumber(number) => self.syscall_number = Some(number),
            Item::Task(task) => {
                if self.task.replace(task) != Some(task) {
                    sink.task(&task);
                }
            }
            Item::Mark { id, value } => {
                let next = self.prev_step.map_or(0, |s| s.saturating_add(1));
                sink.mark(next, self.cr3.unwrap_or(0), id, value);
            }
            Item::Run {
                step,
                steps,
                pc,
                len,
                flow,
            } => {
                if let Some(top) = self.stack.last_mut() {
                    top.view.self_steps += u64::from(steps);
                    top.view.last_step = step;
                }
                self.counts.steps += u64::from(steps);
                self.prev = Some(Prev { pc, len, flow });
                self.prev_step = Some(step);
            }
            Item::Break => {
                self.counts.breaks += 1;
                self.after_break = true;
                self.prev = None;
            }
            Item::Step {
                step,
                pc,
                cr3,
                func,
                flow,
                len,
            } => {
                let root = cr3_root(cr3);
                let key = StackKey::of(self.task, root);
                match self.cr3.map(|c| StackKey::of(self.stepped, c)) {
                    None => {
                        self.cr3 = Some(root);
                        self.big_level(sink, step, BigLevelCause::TraceStart);
                    }
                    Some(current) if current != key => self.switch(sink, current, key, root, step),
                    // A task changes address space on its own stack
                    // (switching to the next task's, an exec).
                    Some(_) => self.cr3 = Some(root),
                }
                self.stepped = self.task;
                if std::mem::take(&mut self.after_break) {
                    self.big_level(sink, step, BigLevelCause::Break);
                }
                if let Some(vector) = self.pending_interrupt.take() {
                    self.counts.interrupts += 1;
                    // An interrupt right after an interrupt return (`sti;
                    // hlt` idling, interrupts queued while disabled) hides
                    // where that return went, but it returned from the
                    // innermost entry all the same.
                    let mut before = self.prev;
                    if before.is_some_and(|p| p.flow == Flow::InterruptReturn) {
                        if let Some(i) = self.innermost_entry() {
                            before = self.unwind_to(sink, i).and_then(|f| f.saved_prev);
                        }
                    }
                    self.big_level(sink, step, BigLevelCause::Interrupt { vector });
                    // The step before is finished after the handler
                    // returns, against the pc it returns to: an interrupt
                    // that lands on a call's target still enters the callee.
                    let resume = before.map(|p| Prev {
                        flow: if p.flow == Flow::SystemCall {
                            Flow::Next
                        } else {
                            p.flow
                        },
                        ..p
                    });
                    self.push_frame(
                        sink,
                        func,
                        pc,
                        step,
                        EntryKind::Interrupt { vector },
                        None,
                        Some(resume.unwrap_or(Prev {
                            pc: 0,
                            len: 0,
                            flow: Flow::Jump,
                        })),
                    );
                } else {
                    let prev = self.prev;
                    self.transition(sink, prev, func, pc, step);
                }
                if let Some(top) = self.stack.last_mut() {
                    top.view.self_steps += 1;
                    top.view.last_step = step;
                }
                self.counts.steps += 1;
                self.prev = Some(Prev { pc, len, flow });
                self.prev_step = Some(step);
            }
        }
    }

    /// Closes every open frame, of the current stack first, then of the
    /// others in order of address space or task id.
    pub fn finish(&mut self, sink: &mut impl LevelSink) {
        while self.pop_frame(sink, ExitKind::TraceEnd).is_some() {}
        let mut others: Vec<StackKey> = self.saved.keys().copied().collect();
        others.sort_unstable();
        for key in others {
            if let Some(stack) = self.saved.remove(&key) {
                self.cr3 = stack.first().map(|f| f.view.cr3).or(self.cr3);
                self.stack = stack;
                while self.pop_frame(sink, ExitKind::TraceEnd).is_some() {}
            }
        }
    }
}

/// Runs the level engine over a whole trace: items are built in parallel
/// across segments and fed to `sink` in order. Missing steps between
/// segments become breaks.
pub fn run(
    trace: &crate::input::Trace,
    symbols: &Symbolizer,
    sink: &mut impl LevelSink,
    progress: crate::input::Progress<'_>,
) -> crate::error::Result<LevelEngine> {
    run_with(trace, symbols, sink, |_| (), |_| {}, progress)
}

/// [`run`], plus per-segment work done in parallel in the same pass as the
/// items: `pass` makes it for a segment, and `merge` gets its output in
/// trace order.
pub fn run_with<P: SegmentPass>(
    trace: &crate::input::Trace,
    symbols: &Symbolizer,
    sink: &mut impl LevelSink,
    pass: impl Fn(&SegmentInfo) -> P + Sync,
    mut merge: impl FnMut(P::Output),
    progress: crate::input::Progress<'_>,
) -> crate::error::Result<LevelEngine> {
    let mut engine = LevelEngine::new();
    let mut expected: Option<u64> = None;
    trace.for_each_ordered(
        &trace.segments,
        |info, records| {
            let mut cache = InsnCache::default();
            let mut items = ItemBuilder::new(info, symbols);
            let mut extra = pass(info);
            while let Some(r) = records.next_record() {
                let r = SegmentRecord::new(r, &mut cache);
                items.record(r);
                extra.record(r);
            }
            (items.finish(), extra.finish())
        },
        |chunk| {
            if expected.is_some_and(|e| e != chunk.info.first_step) {
                engine.push(Item::Break, sink);
            }
            expected = Some(chunk.info.first_step.saturating_add(chunk.info.steps));
            match chunk.result {
                Ok((items, part)) => {
                    for item in items {
                        engine.push(item, sink);
                    }
                    merge(part);
                }
                Err(_) => engine.push(Item::Break, sink),
            }
            Ok::<(), crate::error::AnalyzeError>(())
        },
        progress,
    )?;
    engine.finish(sink);
    Ok(engine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbols::{Scope, Symbol, SymbolTable};
    use vtrace_storage::{CpuMode, InsnBytes, Record, Regs, Step, TraceReason};

    /// Routines of 0x100 bytes at the given addresses.
    fn routines(list: &[(u64, &str)]) -> Symbolizer {
        let end = list.iter().map(|(start, _)| start + 0x100).max();
        let table = SymbolTable::new(
            list.iter()
                .map(|(start, name)| Symbol {
                    start: *start,
                    size: 0x100,
                    name: name.to_string(),
                })
                .collect(),
            end,
        );
        let mut s = Symbolizer::new();
        s.add("test", Scope::Any, table, None);
        s
    }

    fn symbols() -> Symbolizer {
        routines(&[(0x1000, "a"), (0x2000, "b"), (0x3000, "c")])
    }

    fn step(pc: u64, bytes: &[u8]) -> Record {
        Record::Step(Step {
            pc,
            bytes: InsnBytes::new(bytes).expect("test bytes"),
            cr3: 0x1000,
            mode: CpuMode::Long64,
            cpl: 0,
            regs: Regs::default(),
        })
    }

    const NOP: &[u8] = &[0x90];

    /// Straight runs, a jump within a routine, a call, a tail jump, a
    /// return, an interrupt and its return, a mark, and tracing stopped
    /// and started again.
    fn records() -> Vec<Record> {
        vec![
            step(0x1000, NOP),
            step(0x1001, NOP),
            step(0x1002, &[0xeb, 0x00]),             // jmp 0x1004
            step(0x1004, &[0xe8, 0xf7, 0x0f, 0, 0]), // call 0x2000
            step(0x2000, NOP),
            step(0x2001, NOP),
            step(0x2002, &[0xe9, 0xf9, 0x0f, 0, 0]), // jmp 0x3000
            step(0x3000, NOP),
            step(0x3001, &[0xc3]), // ret to 0x1009
            step(0x1009, NOP),
            Record::Event(Event::Interrupt {
                vector: 32,
                error_code: None,
                source: vtrace_storage::InterruptSource::Injected,
            }),
            step(0x2010, NOP),
            step(0x2011, NOP),
            step(0x2012, &[0x48, 0xcf]), // iretq to 0x100a
            step(0x100a, NOP),
            Record::Event(Event::Mark { id: 1, value: 2 }),
            step(0x100b, NOP),
            step(0x100c, NOP),
            Record::Event(Event::TraceStop(TraceReason::Hotkey)),
            Record::Event(Event::TraceStart(TraceReason::Hotkey)),
            step(0x100d, NOP),
            step(0x100e, NOP),
        ]
    }

    /// Every callback, in order, as text.
    #[derive(Default)]
    struct Log(Vec<String>);

    impl LevelSink for Log {
        fn big_level(&mut self, level: &BigLevel) {
            self.0.push(format!("{level:?}"));
        }
        fn enter(&mut self, frame: &FrameView) {
            self.0.push(format!("enter {frame:?}"));
        }
        fn exit(&mut self, frame: &FrameView, how: ExitKind) {
            self.0.push(format!("exit {frame:?} {how:?}"));
        }
        fn irregular(&mut self, step: u64, depth: usize, what: Irregular) {
            self.0.push(format!("irregular {step} {depth} {what:?}"));
        }
        fn mark(&mut self, step: u64, cr3: u64, id: u64, value: u64) {
            self.0.push(format!("mark {step} {cr3} {id} {value}"));
        }
    }

    fn feed(items: &[Item]) -> (Vec<String>, LevelCounts) {
        let mut engine = LevelEngine::new();
        let mut log = Log::default();
        for item in items {
            engine.push(*item, &mut log);
        }
        engine.finish(&mut log);
        (log.0, engine.counts)
    }

    /// The items of `records` as one segment from step 0.
    fn items(symbols: &Symbolizer, records: &[Record]) -> Vec<Item> {
        let info = SegmentInfo {
            index: 0,
            first_step: 0,
            steps: 0,
        };
        let mut cache = InsnCache::default();
        let mut builder = ItemBuilder::new(&info, symbols);
        for r in records {
            builder.record(SegmentRecord::new(r.borrowed(), &mut cache));
        }
        builder.finish()
    }

    /// Entries and exits by name (with the task's id where named and the
    /// self steps), irregularities and task switches, as text.
    struct Calls<'a>(&'a Symbolizer, Vec<String>);

    impl LevelSink for Calls<'_> {
        fn big_level(&mut self, level: &BigLevel) {
            if let BigLevelCause::TaskSwitch { from } = level.cause {
                let to = level.task.map(|t| t.to_string());
                let from = from.map(|t| t.to_string());
                self.1.push(format!("switch to {to:?} from {from:?}"));
            }
        }
        fn enter(&mut self, f: &FrameView) {
            let tid = f.task.map(|t| format!(" {}", t.tid)).unwrap_or_default();
            self.1.push(format!("enter {}{tid}", self.0.name(f.func)));
        }
        fn exit(&mut self, f: &FrameView, how: ExitKind) {
            let tid = f.task.map(|t| format!(" {}", t.tid)).unwrap_or_default();
            let name = self.0.name(f.func);
            self.1
                .push(format!("exit {name}{tid} {} {how:?}", f.self_steps));
        }
        fn irregular(&mut self, _: u64, _: usize, what: Irregular) {
            self.1.push(format!("{what:?}"));
        }
    }

    /// Runs the engine over `items`; what [`Calls`] saw, and the counts.
    fn calls(symbols: &Symbolizer, items: Vec<Item>) -> (Vec<String>, LevelCounts) {
        let mut engine = LevelEngine::new();
        let mut calls = Calls(symbols, Vec::new());
        for item in items {
            engine.push(item, &mut calls);
        }
        engine.finish(&mut calls);
        (calls.1, engine.counts)
    }

    #[test]
    fn calls_through_retpolines_and_return_thunks_nest_like_direct_ones() {
        let symbols = routines(&[
            (0x1000, "a"),
            (0x2000, "b"),
            (0x4000, "__x86_return_thunk"),
            (0x5000, "__x86_indirect_thunk_array"),
        ]);
        let records = [
            step(0x1000, &[0xe8, 0xfb, 0x3f, 0, 0]), // call __x86_indirect_thunk_array
            step(0x5000, &[0xe8, 0x07, 0, 0, 0]),    // call +0xc (the retpoline)
            step(0x500c, &[0x48, 0x89, 0x04, 0x24]), // mov [rsp], rax
            step(0x5010, &[0xe9, 0xeb, 0xef, 0xff, 0xff]), // jmp __x86_return_thunk
            step(0x4000, &[0xc3]),                   // ret: into b
            step(0x2000, NOP),
            step(0x2001, &[0xe9, 0xfa, 0x1f, 0, 0]), // jmp __x86_return_thunk
            step(0x4000, &[0xc3]),                   // ret: back to a
            step(0x1005, NOP),
        ];
        let (calls, counts) = calls(&symbols, items(&symbols, &records));
        assert_eq!(
            calls,
            [
                "enter a",
                "enter b",
                // The retpoline's four steps, b's two and the return
                // thunk's ret.
                "exit b 7 Return",
                "exit a 2 TraceEnd",
            ]
        );
        assert_eq!(counts.irregular, 0);
    }

    #[test]
    fn folded_runs_change_nothing_the_sinks_see() {
        let symbols = symbols();
        let info = SegmentInfo {
            index: 0,
            first_step: 100,
            steps: 0,
        };
        let mut cache = InsnCache::default();
        let mut builder = ItemBuilder::new(&info, &symbols);
        for r in records() {
            builder.record(SegmentRecord::new(r.borrowed(), &mut cache));
        }
        let folded = builder.finish();

        // The same records, one item per step, built independently.
        let mut plain = Vec::new();
        let mut number = info.first_step;
        let mut stopped = false;
        for r in records() {
            match r {
                Record::Step(s) => {
                    if std::mem::take(&mut stopped) {
                        plain.push(Item::Break);
                    }
                    plain.push(Item::Step {
                        step: number,
                        pc: s.pc,
                        cr3: s.cr3,
                        func: symbols
                            .resolve(s.pc, s.cr3)
                            .map_or(UNKNOWN_FUNC, |r| r.func),
                        flow: cache.get(&s).flow,
                        len: s.bytes.len() as u8,
                    });
                    number += 1;
                }
                Record::Event(Event::Interrupt { vector, .. }) => {
                    plain.push(Item::Interrupt { vector })
                }
                Record::Event(Event::Mark { id, value }) => plain.push(Item::Mark { id, value }),
                Record::Event(Event::TraceStop(_)) => stopped = true,
                Record::Event(_) => {}
            }
        }

        let runs = folded
            .iter()
            .filter(|i| matches!(i, Item::Run { .. }))
            .count();
        assert!(runs >= 4, "straight code is folded: {folded:?}");
        assert!(folded.len() < plain.len());
        let (folded_log, folded_counts) = feed(&folded);
        let (plain_log, plain_counts) = feed(&plain);
        assert_eq!(folded_log, plain_log);
        assert_eq!(folded_counts, plain_counts);
        assert_eq!(plain_counts.steps, 18);
        assert_eq!(plain_counts.calls, 1);
        assert_eq!(plain_counts.interrupts, 1);
        assert_eq!(plain_counts.breaks, 1);
    }

    #[test]
    fn each_task_has_its_own_stack_and_a_switch_back_returns_into_it() {
        let symbols = routines(&[
            (0x1000, "schedule"),
            (0x2000, "__switch_to_asm"),
            (0x3000, "__switch_to"),
        ]);
        let task = |tid: u32, comm: &str| {
            Record::Event(Event::Task {
                tid,
                pid: tid,
                comm: comm.into(),
            })
        };
        // Two tasks in one address space (kernel threads borrow one) switch
        // as Linux does: `__switch_to_asm` changes stacks and jumps to
        // `__switch_to`, where the trace names the next task, which then
        // returns into its own `schedule`.
        let records = [
            task(1, "a"),
            step(0x1000, &[0xe8, 0xfb, 0x0f, 0, 0]), // call __switch_to_asm
            step(0x2000, NOP),
            step(0x2001, &[0xe9, 0xfa, 0x0f, 0, 0]), // jmp __switch_to
            task(2, "b"),
            step(0x3000, NOP),
            step(0x3001, &[0xc3]), // b's first return: not on b's stack
            step(0x1005, NOP),
            step(0x1006, &[0xe8, 0xf5, 0x0f, 0, 0]), // call __switch_to_asm
            step(0x2000, NOP),
            step(0x2001, &[0xe9, 0xfa, 0x0f, 0, 0]), // jmp __switch_to
            task(1, "a"),
            step(0x3000, NOP),
            step(0x3001, &[0xc3]), // back into a's schedule
            step(0x1005, NOP),
        ];
        let (calls, counts) = calls(&symbols, items(&symbols, &records));
        assert_eq!(
            calls,
            [
                "enter schedule 1",
                "enter __switch_to_asm 1",
                "switch to Some(\"b-2\") from Some(\"a-1\")",
                "enter __switch_to 2",
                "ReturnNotOnStack { to: 4101 }",
                "exit __switch_to 2 2 JumpedAway",
                "enter schedule 2",
                "enter __switch_to_asm 2",
                "switch to Some(\"a-1\") from Some(\"b-2\")",
                "exit __switch_to_asm 1 2 JumpedAway",
                "enter __switch_to 1",
                "exit __switch_to 1 2 Return",
                "exit schedule 1 2 TraceEnd",
                "exit __switch_to_asm 2 2 TraceEnd",
                "exit schedule 2 2 TraceEnd",
            ]
        );
        assert_eq!(counts.switches, 2);
        assert_eq!(counts.irregular, 1, "only b's first return");
    }
}
