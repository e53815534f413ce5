//! MMIO exits while tracing: each access's event after its step, the
//! iterations of a REP string instruction that touches MMIO, and the MMIO
//! stores this project's hosts run on from without a trap.

use vtrace_storage::Event;
use vtrace_vmm::{CpuView, Directive, ExitView};

use crate::context::linear_pc;
use vtrace_x86::Flow;

use super::{Engine, RecordSink};

impl Engine {
    /// An MMIO access exited: `event` tells it.
    pub(super) fn mmio<S: RecordSink>(
        &mut self,
        event: Event,
        write: bool,
        cpu: &mut dyn CpuView,
        sink: &mut S,
    ) -> Directive {
        // An MMIO store completes on the next entry and, on the
        // paravirtual hosts, traps only after the instruction
        // after it (see `record`). Where that instruction is an
        // MMIO access too (two stores to a local APIC's ICR), its
        // exit comes first: the store is done, with the registers
        // it left, and this access is the instruction now, or,
        // where RIP is past it, done as well.
        if self.mmio_store && self.pending_is_plain_store() {
            let ran_past = !self.at_next_instruction(cpu);
            self.after_instruction(&ExitView::Debug { breakpoint: false }, cpu, sink);
            if ran_past && write {
                // This host's emulator ran this store too, RIP is
                // past it: the fold above recorded its step, and
                // its event goes right after.
                sink.event(&event);
                return Directive::Continue;
            }
        }
        // Reads and writes alike complete on the next entry, which
        // then steps the instruction: the event follows that step.
        // In a REP string instruction's midst the registers show a
        // store's iteration done, not a load's (its value is to
        // come): the store's event goes with the steps given now.
        if write {
            self.deferred.push(event);
            self.iterations_before_mmio(cpu, sink);
        } else {
            self.iterations_before_mmio(cpu, sink);
            self.deferred.push(event);
        }
        self.completing = true;
        self.mmio_store = write;
        Directive::Continue
    }

    /// Whether the vCPU stands at the instruction right after the pending
    /// one.
    fn at_next_instruction(&mut self, cpu: &mut dyn CpuView) -> bool {
        let rip = linear_pc(&cpu.sregs(), cpu.regs().rip);
        self.pending
            .and_then(|p| p.bytes.map(|b| p.pc.wrapping_add(b.len() as u64)))
            == Some(rip)
    }

    /// Whether the pending instruction is a plain MOV store (not a REP
    /// string instruction, whose MMIO iterations exit one by one).
    pub(super) fn pending_is_plain_store(&self) -> bool {
        self.pending.and_then(|p| p.decoded).is_some_and(|d| {
            d.insn.mnemonic() == iced_x86::Mnemonic::Mov
                && d.insn.op0_kind() == iced_x86::OpKind::Memory
        })
    }

    /// Every iteration of a REP string instruction that touches MMIO exits
    /// (on every host), and the registers then show the iterations done:
    /// those become steps now, each followed by the events of its own
    /// exits, so an instruction of millions of iterations (`rep stosb` to
    /// a frame buffer) holds neither its steps nor its events, and the
    /// trace is the one a host that traps each iteration gives. The rest
    /// are rebuilt where the instruction ends.
    fn iterations_before_mmio(&mut self, cpu: &mut dyn CpuView, sink: &mut dyn RecordSink) {
        let Some(p) = self.pending else {
            return;
        };
        if !p.decoded.is_some_and(|d| d.flow == Flow::Repeat) {
            return;
        }
        let regs = cpu.regs();
        let sregs = cpu.sregs();
        let in_its_midst = linear_pc(&sregs, regs.rip) == p.pc;
        // None done since the last: nothing to give yet.
        if !in_its_midst || self.emit_repeat(&p, true, cpu, &sregs, &regs, sink) == 0 {
            return;
        }
        for e in self.deferred.drain(..) {
            sink.event(&e);
        }
        self.last = regs;
        self.mid_rep = true;
    }
}
