//! After an instruction ran: classify how the host got from the pending
//! instruction to this exit, one arm per host behaviour of the
//! architecture doc's table, then record it. This is the per-step path.

use vtrace_storage::{Event, InterruptSource};
use vtrace_vmm::{CpuView, Directive, ExitView};
use vtrace_x86::rflags::TF as RFLAGS_TF;
use vtrace_x86::{Registers, SpecialRegisters};

use super::at_exit::{outcome, AtExit, Completion, Outcome};
use super::{control, Engine, Pending, RecordSink, CONTROL_REGS};
use crate::flow::{Decoded, Shadow};
use crate::idt::{error_code, gate};
use vtrace_x86::has_error_code;
use vtrace_x86::Flow;

/// How the step of an instruction whose next pc the engine explains is
/// recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StepRecord {
    /// A REP string instruction: one step per iteration (`rep.rs`).
    Repeat,
    /// IRETQ: the registers it popped, whatever the host shows.
    Iretq,
    /// SYSCALL landed back in user mode: the kernel ran unseen, a gap.
    SyscallUnseen,
    /// SYSCALL saved the tracer's TF into R11: the guest's own R11.
    SyscallTrapFlagInR11,
    /// CPUID: the result the vCPU's table gives, where the host leaks
    /// its own bits.
    Cpuid,
    /// SYSRET ran with the TF the engine put into R11: the guest gets its
    /// own R11 back.
    SysretCarriedTrapFlag,
    /// The registers at the exit.
    Plain,
}

/// Classifies an explained step: `cpl` is the privilege level after it,
/// `r11` its R11, `rflags_before` RFLAGS before it, `carried_r11` whether
/// the engine put TF into R11 for it.
fn step_record(
    d: &Decoded,
    cpl: u8,
    r11: u64,
    rflags_before: u64,
    carried_r11: bool,
) -> StepRecord {
    if d.flow == Flow::Repeat {
        StepRecord::Repeat
    } else if d.iretq {
        StepRecord::Iretq
    } else if d.saves_flags_in_r11 && cpl != 0 {
        StepRecord::SyscallUnseen
    } else if d.saves_flags_in_r11 && r11 & RFLAGS_TF != 0 && rflags_before & RFLAGS_TF == 0 {
        StepRecord::SyscallTrapFlagInR11
    } else if d.cpuid {
        StepRecord::Cpuid
    } else if carried_r11 && r11 & RFLAGS_TF != 0 {
        StepRecord::SysretCarriedTrapFlag
    } else {
        StepRecord::Plain
    }
}

impl Engine {
    /// Follows an exit after which an instruction ran (or an interrupt
    /// came): classifies and records it, then the exit's own events, then
    /// prepares the next instruction.
    pub(super) fn after_instruction<S: RecordSink>(
        &mut self,
        view: &ExitView,
        cpu: &mut dyn CpuView,
        sink: &mut S,
    ) -> Directive {
        let mut at = AtExit::read(cpu);
        let here = !matches!(view, ExitView::Debug { .. });
        // Popped or run by now: what carry_trap_flag put there is spent.
        self.carried.frame = None;
        let carried_r11 = std::mem::take(&mut self.carried.r11);
        // This exit may be the completion of an IN: an interrupt queued at
        // its I/O exit arrives only on the entry after this one.
        let completing = std::mem::take(&mut self.completing);
        // A plain store changes no general register, so its step is the
        // registers before it.
        let mmio_store = std::mem::take(&mut self.mmio_store) && self.pending_is_plain_store();
        let mid_rep = std::mem::take(&mut self.mid_rep);
        let injected = match here || completing {
            true => None,
            false => self.injected.take(),
        };
        let directive = if let Some(vector) = injected {
            self.interrupted(vector, at.cpu, &at.regs, &at.sregs, at.next, sink);
            Directive::Continue
        } else if let Some(p) = self.pending.take() {
            let completion = Completion {
                here,
                mmio_store,
                mid_rep,
                carried_r11,
            };
            self.record_pending(p, completion, &mut at, sink)
        } else {
            Directive::Continue
        };
        self.record_exit_events(view, &at.sregs, sink);
        self.prepare_next(at.cpu, &at.sregs, at.regs, at.next);
        directive
    }

    /// An interrupt was injected before the exit: with interrupts disabled
    /// before it, the pending instruction must have run first if it is
    /// what enabled them (IRETQ, STI, POPF): the interrupt came right
    /// after it, and its step is folded into this exit. Its registers are
    /// not seen on their own; the step carries these.
    #[inline]
    fn interrupted<S: RecordSink>(
        &mut self,
        vector: u8,
        cpu: &mut dyn CpuView,
        regs: &Registers,
        sregs: &SpecialRegisters,
        next: u64,
        sink: &mut S,
    ) {
        self.ran_before_interrupt(regs, sink);
        sink.event(&Event::Interrupt {
            vector,
            error_code: None,
            source: InterruptSource::Injected,
        });
        let g = gate(cpu, &mut self.walker, sregs, vector);
        self.handler_first_step(g, cpu, regs, sregs, next, sink);
    }

