//! Interrupts and exceptions seen from the step stream: faults foreseen
//! and delivered by the VMM, injections, handlers whose first instruction
//! ran before an exit, IRETQ and STI-shadow reconstruction, exceptions
//! inferred from where execution went.

use vtrace_storage::{CpuMode, Event, InterruptSource};
use vtrace_vmm::{CpuView, Exception};
use vtrace_x86::rflags::IF as RFLAGS_IF;
use vtrace_x86::{Registers, SpecialRegisters};

use crate::context::{cpu_mode, linear_pc};
use crate::fault;
use crate::flow::{Decoded, Shadow};
use crate::idt::{error_code, gate, Gate};
use vtrace_x86::has_error_code;

use super::at_exit::AtExit;
use super::{Engine, Pending, RecordSink};

impl Engine {
    /// The exception the instruction about to run will raise, once.
    pub fn take_foreseen(&mut self) -> Option<Exception> {
        self.foreseen.take()
    }

    /// An interrupt or exception entered its handler with its frame's RIP
    /// at `slot`: the flags undefined now are undefined in the frame.
    pub(super) fn note_frame(&mut self, slot: u64) {
        const FRAMES: usize = 64;
        self.frame_flags.retain(|(s, _)| *s != slot);
        if self.frame_flags.len() == FRAMES {
            self.frame_flags.remove(0);
        }
        if self.undefined_flags != 0 {
            self.frame_flags.push((slot, self.undefined_flags));
        }
    }

    /// The undefined flags of the frame at `slot`, which an IRETQ pops.
    pub(super) fn take_frame_flags(&mut self, slot: u64) -> u64 {
        match self.frame_flags.iter().position(|(s, _)| *s == slot) {
            Some(i) => self.frame_flags.swap_remove(i).1,
            None => 0,
        }
    }

    /// The VMM delivered the foreseen fault: the pending instruction did
    /// not run; the handler is stepped from its first instruction.
    pub(super) fn fault_delivered(
        &mut self,
        vector: u8,
        error_code: Option<u32>,
        cpu: &mut dyn CpuView,
        sink: &mut dyn RecordSink,
    ) {
        self.pending = None;
        self.stats.exceptions += 1;
        self.last_exception = Some(vector);
        sink.event(&Event::Interrupt {
            vector,
            error_code,
            source: InterruptSource::DeliveredByVmm,
        });
        let regs = cpu.regs();
        self.note_frame(regs.rsp + if error_code.is_some() { 8 } else { 0 });
        let sregs = cpu.sregs();
        self.last = regs;
        self.last_cr2 = sregs.cr2;
        self.fetch_pending(cpu, &sregs, linear_pc(&sregs, regs.rip));
        self.foreseen = None;
    }

    /// Works out [`Engine::foreseen`] for the pending instruction.
    pub(super) fn foresee_fault(
        &mut self,
        cpu: &dyn CpuView,
        sregs: &SpecialRegisters,
        regs: &Registers,
    ) {
        self.foreseen = None;
        let Some(p) = self.pending else {
            return;
        };
        let insn = p.decoded.map(|d| d.insn);
        self.foreseen = fault::foresee(
            &mut self.walker,
            &mut self.operands,
            cpu,
            sregs,
            regs,
            fault::Next {
                pc: p.pc,
                insn: insn.as_ref(),
                fetched: usize::from(p.fetched),
            },
        );
    }

    /// Where the handler of `vector` starts, from the guest's IDT.
    pub fn handler_of(&mut self, vector: u8, cpu: &mut dyn CpuView) -> Option<u64> {
        let sregs = cpu.sregs();
        gate(cpu, &mut self.walker, &sregs, vector).map(|g| g.handler)
    }

    /// On hosts that step with TF: execution reached the entry of the
    /// handler for exception `vector` (a breakpoint there fired before its
    /// first instruction). The CPU delivered the exception, so the pending
    /// instruction did not complete; the handler is stepped from here.
    pub fn exception_entry(
        &mut self,
        vector: u8,
        handler: u64,
        cpu: &mut dyn CpuView,
        sink: &mut dyn RecordSink,
    ) {
        if !self.started {
            return;
        }
        let regs = cpu.regs();
        let sregs = cpu.sregs();
        // At the handler's entry the error code is on top of the stack.
        let error_code = has_error_code(vector)
            .then(|| {
                let mut b = [0u8; 4];
                (self.walker.read(cpu, &sregs, regs.rsp, &mut b) == 4)
                    .then(|| u32::from_le_bytes(b))
            })
            .flatten();
        self.foreseen = None;
        self.stats.exceptions += 1;
        self.last_exception = Some(vector);
        sink.event(&Event::Interrupt {
            vector,
            error_code,
            source: InterruptSource::ReportedByKvm,
        });
        self.note_frame(regs.rsp + if error_code.is_some() { 8 } else { 0 });
        self.injected = None;
        self.deferred.clear();
        self.completing = false;
        self.last = regs;
        self.fetch_pending(cpu, &sregs, handler);
    }

