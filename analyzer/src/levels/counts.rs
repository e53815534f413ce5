//! What the level engine counts as it goes.

/// Counters of what the engine saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LevelCounts {
    /// Steps pushed (a run counts all of its steps).
    pub steps: u64,
    /// Calls seen.
    pub calls: u64,
    /// Returns that matched a frame.
    pub returns: u64,
    /// Interrupts and exceptions entered.
    pub interrupts: u64,
    /// Switches of task or address space.
    pub switches: u64,
    /// Flow that fits no frame: returns and jumps the stack does not explain.
    pub irregular: u64,
    /// Breaks: gaps, switched-out windows, damaged segments.
    pub breaks: u64,
    /// The deepest call stack.
    pub max_depth: usize,
}

impl LevelCounts {
    /// Adds the counts of another pass (another CPU's): the deepest stack
    /// is the deeper of the two.
    pub fn add(&mut self, other: &LevelCounts) {
        self.steps = self.steps.saturating_add(other.steps);
        self.calls = self.calls.saturating_add(other.calls);
        self.returns = self.returns.saturating_add(other.returns);
        self.interrupts = self.interrupts.saturating_add(other.interrupts);
        self.switches = self.switches.saturating_add(other.switches);
        self.irregular = self.irregular.saturating_add(other.irregular);
        self.breaks = self.breaks.saturating_add(other.breaks);
        self.max_depth = self.max_depth.max(other.max_depth);
    }
}
