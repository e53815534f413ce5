//! The engine's answer to whether its CPU's next step may run beside
//! another CPU's (see `crate::beside`).

use vtrace_vmm::CpuView;

use super::Engine;

impl Engine {
    /// Whether the pending instruction may step at the same time as
    /// another CPU's: the engine follows it as an instruction alone (no
    /// interrupt or exception comes first, no I/O completes, no event
    /// waits for it, it neither holds the turn nor repeats) and it is one
    /// that cannot see another CPU's step or be seen by it.
    pub fn runs_beside(&mut self, cpu: &mut dyn CpuView) -> bool {
        let alone = self.started
            && self.injected.is_none()
            && self.foreseen.is_none()
            && !self.completing
            && !self.mid_rep
            && !self.mmio_store
            && self.deferred.is_empty()
            && self.carried.frame.is_none()
            && !self.carried.r11;
        let Some(decoded) = self.pending.and_then(|p| p.decoded) else {
            return false;
        };
        // The turn must end after it: the next step is the other CPU's.
        if !alone || decoded.holds_turn() {
            return false;
        }
        let regs = cpu.regs();
        let sregs = cpu.sregs();
        let mut with = crate::beside::Judging {
            operands: &mut self.operands,
            decodes: &mut self.decoded,
            walks: Default::default(),
        };
        crate::beside::runs_beside(&decoded.insn, &regs, &sregs, cpu, &mut with)
    }
}
