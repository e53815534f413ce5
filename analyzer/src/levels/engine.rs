//! The engine proper: one call stack per task (or address space), a trie
//! of call paths, and the rules that turn items into entries, exits and
//! big levels.

use rustc_hash::FxHashMap;

use super::counts::LevelCounts;
use super::frames::{Entered, Frame, Prev, StackKey};
use super::items::{Item, PREVIOUS_FUNC};
use super::sink::{BigLevel, BigLevelCause, EntryKind, ExitKind, FrameView, Irregular, LevelSink};
use crate::tasks::TaskId;
use vtrace_image::symbols::{cr3_root, FuncId, UNKNOWN_FUNC};
use vtrace_x86::Flow;

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
    /// RAX after the next step, a `ret` ([`Item::ReturnValue`]).
    return_value: Option<u64>,
    /// What the frame a `ret` is popping returned.
    returned: Option<u64>,
    /// The number of the system call the next step makes.
    syscall: Option<crate::syscalls::SystemCall>,
    after_break: bool,
    /// The running stack is a task's or address space's first: its first
    /// returns go where no frame the engine saw returns to (a new task's
    /// crafted stack, Linux's ret_from_fork), which is its start, not
    /// irregular flow. Ends at the next big level.
    first_run: bool,
    nodes: Vec<(u32, FuncId)>,
    node_index: FxHashMap<(u32, FuncId), u32>,
    /// What it saw so far.
    pub counts: LevelCounts,
}

impl std::fmt::Debug for LevelEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LevelEngine").finish_non_exhaustive()
    }
}

/// Trie node of the empty path.
pub const ROOT_NODE: u32 = 0;

impl Default for LevelEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl LevelEngine {
    /// An engine that has seen nothing.
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
            return_value: None,
            returned: None,
            syscall: None,
            after_break: false,
            first_run: false,
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

    /// The routine running now: on top of the current call stack.
    pub fn top_func(&self) -> Option<FuncId> {
        self.stack.last().map(|f| f.view.func)
    }

    /// Call paths (trie nodes) met so far, the root included.
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

    /// Tells irregular flow, except where a first run's start explains
    /// it (see [`LevelEngine::first_run`]).
    fn irregular(&mut self, sink: &mut impl LevelSink, step: u64, depth: usize, what: Irregular) {
        let expected = self.first_run
            && matches!(
                what,
                Irregular::ReturnNotOnStack { .. } | Irregular::InterruptReturnUnmatched { .. }
            );
        if !expected {
            self.counts.irregular += 1;
            sink.irregular(step, depth, what);
        }
    }

    fn big_level(&mut self, sink: &mut impl LevelSink, step: u64, cause: BigLevelCause) {
        let switch = matches!(
            cause,
            BigLevelCause::Switch { .. } | BigLevelCause::TaskSwitch { .. }
        );
        if !switch {
            self.first_run = false;
        }
        let entering = matches!(
            cause,
            BigLevelCause::Interrupt { .. } | BigLevelCause::SystemCall { .. }
        );
        sink.big_level(&BigLevel {
            step,
            cause,
            cr3: self.cr3.unwrap_or(0),
            task: self.task,
            first_run: switch && self.first_run,
            nesting: self.nesting() + usize::from(entering),
            interrupted: self
                .stack
                .last()
                .filter(|_| entering)
                .map(|f| (f.view.func, f.view.entry_pc)),
        });
    }

