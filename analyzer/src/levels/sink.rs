//! What the engine tells: routine entries and exits, big levels,
//! irregular control flow, marks and task changes, through a
//! [`LevelSink`].

use crate::tasks::TaskId;
use vtrace_image::symbols::FuncId;

/// How a routine was entered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// First routine of the trace, of an address space, or after a break.
    Root,
    /// Called.
    Call,
    /// Reached by a jump from the routine it replaces at the same depth
    /// (a tail call, or an interrupt stub jumping to common code).
    Jump {
        /// The routine it replaces.
        from: FuncId,
    },
    /// An interrupt or exception handler.
    Interrupt {
        /// Its vector.
        vector: u8,
    },
    /// A system call's entry (SYSCALL, SYSENTER, INT 0x80).
    SystemCall,
}

/// How a routine was left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitKind {
    /// It returned to its caller.
    Return,
    /// A return or jump went to a frame further down: this one was skipped.
    Unwound,
    /// Replaced by a routine it jumped to.
    JumpedAway,
    /// The trace ended with it on the stack.
    TraceEnd,
}

/// A routine activation as sinks see it.
#[derive(Clone, Copy, Debug)]
pub struct FrameView {
    /// The routine.
    pub func: FuncId,
    /// Where it was entered.
    pub entry_pc: u64,
    /// The step it was entered at.
    pub entry_step: u64,
    /// Position on its call stack (0 = bottom).
    pub depth: usize,
    /// How it was entered.
    pub kind: EntryKind,
    /// Its address space.
    pub cr3: u64,
    /// The task whose stack it is on, where the trace names tasks.
    pub task: Option<TaskId>,
    /// Node in the call-path trie ([`LevelEngine::path`](super::LevelEngine::path)).
    pub node: u32,
    /// Steps in it alone.
    pub self_steps: u64,
    /// Steps in it and everything it called or was interrupted by.
    pub total_steps: u64,
    /// Whether the same routine is further down the stack (its total is
    /// already counted there).
    pub recursive: bool,
    /// Last step executed in it (valid at exit).
    pub last_step: u64,
    /// At an [`ExitKind::Return`] exit: RAX after its `ret`, what it
    /// returned (or whatever RAX held, for a routine that returns
    /// nothing, as ftrace's funcgraph-retval warns).
    pub return_value: Option<u64>,
}

/// Irregular control flow, marked `## divided level ##` in nest diagrams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Irregular {
    /// A `ret` went somewhere no frame on the stack returns to (a `ret`
    /// used as a jump or call, or a stack switched under the tracer).
    ReturnNotOnStack {
        /// Where it went.
        to: u64,
    },
    /// A `ret` returned to a frame below the top, skipping `skipped` frames.
    ReturnPastFrames {
        /// Frames skipped.
        skipped: usize,
    },
    /// A jump into a routine already on the stack, below the top.
    JumpIntoStack {
        /// Frames left.
        skipped: usize,
    },
    /// An interrupt return to a place no interrupt frame returns to.
    InterruptReturnUnmatched {
        /// Where it went.
        to: u64,
    },
}

impl Irregular {
    /// The marker's text in a nest diagram.
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
    /// The trace begins.
    TraceStart,
    /// An interrupt or exception.
    Interrupt {
        /// Its vector.
        vector: u8,
    },
    /// A system call: which one where the trace shows it (`syscall`,
    /// `sysenter` or `int 0x80` from user mode).
    SystemCall {
        /// The system call, where known.
        call: Option<crate::syscalls::SystemCall>,
    },
    /// Back from an interrupt or system call into what it interrupted.
    Resume {
        /// From a system call (`sysret` or `iret` after `syscall`), not
        /// an interrupt or exception.
        system_call: bool,
    },
    /// Another address space, in a trace that names no tasks.
    Switch {
        /// The address space before.
        from: u64,
    },
    /// Another task runs ([`BigLevel::task`]).
    TaskSwitch {
        /// The task before.
        from: Option<TaskId>,
    },
    /// After steps the trace does not have.
    Break,
}

/// The start of a big level.
#[derive(Clone, Copy, Debug)]
pub struct BigLevel {
    /// Its first step.
    pub step: u64,
    /// Why it began.
    pub cause: BigLevelCause,
    /// The address space it runs in.
    pub cr3: u64,
    /// The running task, where the trace names tasks.
    pub task: Option<TaskId>,
    /// A switch to a task or address space that runs for the first time
    /// in the trace: its start (returns to where nothing was called from)
    /// is not marked as irregular flow.
    pub first_run: bool,
    /// Interrupt and system-call frames on the stack: how deeply this level
    /// is nested in what it interrupted.
    pub nesting: usize,
    /// The routine that was running when the level began (what an
    /// interrupt interrupted), if any.
    pub interrupted: Option<(FuncId, u64)>,
}

/// What consumes the engine's findings. Every method has a default that
/// ignores it. A sink that wants no more (its reader went away: `vtrace
/// analyze nest | head`) says so with [`LevelSink::stopped`], and the pass
/// stops reading the trace.
pub trait LevelSink {
    /// Whether the sink wants no more findings. Asked after each segment.
    fn stopped(&self) -> bool {
        false
    }
    /// A big level begins.
    fn big_level(&mut self, _level: &BigLevel) {}
    /// A routine is entered.
    fn enter(&mut self, _frame: &FrameView) {}
    /// A routine is left, `how`.
    fn exit(&mut self, _frame: &FrameView, _how: ExitKind) {}
    /// Irregular flow at `step`, at call depth `depth`.
    fn irregular(&mut self, _step: u64, _depth: usize, _what: Irregular) {}
    /// A mark between steps; `step` is the number of the next step.
    fn mark(&mut self, _step: u64, _cr3: u64, _id: u64, _value: u64) {}
    /// A note between steps (a capture), at call depth `depth`; `step` is
    /// the number of the next step.
    fn note(&mut self, _step: u64, _depth: usize, _text: &str) {}
    /// From `step` (the number of the next step) on, `task` runs (or the
    /// running task was renamed).
    fn task(&mut self, _step: u64, _task: &TaskId) {}
}

/// No sink: findings go nowhere.
impl LevelSink for () {}

/// Two sinks, both told every finding (a diagram and what is gathered
/// beside it); it stops when either does.
impl<A: LevelSink, B: LevelSink> LevelSink for (A, B) {
    fn stopped(&self) -> bool {
        self.0.stopped() || self.1.stopped()
    }
    fn big_level(&mut self, level: &BigLevel) {
        self.0.big_level(level);
        self.1.big_level(level);
    }
    fn enter(&mut self, frame: &FrameView) {
        self.0.enter(frame);
        self.1.enter(frame);
    }
    fn exit(&mut self, frame: &FrameView, how: ExitKind) {
        self.0.exit(frame, how);
        self.1.exit(frame, how);
    }
    fn irregular(&mut self, step: u64, depth: usize, what: Irregular) {
        self.0.irregular(step, depth, what);
        self.1.irregular(step, depth, what);
    }
    fn mark(&mut self, step: u64, cr3: u64, id: u64, value: u64) {
        self.0.mark(step, cr3, id, value);
        self.1.mark(step, cr3, id, value);
    }
    fn note(&mut self, step: u64, depth: usize, text: &str) {
        self.0.note(step, depth, text);
        self.1.note(step, depth, text);
    }
    fn task(&mut self, step: u64, task: &TaskId) {
        self.0.task(step, task);
        self.1.task(step, task);
    }
}
