//! A sink that passes on only what the selected tasks did.

use super::{BigLevel, ExitKind, FrameView, Irregular, LevelSink};
use crate::tasks::{TaskFilter, TaskId};

/// A level sink that sees only what the filter's tasks did: routines on
/// their stacks, big levels while they run. The level engine itself sees
/// everything, so a task's calls still nest right across the stretches
/// left out.
pub struct SelectedTasks<'a, S> {
    /// The sink that sees the selected tasks' levels.
    pub inner: S,
    filter: &'a TaskFilter,
    /// Whether the running task is selected.
    on: bool,
}

impl<'a, S> std::fmt::Debug for SelectedTasks<'a, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelectedTasks").finish_non_exhaustive()
    }
}

impl<'a, S> SelectedTasks<'a, S> {
    /// `inner`, seeing only what `filter` admits.
    pub fn new(inner: S, filter: &'a TaskFilter) -> Self {
        SelectedTasks {
            inner,
            on: filter.admits(None),
            filter,
        }
    }
}

impl<S: LevelSink> LevelSink for SelectedTasks<'_, S> {
    fn stopped(&self) -> bool {
        self.inner.stopped()
    }
    fn big_level(&mut self, level: &BigLevel) {
        if self.filter.admits(level.task.as_ref()) {
            self.inner.big_level(level);
        }
    }
    fn enter(&mut self, frame: &FrameView) {
        if self.filter.admits(frame.task.as_ref()) {
            self.inner.enter(frame);
        }
    }
    fn exit(&mut self, frame: &FrameView, how: ExitKind) {
        if self.filter.admits(frame.task.as_ref()) {
            self.inner.exit(frame, how);
        }
    }
    fn irregular(&mut self, step: u64, depth: usize, what: Irregular) {
        if self.on {
            self.inner.irregular(step, depth, what);
        }
    }
    fn mark(&mut self, step: u64, cr3: u64, id: u64, value: u64) {
        if self.on {
            self.inner.mark(step, cr3, id, value);
        }
    }
    fn note(&mut self, step: u64, depth: usize, text: &str) {
        if self.on {
            self.inner.note(step, depth, text);
        }
    }
    fn task(&mut self, step: u64, task: &TaskId) {
        self.on = self.filter.admits(Some(task));
        self.inner.task(step, task);
    }
}