    /// The pending instruction ran, or did not (see [`outcome`]): one step,
    /// or steps folded after a trap the host held back, or else a fault or
    /// a gap. Where every exit's instruction is recorded.
    #[inline]
    fn record_pending<S: RecordSink>(
        &mut self,
        p: Pending,
        completion: Completion,
        at: &mut AtExit<'_>,
        sink: &mut S,
    ) -> Directive {
        let folded = match (outcome(&p, completion, at.sregs.cpl(), at.next), p.decoded) {
            (Outcome::Explained, Some(d)) => {
                return self.record_explained(&p, d, completion, at, sink);
            }
            (Outcome::HeldTrap, Some(d)) => {
                // Neither an MMIO store nor PAUSE changes a register, so
                // its step is exact, as a fence's.
                let d = Decoded {
                    shadow: d.shadow.or(Some(Shadow::NoTrapAfter)),
                    ..d
                };
                self.after_shadow(&p, d, at, sink)
            }
            _ => None,
        };
        match folded {
            Some(folded) => self.after_step(folded, at.cpu, &at.sregs, &at.regs, sink),
            None => {
                self.fault_or_gap(&p, completion.here, at, sink);
                Directive::Continue
            }
        }
    }

    /// Records an instruction the engine's decoding explains (see
    /// [`StepRecord`]).
    #[inline]
    fn record_explained<S: RecordSink>(
        &mut self,
        p: &Pending,
        d: Decoded,
        completion: Completion,
        at: &mut AtExit<'_>,
        sink: &mut S,
    ) -> Directive {
        let (cpu, regs, sregs, next) = (&mut *at.cpu, &mut at.regs, &at.sregs, at.next);
        if sregs.cr2 != self.last_cr2 && !d.rearm {
            // Only a page fault writes CR2. Where stepping rides on TF, a
            // fault the CPU delivered itself ran its handler without
            // stepping, and returned here to run the instruction again.
            self.gap(p.pc, p.pc, sink);
        }
        if self.values.is_some() {
            self.read_stored_values(p, cpu, sregs);
        }
        let how = step_record(
            &d,
            sregs.cpl(),
            regs.r11,
            self.last.rflags,
            completion.carried_r11,
        );
        match how {
            StepRecord::Repeat => {
                self.emit_repeat(p, completion.mid_rep, cpu, sregs, regs, sink);
                self.mid_rep = next == p.pc;
            }
            StepRecord::Iretq => {
                let own = self.iretq_regs(cpu, sregs, regs, next);
                self.emit_step(p, &own, sink);
            }
            StepRecord::SyscallUnseen => {
                self.emit_step(p, regs, sink);
                self.gap(p.pc, next, sink);
            }
            StepRecord::SyscallTrapFlagInR11 => {
                let mut own = *regs;
                own.r11 &= !RFLAGS_TF;
                let written = cpu.write_regs(&own);
                self.wrote(written);
                self.emit_step(p, &own, sink);
            }
            StepRecord::Cpuid => {
                self.correct_cpuid(cpu, regs);
                self.emit_step(p, regs, sink);
            }
            StepRecord::SysretCarriedTrapFlag => {
                regs.r11 &= !RFLAGS_TF;
                let written = cpu.write_regs(regs);
                self.wrote(written);
                self.emit_step(p, regs, sink);
            }
            StepRecord::Plain => self.emit_step(p, regs, sink),
        }
        if d.iretq {
            self.after_iretq(cpu, sregs, regs, next, sink);
        }
        self.after_step(d, cpu, sregs, regs, sink)
    }

    /// The next pc is not the pending instruction's: it faulted (it did
    /// not run, and runs again, and is recorded, after the handler), or
    /// the CPU went somewhere the engine cannot explain (a gap).
    #[inline]
    fn fault_or_gap<S: RecordSink>(
        &mut self,
        p: &Pending,
        completed_here: bool,
        at: &mut AtExit<'_>,
        sink: &mut S,
    ) {
        let (cpu, regs, sregs, next) = (&mut *at.cpu, &at.regs, &at.sregs, at.next);
        match (completed_here, self.infer_exception(cpu, sregs, next)) {
            (false, Some((vector, g))) => {
                self.stats.exceptions += 1;
                self.last_exception = Some(vector);
                let error_code = has_error_code(vector)
                    .then(|| error_code(cpu, &mut self.walker, sregs, g, self.last.rsp))
                    .flatten();
                sink.event(&Event::Interrupt {
                    vector,
                    error_code,
                    source: InterruptSource::InferredFromIdt,
                });
                self.handler_first_step(Some(g), cpu, regs, sregs, next, sink);
            }
            _ => {
                self.emit_step(p, regs, sink);
                let from = p.decoded.map_or(p.pc, |d| d.expected(p.pc));
                self.gap(from, next, sink);
            }
        }
    }