    /// Records `event` right after the step of the instruction now
    /// completing (a hypercall's LOG text, say).
    pub fn defer_event(&mut self, event: Event) {
        if self.started {
            self.deferred.push(event);
        }
    }

    /// The VMM queued `vector` with KVM; it is delivered before the pending
    /// instruction runs.
    pub fn note_injection(&mut self, vector: u8) {
        self.foreseen = None;
        self.injected = Some(vector);
        self.stats.injected += 1;
    }

    /// The VMM delivered `vector` through the IDT itself: the pending
    /// instruction did not run, and the vCPU stands at `handler`, whose first
    /// instruction is stepped like any other.
    pub fn note_delivery(
        &mut self,
        vector: u8,
        handler: u64,
        cpu: &mut dyn CpuView,
        sink: &mut dyn RecordSink,
    ) {
        if !self.started {
            return;
        }
        self.foreseen = None;
        self.stats.injected += 1;
        let regs = cpu.regs();
        self.ran_before_interrupt(&regs, sink);
        sink.event(&Event::Interrupt {
            vector,
            error_code: None,
            source: InterruptSource::Injected,
        });
        self.note_frame(regs.rsp);
        let sregs = cpu.sregs();
        self.last = regs;
        self.fetch_pending(cpu, &sregs, handler);
    }

    /// The VMM delivered `vector` on the entry where tracing starts
    /// ([`Engine::begin`] found the vCPU at its handler already).
    pub fn note_first_delivery(&mut self, vector: u8, sink: &mut dyn RecordSink) {
        self.stats.injected += 1;
        sink.event(&Event::Interrupt {
            vector,
            error_code: None,
            source: InterruptSource::Injected,
        });
    }

    /// An interrupt arrives. If interrupts were disabled before the pending
    /// instruction and it is one that enables them (IRETQ, STI, POPF), it
    /// must have run first, though its own exit was not seen: the
    /// interrupt could come only after it. Its step is recorded with the
    /// registers seen now (its own are not observable). Otherwise the
    /// pending instruction has not run and runs after the handler.
    pub(super) fn ran_before_interrupt(&mut self, regs: &Registers, sink: &mut dyn RecordSink) {
        if let Some(p) = self.pending.take() {
            if self.last.rflags & RFLAGS_IF == 0 && p.decoded.is_some_and(|d| d.enables_interrupts)
            {
                self.emit_step(&p, regs, sink);
                self.stats.folded_before_interrupt += 1;
            }
        }
    }

    /// Records the handler's first instruction, which ran before this exit.
    pub(super) fn handler_first_step(
        &mut self,
        gate: Option<Gate>,
        cpu: &dyn CpuView,
        regs: &Registers,
        sregs: &SpecialRegisters,
        next: u64,
        sink: &mut dyn RecordSink,
    ) {
        let Some(gate) = gate else {
            self.gap(next, next, sink);
            return;
        };
        let first = self.fetch(cpu, sregs, gate.handler);
        self.emit_step(&first, regs, sink);
        match first.decoded {
            Some(d) if d.explains(first.pc, next) => {}
            Some(d) => self.gap(d.expected(first.pc), next, sink),
            None => self.gap(first.pc, next, sink),
        }
    }

