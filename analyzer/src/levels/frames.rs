//! What the level engine keeps of each call stack: whose stack it is, its
//! frames, and the step it goes on from.

use super::sink::{EntryKind, FrameView};
use crate::tasks::TaskId;
use vtrace_image::symbols::FuncId;
use vtrace_x86::Flow;

/// Whose call stack frames go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum StackKey {
    /// An address space's (its page-table root), where no task is named.
    Space(u64),
    /// A task's, by thread id.
    Task(u32),
}

impl StackKey {
    /// The stack of `task`'s steps, or of address space `root` where no
    /// task is named.
    pub(super) fn of(task: Option<TaskId>, root: u64) -> StackKey {
        match task {
            Some(t) => StackKey::Task(t.tid),
            None => StackKey::Space(root),
        }
    }
}

/// The step before, as the engine goes on from it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Prev {
    pub(super) pc: u64,
    pub(super) len: u8,
    pub(super) flow: Flow,
    /// RAX after it, for a `ret`: what the routine it leaves returned.
    pub(super) value: Option<u64>,
}

/// Where a frame begins: the routine entered, at which pc and step, and
/// how it was entered.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entered {
    pub(super) func: FuncId,
    pub(super) pc: u64,
    pub(super) step: u64,
    pub(super) kind: EntryKind,
}

impl Entered {
    pub(super) fn new(func: FuncId, pc: u64, step: u64, kind: EntryKind) -> Self {
        Entered {
            func,
            pc,
            step,
            kind,
        }
    }
}

/// An open routine on a call stack.
#[derive(Clone, Debug)]
pub(super) struct Frame {
    pub(super) view: FrameView,
    /// Where a return from it lands; `None` for a frame copied into a new
    /// address space, which matches the first interrupt return.
    pub(super) ret: Option<u64>,
    /// For interrupt and system-call frames: the step before the entry, to
    /// go on from after the return as if nothing had happened.
    pub(super) saved_prev: Option<Prev>,
}

impl Frame {
    pub(super) fn is_entry(&self) -> bool {
        matches!(
            self.view.kind,
            EntryKind::Interrupt { .. } | EntryKind::SystemCall
        ) || self.saved_prev.is_some()
    }
}