    /// The exit's own events, after the step: held-back events (IN,
    /// hypercalls, MMIO), the OUT, an interrupt the VMM delivered, and
    /// control registers that changed.
    #[inline]
    fn record_exit_events<S: RecordSink>(
        &mut self,
        view: &ExitView,
        sregs: &SpecialRegisters,
        sink: &mut S,
    ) {
        // Rarely any: an empty drain still cost some 25 instructions a step.
        if !self.deferred.is_empty() {
            for e in self.deferred.drain(..) {
                sink.event(&e);
            }
        }
        match *view {
            ExitView::IoOut {
                port, size, value, ..
            } => sink.event(&Event::Io {
                port,
                size,
                write: true,
                value,
            }),
            ExitView::CompletedByVmm {
                vector: Some(vector),
            } => sink.event(&Event::Interrupt {
                vector,
                error_code: None,
                source: InterruptSource::DeliveredByVmm,
            }),
            _ => {}
        }
        let now = control(sregs);
        for i in 0..4 {
            if now[i] != self.control[i] {
                sink.event(&Event::ControlRegister {
                    reg: CONTROL_REGS[i],
                    value: now[i],
                });
            }
        }
        self.control = now;
    }

    /// Takes in the state after this exit and fetches the next
    /// instruction, foreseeing its fault and carrying TF where it must.
    #[inline]
    fn prepare_next(
        &mut self,
        cpu: &mut dyn CpuView,
        sregs: &SpecialRegisters,
        regs: Registers,
        next: u64,
    ) {
        self.last_cr2 = sregs.cr2;
        let idt = (sregs.idt.base, sregs.idt.limit);
        if idt != self.idt {
            self.idt = idt;
            self.idt_moved = true;
        }
        self.last = regs;
        self.fetch_pending(cpu, sregs, next);
        if self.record_values {
            self.plan_values(cpu, sregs, &regs);
        }
        if self.foresee {
            self.foresee_fault(cpu, sregs, &regs);
            self.carry_trap_flag(cpu, sregs, &regs);
        }
    }

    /// Gives CPUID's result the vCPU's table where the host answered with
    /// its own feature bits (see `cpuid::as_given`).
    fn correct_cpuid(&mut self, cpu: &mut dyn CpuView, regs: &mut Registers) {
        let seen = [
            regs.rax as u32,
            regs.rbx as u32,
            regs.rcx as u32,
            regs.rdx as u32,
        ];
        let given = cpu.cpuid_as_given(self.last.rax as u32, self.last.rcx as u32, seen);
        if given == seen {
            return;
        }
        // CPUID zero-extends its 32-bit results.
        regs.rax = u64::from(given[0]);
        regs.rbx = u64::from(given[1]);
        regs.rcx = u64::from(given[2]);
        regs.rdx = u64::from(given[3]);
        let written = cpu.write_regs(regs);
        self.wrote(written);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::decode;

    fn decoded(bytes: &[u8]) -> Decoded {
        decode(bytes, 64, 0x1000).expect("decodes")
    }

    const TF: u64 = RFLAGS_TF;

    #[test]
    fn each_host_behaviour_has_its_own_record() {
        let plain = |bytes: &[u8]| step_record(&decoded(bytes), 0, 0, 0, false);
        assert_eq!(plain(&[0xf3, 0xaa]), StepRecord::Repeat, "rep stosb");
        assert_eq!(plain(&[0x48, 0xcf]), StepRecord::Iretq);
        assert_eq!(plain(&[0x0f, 0xa2]), StepRecord::Cpuid);
        assert_eq!(plain(&[0x90]), StepRecord::Plain);
        let syscall = decoded(&[0x0f, 0x05]);
        assert_eq!(
            step_record(&syscall, 3, 0, 0, false),
            StepRecord::SyscallUnseen,
            "back in user mode after it"
        );
        assert_eq!(
            step_record(&syscall, 0, TF, 0, false),
            StepRecord::SyscallTrapFlagInR11,
            "the tracer's TF in R11"
        );
        assert_eq!(
            step_record(&syscall, 0, TF, TF, false),
            StepRecord::Plain,
            "the guest's own TF"
        );
        let sysret = decoded(&[0x48, 0x0f, 0x07]);
        assert_eq!(
            step_record(&sysret, 3, TF, 0, true),
            StepRecord::SysretCarriedTrapFlag
        );
        assert_eq!(
            step_record(&sysret, 3, TF, 0, false),
            StepRecord::Plain,
            "TF the guest put into R11 itself"
        );
    }
}