    /// The registers IRETQ left. When the exit came later than its target
    /// (see [`Engine::after_iretq`]), they are those before it with RSP
    /// and RFLAGS from the frame it popped, the only general registers it
    /// changes.
    pub(super) fn iretq_regs(
        &mut self,
        cpu: &dyn CpuView,
        sregs: &SpecialRegisters,
        regs: &Registers,
        next: u64,
    ) -> Registers {
        let mut frame = [0u8; 40];
        if cpu_mode(sregs) != CpuMode::Long64
            || self.walker.read(cpu, sregs, self.last.rsp, &mut frame) != 40
        {
            return *regs;
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&frame[i * 8..i * 8 + 8]);
            u64::from_le_bytes(b)
        };
        if word(0) == next {
            return *regs;
        }
        Registers {
            rip: word(0),
            rflags: word(2),
            rsp: word(3),
            ..self.last
        }
    }

    /// IRETQ lands on the RIP it popped. When the next exit reports a pc
    /// one instruction further, that instruction ran without its own debug
    /// exit: on KVM's emulator an STI (or MOV SS) at the target holds the
    /// single-step trap back for one instruction, as its interrupt shadow
    /// does on hardware. The folded step is rebuilt from guest memory (its
    /// registers are those after both); anything else is a gap.
    pub(super) fn after_iretq(
        &mut self,
        cpu: &dyn CpuView,
        sregs: &SpecialRegisters,
        regs: &Registers,
        next: u64,
        sink: &mut dyn RecordSink,
    ) {
        let mut popped = [0u8; 8];
        if cpu_mode(sregs) != CpuMode::Long64
            || self.walker.read(cpu, sregs, self.last.rsp, &mut popped) != 8
        {
            return;
        }
        let target = u64::from_le_bytes(popped);
        if target == next {
            return;
        }
        let folded = self.fetch(cpu, sregs, target);
        let explained = match folded.decoded {
            Some(d) if d.predictable() => d.explains(target, next),
            // Under host load KVM now and then runs the instruction at the
            // target without a debug exit even with no STI there; when it
            // is a `ret` or an indirect `jmp`, where it went is checked
            // against guest memory and registers before it is believed.
            Some(_) => self.indirect_target(cpu, sregs, regs, &folded) == Some(next),
            None => false,
        };
        if explained {
            self.emit_step(&folded, regs, sink);
            self.stats.folded_after_iret += 1;
        } else if let Some((vector, g)) = self.infer_exception(cpu, sregs, next) {
            // The instruction at the target faulted (and went unrecorded,
            // as a faulting instruction does: it runs again after the
            // handler), and the handler's first instruction ran as well.
            // Its frame is on the stack the iretq restored.
            let mut b = [0u8; 8];
            let restored = self.last.rsp.wrapping_add(24);
            let old_rsp = (self.walker.read(cpu, sregs, restored, &mut b) == 8)
                .then(|| u64::from_le_bytes(b));
            self.stats.exceptions += 1;
            self.last_exception = Some(vector);
            let error_code = old_rsp
                .filter(|_| has_error_code(vector))
                .and_then(|rsp| error_code(cpu, &mut self.walker, sregs, g, rsp));
            sink.event(&Event::Interrupt {
                vector,
                error_code,
                source: InterruptSource::InferredFromIdt,
            });
            self.handler_first_step(Some(g), cpu, regs, sregs, next, sink);
        } else {
            self.gap(target, next, sink);
        }
    }

    /// STI, MOV SS and POP SS hold the single-step trap back for one
    /// instruction on AMD-V (as their interrupt shadow does), and fences
    /// and SWAPGS on the paravirtual hosts, so the exit comes
    /// after the instruction that follows (after a run of those, the first
    /// that is not one). Every step is rebuilt exactly: the held instructions'
    /// registers follow from the ones before them, the last one's are
    /// those at the exit. Returns the last instruction, or None, recording
    /// nothing, when no such run explains `next`.
    pub(super) fn after_shadow(
        &mut self,
        p: &Pending,
        d: Decoded,
        at: &AtExit<'_>,
        sink: &mut dyn RecordSink,
    ) -> Option<Decoded> {
        let (cpu, regs, sregs, next) = (&*at.cpu, &at.regs, &at.sregs, at.next);
        /// Instructions held back in a row, at most (a longer run is a gap).
        const MAX_HELD: usize = 4;
        let mut own = self.last;
        let mut held = [(*p, own); MAX_HELD];
        let (mut count, mut at) = (0, (*p, d));
        loop {
            let shadow = at.1.shadow?;
            match shadow {
                Shadow::Sti => own.rflags |= RFLAGS_IF,
                Shadow::MovSs | Shadow::NoTrapAfter => {}
                Shadow::PopSs(bytes) => own.rsp = own.rsp.wrapping_add(u64::from(bytes)),
            }
            held[count] = (at.0, own);
            count += 1;
            let fall = at.0.pc.wrapping_add(u64::from(at.1.len));
            let folded = self.fetch(cpu, sregs, fall);
            let f = folded.decoded?;
            let explained = if f.predictable() {
                f.explains(fall, next)
            } else {
                self.indirect_target(cpu, sregs, regs, &folded) == Some(next)
            };
            if explained {
                for (step, own) in &held[..count] {
                    self.emit_step(step, own, sink);
                }
                // What the held instructions did (an MMIO store's event)
                // goes with them, before the instruction that ran on.
                for e in self.deferred.drain(..) {
                    sink.event(&e);
                }
                self.emit_step(&folded, regs, sink);
                self.stats.folded_after_shadow += 1;
                return Some(f);
            }
            // Only a run of fences and SWAPGS goes on.
            let runs_on = shadow == Shadow::NoTrapAfter && f.shadow == Some(Shadow::NoTrapAfter);
            if !runs_on || count == MAX_HELD {
                return None;
            }
            at = (folded, f);
        }
    }

    /// An exception whose handler's first instruction explains `next`.
    pub(super) fn infer_exception(
        &mut self,
        cpu: &dyn CpuView,
        sregs: &SpecialRegisters,
        next: u64,
    ) -> Option<(u8, Gate)> {
        (0u8..32).find_map(|vector| {
            let g = gate(cpu, &mut self.walker, sregs, vector)?;
            let first = self.fetch(cpu, sregs, g.handler);
            let d = first.decoded?;
            (d.explains(g.handler, next) && next != g.handler).then_some((vector, g))
        })
    }
}