    /// Opens a frame for the entry `at`, which returns to `ret` (where a
    /// call's return address is known), with `saved_prev` the step before
    /// it as the frame's exit resumes it.
    fn push_frame(
        &mut self,
        sink: &mut impl LevelSink,
        at: Entered,
        ret: Option<u64>,
        saved_prev: Option<Prev>,
    ) {
        let Entered {
            func,
            pc,
            step,
            kind,
        } = at;
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
            return_value: None,
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
        if how == ExitKind::Return {
            frame.view.return_value = self.returned.take();
        }
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
        let seen = self.saved.contains_key(&to);
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
        self.first_run = !seen;
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
            self.push_frame(
                sink,
                Entered::new(func, pc, step, EntryKind::Root),
                None,
                None,
            );
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
                self.irregular(sink, step, i, Irregular::JumpIntoStack { skipped });
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
        self.push_frame(
            sink,
            Entered::new(func, pc, step, kind),
            old.ret,
            old.saved_prev,
        );
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
                self.push_frame(
                    sink,
                    Entered::new(func, pc, step, EntryKind::Call),
                    Some(next_pc),
                    None,
                );
            }
            Flow::SystemCall if pc != next_pc => {
                let call = self.syscall.take();
                self.big_level(sink, step, BigLevelCause::SystemCall { call });
                let resume = Prev {
                    flow: Flow::Next,
                    ..prev
                };
                self.push_frame(
                    sink,
                    Entered::new(func, pc, step, EntryKind::SystemCall),
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
                            self.irregular(sink, step, i, Irregular::ReturnPastFrames { skipped });
                        }
                        self.returned = prev.value;
                        self.unwind_to(sink, i);
                        self.arrive(sink, func, pc, step);
                    }
                    None => {
                        let depth = self.stack.len().saturating_sub(1);
                        self.irregular(sink, step, depth, Irregular::ReturnNotOnStack { to: pc });
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
                        let system_call = frame
                            .as_ref()
                            .is_some_and(|f| f.view.kind == EntryKind::SystemCall);
                        self.big_level(sink, step, BigLevelCause::Resume { system_call });
                        let resumed = frame.and_then(|f| f.saved_prev);
                        self.transition(sink, resumed, func, pc, step);
                    }
                    None => {
                        let depth = self.stack.len().saturating_sub(1);
                        self.irregular(
                            sink,
                            step,
                            depth,
                            Irregular::InterruptReturnUnmatched { to: pc },
                        );
                        self.big_level(sink, step, BigLevelCause::Resume { system_call: false });
                        self.arrive(sink, func, pc, step);
                    }
                }
            }
            _ => self.arrive(sink, func, pc, step),
        }
    }

    /// Feeds a note (an [`Item::Note`]'s text): it goes inside the
    /// running routine, before the next step.
    pub fn note(&mut self, text: &str, sink: &mut impl LevelSink) {
        let next = self.prev_step.map_or(0, |s| s.saturating_add(1));
        sink.note(next, self.stack.len(), text);
    }

    /// Feeds one item.
    pub fn push(&mut self, item: Item, sink: &mut impl LevelSink) {
        match item {
            Item::Interrupt { vector } => {
                self.pending_interrupt = Some(vector);
            }
            Item::SystemCall(call) => self.syscall = Some(call),
            Item::Task(task) => {
                if self.task.replace(task) != Some(task) {
                    let next = self.prev_step.map_or(0, |s| s.saturating_add(1));
                    sink.task(next, &task);
                }
            }
            // Their text is with the segment's items: see `note`.
            Item::Note { .. } => {}
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
                self.prev = Some(Prev {
                    pc,
                    len,
                    flow,
                    value: self.return_value.take(),
                });
                self.prev_step = Some(step);
            }
            Item::Break => {
                self.counts.breaks += 1;
                self.after_break = true;
                self.prev = None;
            }
            // Nothing to end before the trace's first step.
            Item::Restart if self.cr3.is_none() => {}
            Item::Restart => {
                self.counts.breaks += 1;
                if let Some(prev) = self.prev.filter(|p| p.flow == Flow::Return) {
                    self.returned = prev.value;
                    self.pop_frame(sink, ExitKind::Return);
                }
                self.finish(sink);
                self.cr3 = None;
                self.prev = None;
                self.after_break = false;
            }
            Item::Step {
                step,
                pc,
                cr3,
                func,
                flow,
                len,
            } => {
                let value = self.return_value.take();
                self.step(
                    sink,
                    step,
                    pc,
                    cr3,
                    func,
                    Prev {
                        pc,
                        len,
                        flow,
                        value,
                    },
                )
            }
            Item::ReturnValue(value) => self.return_value = Some(value),
        }
    }

    /// One step: a switch of stack or a big level where one begins, the
    /// interrupt that came before it, or the transition from the step
    /// before; then the step is counted in the routine on top.
    #[inline]
    fn step(
        &mut self,
        sink: &mut impl LevelSink,
        step: u64,
        pc: u64,
        cr3: u64,
        func: FuncId,
        this: Prev,
    ) {
        let func = if func == PREVIOUS_FUNC {
            self.stack.last().map_or(UNKNOWN_FUNC, |f| f.view.func)
        } else {
            func
        };
        let root = cr3_root(cr3);
        let key = StackKey::of(self.task, root);
        match self.cr3.map(|c| StackKey::of(self.stepped, c)) {
            None => {
                self.cr3 = Some(root);
                self.big_level(sink, step, BigLevelCause::TraceStart);
            }
            Some(current) if current != key => self.switch(sink, current, key, root, step),
            // A task changes address space on its own stack (switching to
            // the next task's, an exec).
            Some(_) => self.cr3 = Some(root),
        }
        self.stepped = self.task;
        if std::mem::take(&mut self.after_break) {
            self.big_level(sink, step, BigLevelCause::Break);
        }
        match self.pending_interrupt.take() {
            Some(vector) if !self.is_system_call_delivery(vector) => {
                self.interrupted(sink, vector, func, pc, step)
            }
            _ => {
                let prev = self.prev;
                self.transition(sink, prev, func, pc, step);
            }
        }
        if let Some(top) = self.stack.last_mut() {
            top.view.self_steps += 1;
            top.view.last_step = step;
        }
        self.counts.steps += 1;
        self.prev = Some(this);
        self.prev_step = Some(step);
    }

    /// Whether an interrupt recorded before this step is the one the step
    /// before made as a system call (`int 0x80`: some hosts record its
    /// delivery), whose level is the system call's.
    fn is_system_call_delivery(&self, vector: u8) -> bool {
        vector == crate::syscalls::INT_80_VECTOR
            && self.prev.is_some_and(|p| p.flow == Flow::SystemCall)
            && self
                .syscall
                .is_some_and(|c| c.abi == crate::syscalls::Abi::Ia32)
    }

    /// The step at `pc` is the first of an interrupt handler: the
    /// interrupted step is finished after the handler returns.
    fn interrupted(
        &mut self,
        sink: &mut impl LevelSink,
        vector: u8,
        func: FuncId,
        pc: u64,
        step: u64,
    ) {
        self.counts.interrupts += 1;
        // An interrupt right after an interrupt return (`sti; hlt` idling,
        // interrupts queued while disabled) hides where that return went,
        // but it returned from the innermost entry all the same.
        let mut before = self.prev;
        if before.is_some_and(|p| p.flow == Flow::InterruptReturn) {
            if let Some(i) = self.innermost_entry() {
                before = self.unwind_to(sink, i).and_then(|f| f.saved_prev);
            }
        }
        self.big_level(sink, step, BigLevelCause::Interrupt { vector });
        // The step before is finished after the handler returns, against
        // the pc it returns to: an interrupt that lands on a call's target
        // still enters the callee.
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
            Entered::new(func, pc, step, EntryKind::Interrupt { vector }),
            None,
            Some(resume.unwrap_or(Prev {
                pc: 0,
                len: 0,
                flow: Flow::Jump,
                value: None,
            })),
        );
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
