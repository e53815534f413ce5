//! The stepping engine: turns the VMM's exits into steps and events.
//!
//! The engine keeps the instruction about to run (fetched through the guest
//! page tables and decoded before it runs). When the next exit shows where
//! execution went, the instruction becomes a step with the registers it
//! left, and the new pc is checked against what it can explain. Behaviours
//! of real KVM hosts are folded back into plain steps:
//!
//! - After an interrupt injection or a guest exception, the first exit comes
//!   after the handler's first instruction: the engine records the
//!   interrupt and reconstructs that step (the registers at the exit are the
//!   ones it left, so the reconstruction is exact).
//! - An `OUT` exits with the instruction completed; an `IN` exits before it
//!   completes and steps afterwards: both yield the step, then the I/O event.
//! - HLT does not halt under single-step on every host: the engine tells
//!   the VMM to do the waiting.
//!
//! Anything else that moves the pc unexplained is a gap event with both
//! addresses; nothing is dropped silently.

use vtrace_storage::{CpuMode, Event, InsnBytes, Record, Recorder, Regs, Step};
use vtrace_vmm::{CpuView, Directive, Exception, ExitView, TurnSoFar};
use vtrace_x86::{Registers, SpecialRegisters};

use crate::context::{cpu_mode, linear_pc};
use crate::fault;
use crate::flow::{DecodeCache, Decoded};
use crate::rep::{ReadLinear, RepString, Unreadable};
use vtrace_x86::Flow;
use vtrace_x86::Walker;

mod at_exit;
mod beside;
mod guest_memory;
mod interrupts;
mod mmio;
mod record;
mod trap_flag;
mod values;

/// Where records go: the trace disk's recorder, or a vector in tests.
pub trait RecordSink {
    /// Records one step.
    fn step(&mut self, step: &Step);
    /// Records one event.
    fn event(&mut self, event: &Event);
}

impl RecordSink for Recorder {
    fn step(&mut self, step: &Step) {
        Recorder::step(self, step)
    }
    fn event(&mut self, event: &Event) {
        Recorder::event(self, event)
    }
}

impl RecordSink for Vec<Record> {
    fn step(&mut self, step: &Step) {
        self.push(Record::Step(*step))
    }
    fn event(&mut self, event: &Event) {
        self.push(Record::Event(event.clone()))
    }
}

/// The instruction at the current pc, fetched before it runs.
#[derive(Clone, Copy, Debug)]
struct Pending {
    pc: u64,
    bytes: Option<InsnBytes>,
    decoded: Option<Decoded>,
    /// Bytes the fetch got (fewer than 15 where the next page is not
    /// mapped).
    fetched: u8,
    cr3: u64,
    mode: CpuMode,
    cpl: u8,
}

/// Counters for the run's summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Steps recorded (every REP iteration is one).
    pub steps: u64,
    /// Gap events: instructions the engine could not see.
    pub gaps: u64,
    /// Interrupts the VMM injected while tracing.
    pub injected: u64,
    /// Exceptions the guest took while tracing.
    pub exceptions: u64,
    /// Steps rebuilt after IRETQ (an STI shadow at the target).
    pub folded_after_iret: u64,
    /// Steps of IRETQ/STI/POPF rebuilt when an interrupt came right after.
    pub folded_before_interrupt: u64,
    /// Steps rebuilt after STI, MOV SS or POP SS (the trap held back).
    pub folded_after_shadow: u64,
    /// Writes to guest state that KVM refused (hiding or giving back the
    /// tracer's TF, correcting a CPUID result): the guest may see the
    /// tracer there.
    pub failed_writes: u64,
}

impl std::ops::AddAssign for EngineStats {
    /// Adds another CPU's counts.
    fn add_assign(&mut self, other: EngineStats) {
        self.steps += other.steps;
        self.gaps += other.gaps;
        self.injected += other.injected;
        self.exceptions += other.exceptions;
        self.folded_after_iret += other.folded_after_iret;
        self.folded_before_interrupt += other.folded_before_interrupt;
        self.folded_after_shadow += other.folded_after_shadow;
        self.failed_writes += other.failed_writes;
    }
}

/// See the module documentation.
#[derive(Default)]
pub struct Engine {
    walker: Walker,
    /// Instructions decoded lately (see [`DecodeCache`]).
    decoded: DecodeCache,
    /// What fault foresight reads an instruction's memory operands with.
    operands: fault::Operands,
    pending: Option<Pending>,
    started: bool,
    injected: Option<u8>,
    /// Events of an instruction that has exited but not yet stepped (IN,
    /// hypercalls, MMIO): recorded right after its step.
    deferred: Vec<Event>,
    /// The pending instruction exited for I/O and completes on the next
    /// entry, with a debug exit of its own: an interrupt injected meanwhile
    /// is delivered only on the entry after that.
    completing: bool,
    /// Registers before the pending instruction (exception frames, steps
    /// rebuilt from what an instruction does).
    last: Registers,
    control: [u64; 4],
    stats: EngineStats,
    /// Vector of an exception seen at the last exit, for autostop.
    last_exception: Option<u8>,
    /// See [`Engine::mid_rep`].
    mid_rep: bool,
    /// The last step recorded does not end a CPU's turn (see
    /// [`Engine::turn_may_end`]).
    holds_turn: bool,
    /// Steps recorded when the CPU's turn began.
    turn_start: u64,
    /// Whether to foresee exceptions (see `fault`).
    foresee: bool,
    /// Steps recorded before the current exit.
    steps_before_exit: u64,
    /// The exception the pending instruction will raise.
    foreseen: Option<Exception>,
    /// Steps after this many are not recorded (`--max-steps`; a REP batch
    /// may run past it within one exit).
    step_limit: Option<u64>,
    /// CR2 at the last exit: a change no recorded step explains is a page
    /// fault handled out of sight.
    last_cr2: u64,
    /// The IDT (base, limit) at the last exit, and whether it moved since
    /// [`Engine::take_idt_moved`] was last asked.
    idt: (u64, u16),
    idt_moved: bool,
    /// The pending instruction exited for an MMIO write.
    mmio_store: bool,
    /// Status flags an instruction left undefined and none has defined
    /// since. CPUs differ there (KVM's emulator sets AF after SHL, AMD's
    /// CPUs clear it), so the trace records them as 0: the same guest
    /// gives the same trace on every host.
    undefined_flags: u64,
    /// The flags undefined where an interrupt or exception came, by the
    /// address of its frame's RIP slot: the IRETQ that pops the frame
    /// restores them, and they stay undefined (what the hosts leave in
    /// them differs). The newest few frames.
    frame_flags: Vec<(u64, u64)>,
    /// What [`Engine::carry_trap_flag`] put into guest state for the
    /// pending instruction, to be taken back.
    carried: Carried,
    /// Whether to record the memory values registers do not give (see
    /// `values`), and those of the pending instruction.
    record_values: bool,
    values: Option<crate::memory_record::Plan>,
}

/// Guest state the engine changed so that TF survives one instruction.
#[derive(Clone, Copy, Debug, Default)]
struct Carried {
    /// IA32_FMASK as the guest wrote it, while TF is kept out of it.
    fmask: Option<u64>,
    /// TF was set in R11 for a SYSRET.
    r11: bool,
    /// TF was set in an IRETQ frame, in the byte at this guest-physical
    /// address.
    frame: Option<u64>,
}

/// Guest memory at linear addresses, through the engine's walker.
struct WalkedMemory<'a> {
    walker: &'a mut Walker,
    cpu: &'a dyn CpuView,
    sregs: &'a SpecialRegisters,
}

impl ReadLinear for WalkedMemory<'_> {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        self.walker.read(self.cpu, self.sregs, addr, buf) == buf.len()
    }
}

pub(crate) fn to_regs(r: &Registers) -> Regs {
    Regs {
        gpr: [
            r.rax, r.rcx, r.rdx, r.rbx, r.rsp, r.rbp, r.rsi, r.rdi, r.r8, r.r9, r.r10, r.r11,
            r.r12, r.r13, r.r14, r.r15,
        ],
        // RF only says whether an instruction breakpoint may fire on
        // resuming; KVM's emulator sets it inside REP batches and the VMM
        // after breakpoint exits, where a CPU stepping with TF does not.
        rflags: r.rflags & !RFLAGS_RF,
    }
}

/// Reads and decodes the instruction at `pc` (see [`Engine::fetch`]).
#[inline(always)]
fn fetch_into(
    walker: &mut Walker,
    decoded: &mut DecodeCache,
    cpu: &dyn CpuView,
    sregs: &SpecialRegisters,
    pc: u64,
) -> Pending {
    let mode = cpu_mode(sregs);
    let mut buf = [0u8; 15];
    let got = walker.read(cpu, sregs, pc, &mut buf);
    let cached = if got > 0 {
        decoded.decode(&buf, got, mode.bitness(), pc)
    } else {
        None
    };
    Pending {
        pc,
        bytes: cached.map(|(_, b)| *b),
        decoded: cached.map(|(d, _)| *d),
        // At most the buffer's 15.
        fetched: got as u8,
        cr3: sregs.cr3,
        mode,
        cpl: sregs.cpl(),
    }
}

use vtrace_x86::rflags::RF as RFLAGS_RF;

fn control(s: &SpecialRegisters) -> [u64; 4] {
    [s.cr0, s.cr3, s.cr4, s.efer]
}

/// Register numbers of `Event::ControlRegister` (EFER as 0xEF).
const CONTROL_REGS: [u8; 4] = [0, 3, 4, 0xef];

impl Engine {
    /// An engine that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// What it counted so far.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// Records no step beyond the `limit`-th: a host that runs REP
    /// iterations in batches must not overshoot `--max-steps`.
    pub fn set_step_limit(&mut self, limit: Option<u64>) {
        self.step_limit = limit;
    }

    /// Foresees the exceptions the next instruction will raise, for the
    /// VMM to deliver, and carries and hides the tracer's TF (hosts that
    /// step with TF; see `fault` and `trap_flag`). Off where the steps
    /// come from the VMM's engine.
    pub fn set_foresee_faults(&mut self, on: bool) {
        self.foresee = on;
    }

    /// Whether the guest loaded another IDT since the last call (or since
    /// [`Engine::begin`]): the exception handlers may have moved.
    pub fn take_idt_moved(&mut self) -> bool {
        std::mem::take(&mut self.idt_moved)
    }

    /// Whether [`Engine::begin`] was called since the last stop.
    pub fn started(&self) -> bool {
        self.started
    }

    /// Starts following the vCPU: notes the instruction about to run.
    pub fn begin(&mut self, cpu: &mut dyn CpuView) {
        let regs = cpu.regs();
        let sregs = cpu.sregs();
        self.control = control(&sregs);
        self.last_cr2 = sregs.cr2;
        self.idt = (sregs.idt.base, sregs.idt.limit);
        self.idt_moved = false;
        self.last = regs;
        self.fetch_pending(cpu, &sregs, linear_pc(&sregs, regs.rip));
        if self.record_values {
            self.plan_values(cpu, &sregs, &regs);
        }
        self.injected = None;
        self.deferred.clear();
        self.completing = false;
        self.mid_rep = false;
        self.foreseen = None;
        self.started = true;
        // What was cached before an untraced stretch may be stale.
        self.walker.flush();
    }

    /// Stops following the vCPU (tracing was switched off).
    pub fn end(&mut self) {
        self.started = false;
        self.mid_rep = false;
        self.foreseen = None;
        self.pending = None;
        self.values = None;
        self.injected = None;
        self.deferred.clear();
        self.completing = false;
    }

    /// Drops the cached translations of guest linear addresses: the guest
    /// ran untraced and may have changed its page tables unseen.
    pub fn forget_translations(&mut self) {
        self.walker.flush();
    }

    /// Linear address of the instruction about to run.
    pub fn next_pc(&self) -> Option<u64> {
        self.pending.map(|p| p.pc)
    }

    /// The stack pointer as the instruction at [`Engine::next_pc`] finds
    /// it.
    pub fn next_sp(&self) -> u64 {
        self.last.rsp
    }

    /// The exception the guest took at the last exit, if any (once).
    pub fn take_exception(&mut self) -> Option<u8> {
        self.last_exception.take()
    }

    /// The instruction at `pc`, read and decoded.
    fn fetch(&mut self, cpu: &dyn CpuView, sregs: &SpecialRegisters, pc: u64) -> Pending {
        fetch_into(&mut self.walker, &mut self.decoded, cpu, sregs, pc)
    }

    /// [`Engine::fetch`] into `pending`, built where it stays: this is
    /// once a step, and each copy of it on the way cost a dozen
    /// instructions.
    fn fetch_pending(&mut self, cpu: &dyn CpuView, sregs: &SpecialRegisters, pc: u64) {
        self.pending = Some(fetch_into(
            &mut self.walker,
            &mut self.decoded,
            cpu,
            sregs,
            pc,
        ));
    }

    fn emit_step<S: RecordSink + ?Sized>(&mut self, p: &Pending, regs: &Registers, sink: &mut S) {
        if let Some(d) = p.decoded {
            self.undefined_flags =
                (self.undefined_flags & !u64::from(d.defines_flags)) | u64::from(d.undefines_flags);
            if d.iretq {
                self.undefined_flags |= self.take_frame_flags(self.last.rsp);
            }
        }
        if self
            .step_limit
            .is_some_and(|limit| self.stats.steps >= limit)
        {
            return;
        }
        if let Some(bytes) = p.bytes {
            self.holds_turn = p.decoded.is_some_and(|d| d.holds_turn());
            let mut regs = to_regs(regs);
            regs.rflags &= !self.undefined_flags;
            if self.values.is_some() {
                self.emit_values(p, sink);
            }
            sink.step(&Step {
                pc: p.pc,
                bytes,
                cr3: p.cr3,
                mode: p.mode,
                cpl: p.cpl,
                regs,
            });
            self.stats.steps += 1;
        }
    }

    fn gap(&mut self, from: u64, to: u64, sink: &mut dyn RecordSink) {
        self.stats.gaps += 1;
        sink.event(&Event::Gap { from, to });
    }

    /// What follows a recorded step of `d`, the last instruction this exit
    /// covered: HLT waits, instructions that may lose TF re-arm, TLB
    /// flushes reach the walker, PUSHF's image loses the tracer's TF.
    fn after_step(
        &mut self,
        d: Decoded,
        cpu: &mut dyn CpuView,
        sregs: &SpecialRegisters,
        regs: &Registers,
        sink: &mut dyn RecordSink,
    ) -> Directive {
        if d.flushes_tlb {
            self.walker.flush();
        }
        match d.pushes_flags {
            // Only stepping with TF puts a TF of the tracer's there.
            Some(size) if self.foresee => self.hide_trap_flag(cpu, sregs, regs, size),
            _ => {}
        }
        if d.flow == Flow::Halt {
            sink.event(&Event::Halt);
            Directive::Halt
        } else if d.rearm {
            Directive::ReArm
        } else {
            Directive::Continue
        }
    }

    /// Records the iterations of the REP string instruction `p` that ran
    /// before this exit, one step each (see `rep`), and gives how
    /// many. `mid_rep`: the last exit stopped between its iterations.
    /// Where memory a comparison needs cannot be read, the iterations from
    /// there are one step and a gap says what is missing.
    fn emit_repeat(
        &mut self,
        p: &Pending,
        mid_rep: bool,
        cpu: &dyn CpuView,
        sregs: &SpecialRegisters,
        regs: &Registers,
        sink: &mut dyn RecordSink,
    ) -> u64 {
        let rep = p
            .bytes
            .and_then(|b| RepString::decode(b.as_slice(), p.mode.bitness()));
        let Some(rep) = rep else {
            self.emit_step(p, regs, sink);
            return 1;
        };
        let n = rep.iterations(&self.last, regs);
        if n == 0 && mid_rep {
            // KVM's emulator stops a batch when the count reaches zero and
            // moves RIP past the instruction on the next entry, without an
            // iteration: no instruction ran.
            return 0;
        }
        if n <= 1 {
            self.emit_step(p, regs, sink);
            return 1;
        }
        let segments = if p.mode == CpuMode::Long64 {
            (0, 0)
        } else {
            (sregs.ds.base, sregs.es.base)
        };
        let mut each = rep.rebuild(&self.last, regs, n, segments);
        let mut before = None;
        loop {
            let mut memory = WalkedMemory {
                walker: &mut self.walker,
                cpu,
                sregs,
            };
            match each.next(&mut memory) {
                Some(Ok(r)) => {
                    if let Some(before) = &before {
                        self.plan_iteration(p, cpu, sregs, before);
                    }
                    self.emit_step(p, &r, sink);
                    before = Some(r);
                }
                // The iterations so far are steps; the rest, which cannot
                // be told apart, are the exit's registers after a gap.
                Some(Err(Unreadable)) => {
                    self.emit_step(p, regs, sink);
                    self.gap(p.pc, p.pc, sink);
                }
                None => return n,
            }
        }
    }

    /// Instructions the last exit covered: the steps it recorded (see
    /// [`vtrace_vmm::ExitAnswer::instructions`]).
    pub fn steps_at_exit(&self) -> u64 {
        self.stats.steps - self.steps_before_exit
    }

    /// A turn of the CPU this engine follows begins (a machine of several
    /// CPUs).
    pub fn start_turn(&mut self) {
        self.turn_start = self.stats.steps;
    }

    /// Whether the CPU's turn may end here, by the turn order's rule
    /// ([`TurnSoFar::may_end`]) over what this engine saw of the turn: its
    /// steps, a REP stopped between iterations, and the last step's
    /// instruction ([`Decoded::holds_turn`]).
    pub fn turn_may_end(&self) -> bool {
        TurnSoFar {
            steps: self.stats.steps.saturating_sub(self.turn_start),
            mid_rep: self.mid_rep,
            held: self.holds_turn,
        }
        .may_end()
    }

    /// Whether a REP string instruction stopped between iterations at the
    /// last exit (it runs on at the same pc).
    pub fn mid_rep(&self) -> bool {
        self.mid_rep
    }

    /// Where the near `ret` or indirect `jmp` at `p` went, from the
    /// registers after it (it changed none but RSP) and guest memory;
    /// `None` for any other instruction or an unreadable address.
    fn indirect_target(
        &mut self,
        cpu: &dyn CpuView,
        sregs: &SpecialRegisters,
        regs: &Registers,
        p: &Pending,
    ) -> Option<u64> {
        use iced_x86::{Mnemonic, OpKind};
        let insn = p.decoded?.insn;
        let mut read = |addr: u64| {
            let mut b = [0u8; 8];
            (self.walker.read(cpu, sregs, addr, &mut b) == 8).then(|| u64::from_le_bytes(b))
        };
        match (insn.mnemonic(), insn.op0_kind()) {
            (Mnemonic::Ret, kind) => {
                let extra = if kind == OpKind::Immediate16 {
                    u64::from(insn.immediate16())
                } else {
                    0
                };
                read(regs.rsp.wrapping_sub(8 + extra))
            }
            (Mnemonic::Jmp, OpKind::Register) => regs.value(insn.op0_register()),
            (Mnemonic::Jmp, OpKind::Memory) => {
                let addr = if insn.is_ip_rel_memory_operand() {
                    insn.ip_rel_memory_address()
                } else {
                    insn.virtual_address(0, 0, |r, _, _| {
                        if r.is_segment_register() {
                            Some(0)
                        } else {
                            regs.value(r)
                        }
                    })?
                };
                read(addr)
            }
            _ => None,
        }
    }

    /// Handles one exit while tracing. Generic over the sink so that a
    /// step reaches the recorder's encoder without dynamic calls.
    pub fn exit<S: RecordSink>(
        &mut self,
        view: &ExitView,
        cpu: &mut dyn CpuView,
        sink: &mut S,
    ) -> Directive {
        if !self.started {
            return Directive::Continue;
        }
        self.steps_before_exit = self.stats.steps;
        match *view {
            ExitView::Debug { breakpoint: false }
            | ExitView::IoOut {
                completed: true, ..
            }
            | ExitView::CompletedByVmm { .. } => self.after_instruction(view, cpu, sink),
            ExitView::IoOut {
                port,
                size,
                value,
                completed: false,
            } => {
                // KVM's fast path: the OUT completes, and steps, on the
                // next entry, like an IN.
                self.completing = true;
                self.deferred.push(Event::Io {
                    port,
                    size,
                    write: true,
                    value,
                });
                Directive::Continue
            }
            ExitView::IoIn { port, size, value } => {
                self.completing = true;
                self.deferred.push(Event::Io {
                    port,
                    size,
                    write: false,
                    value,
                });
                Directive::Continue
            }
            ExitView::Hypercall { call, result } => {
                self.completing = true;
                self.deferred.push(Event::Hypercall {
                    command: call.command,
                    args: call.args,
                    result,
                });
                Directive::Continue
            }
            ExitView::Mmio {
                addr,
                size,
                write,
                value,
            } => {
                let event = Event::Mmio {
                    addr,
                    size,
                    write,
                    value,
                };
                self.mmio(event, write, cpu, sink)
            }
            ExitView::FaultDelivered { vector, error_code } => {
                self.fault_delivered(vector, error_code, cpu, sink);
                Directive::Continue
            }
            // KVM exits for HLT (without an in-kernel irqchip) with RIP past
            // it, where the trap flag did not stop before it (a STI shadow).
            // An emulating host may also report a HLT it already stepped once
            // more, after the VMM delivered an interrupt through the IDT:
            // no instruction ran, and the guest is not halted.
            ExitView::Halt => {
                let rip = linear_pc(&cpu.sregs(), cpu.regs().rip);
                if self.pending.is_some_and(|p| p.pc == rip) {
                    Directive::Continue
                } else {
                    self.after_instruction(view, cpu, sink)
                }
            }
            ExitView::Debug { breakpoint: true } | ExitView::Interrupted => Directive::Continue,
        }
    }

    /// Counts a write to guest state that failed, and says the first.
    fn wrote(&mut self, result: Result<(), vtrace_vmm::WriteError>) -> bool {
        let Err(e) = result else {
            return true;
        };
        if self.stats.failed_writes == 0 {
            tracing::warn!("a write to guest state failed ({e}); the guest may see the tracer");
        }
        self.stats.failed_writes += 1;
        false
    }
}

#[cfg(test)]
mod tests {
    //! The engine against a fake vCPU: flat guest memory with an identity
    //! map, registers set by hand to what each kind of host reports.
    use super::*;
    use vtrace_storage::InterruptSource;
    use vtrace_vmm::Hypercall;
    use vtrace_x86::rflags::TF as RFLAGS_TF;

    use crate::test_machine::{machine, FlatCpu, CODE, PF_HANDLER, STACK, TIMER_HANDLER};
    use vtrace_x86::PhysicalMemory;

    fn steps(recs: &[Record]) -> Vec<u64> {
        recs.iter()
            .filter_map(|r| {
                if let Record::Step(s) = r {
                    Some(s.pc)
                } else {
                    None
                }
            })
            .collect()
    }

    fn debug_exit(
        engine: &mut Engine,
        cpu: &mut FlatCpu,
        rip: u64,
        sink: &mut Vec<Record>,
    ) -> Directive {
        cpu.regs.rip = rip;
        engine.exit(&ExitView::Debug { breakpoint: false }, cpu, sink)
    }

    #[test]
    fn a_turn_ends_after_a_whole_step_but_not_after_a_store_or_pause() {
        // mov [rdi], al; pause; nop; nop
        let mut cpu = machine(&[0x88, 0x07, 0xf3, 0x90, 0x90, 0x90]);
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        e.start_turn();
        assert!(!e.turn_may_end(), "nothing ran in this turn yet");
        debug_exit(&mut e, &mut cpu, CODE + 2, &mut out);
        assert!(!e.turn_may_end(), "a store: some host runs on from it");
        debug_exit(&mut e, &mut cpu, CODE + 4, &mut out);
        assert!(!e.turn_may_end(), "PAUSE: QEMU's SVM runs on from it");
        debug_exit(&mut e, &mut cpu, CODE + 5, &mut out);
        assert!(e.turn_may_end());
        e.start_turn();
        assert!(!e.turn_may_end(), "a new turn");
    }

    #[test]
    fn flags_undefined_where_an_interrupt_came_stay_undefined_after_its_iretq() {
        let mut e = Engine::new();
        // AF undefined (after an IMUL, say) where the interrupt came.
        e.undefined_flags = 0x10;
        e.note_frame(0x7f00);
        e.undefined_flags = 0;
        e.note_frame(0x6f00);
        assert_eq!(e.take_frame_flags(0x6f00), 0);
        assert_eq!(e.take_frame_flags(0x7f00), 0x10);
        assert_eq!(e.take_frame_flags(0x7f00), 0, "popped once");
        for slot in 0..100 {
            e.undefined_flags = 1;
            e.note_frame(slot * 8);
        }
        assert_eq!(e.frame_flags.len(), 64, "the newest frames only");
    }

    /// Where stepping rides on TF, a SYSCALL from user mode runs with TF
    /// kept out of FMASK, and the guest gets its FMASK back at the next
    /// exit, or when tracing stops before the SYSCALL ran.
    #[test]
    fn syscall_runs_without_tf_in_fmask_and_a_stop_gives_it_back() {
        let linux_fmask = 0x47700; // TF, IF, DF, NT, AC, ... as Linux sets it
        for stop_first in [false, true] {
            let mut cpu = machine(&[0x90, 0x0f, 0x05]);
            // User code: CPL 3 and pages it may use.
            cpu.sregs.cs.dpl = 3;
            cpu.sregs.cs.selector = 0x1b;
            cpu.put_u64(0x1000, 0x2000 | 7);
            cpu.put_u64(0x2000, 0x3000 | 7);
            cpu.put_u64(0x3000, 0x87);
            cpu.fmask = linux_fmask;
            let (mut e, mut out) = (Engine::new(), Vec::new());
            e.set_foresee_faults(true);
            e.begin(&mut cpu);
            debug_exit(&mut e, &mut cpu, CODE + 1, &mut out);
            assert_eq!(cpu.fmask, linux_fmask & !RFLAGS_TF, "SYSCALL pending");
            if stop_first {
                e.end();
                e.release(&mut cpu);
            } else {
                e.restore_fmask(&mut cpu);
            }
            assert_eq!(cpu.fmask, linux_fmask);
        }
    }

    /// TF put into R11 for a SYSRETQ is the guest's no more once it ran
    /// (or once tracing stopped before it did).
    #[test]
    fn sysretq_carries_tf_in_r11_and_gives_the_guest_its_own_back() {
        for stop_first in [false, true] {
            let mut cpu = machine(&[0x90, 0x48, 0x0f, 0x07]);
            cpu.regs.r11 = 0x202;
            let (mut e, mut out) = (Engine::new(), Vec::new());
            e.set_foresee_faults(true);
            e.begin(&mut cpu);
            debug_exit(&mut e, &mut cpu, CODE + 1, &mut out);
            assert_eq!(cpu.regs.r11, 0x302, "TF carried for the SYSRETQ");
            if stop_first {
                e.end();
                e.release(&mut cpu);
            } else {
                // SYSRETQ ran: user mode, where R11 was.
                cpu.sregs.cs.dpl = 3;
                cpu.sregs.cs.selector = 0x2b;
                debug_exit(&mut e, &mut cpu, 0x40_0000, &mut out);
                let last = steps(&out).len();
                assert_eq!(last, 2, "nop and sysretq");
            }
            assert_eq!(cpu.regs.r11, 0x202);
        }
    }

    /// A machine running `code`, interrupted by the VMM delivering the
    /// timer, whose handler has run its first instruction (`push 0`) and
    /// stands at its iretq with RSP = `rsp_at_iretq`.
    fn at_timer_iretq(code: &[u8], rsp_at_iretq: u64) -> (FlatCpu, Engine, Vec<Record>) {
        let mut cpu = machine(code);
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        cpu.regs.rip = TIMER_HANDLER;
        cpu.regs.rsp = STACK - 40;
        e.note_delivery(32, TIMER_HANDLER, &mut cpu, &mut out);
        cpu.regs.rsp = rsp_at_iretq;
        debug_exit(&mut e, &mut cpu, TIMER_HANDLER + 2, &mut out);
        (cpu, e, out)
    }

    // Host behaviours of KVM on AMD-V (seen in the AMD-V test machine) and
    // of this project's emulating hosts. Logic only: tests/amdv.rs runs
    // the real thing.

    #[test]
    fn an_out_that_completes_on_the_next_entry_is_one_step_then_its_io() {
        // out dx, al; nop. KVM's fast path exits with RIP still at the OUT.
        let mut cpu = machine(&[0xee, 0x90]);
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        let view = ExitView::IoOut {
            port: 0x3f8,
            size: 1,
            value: 0x41,
            completed: false,
        };
        e.exit(&view, &mut cpu, &mut out);
        assert!(out.is_empty(), "nothing ran yet: {out:?}");
        debug_exit(&mut e, &mut cpu, CODE + 1, &mut out);
        assert_eq!(steps(&out), vec![CODE]);
        assert!(matches!(
            out[1],
            Record::Event(Event::Io {
                write: true,
                value: 0x41,
                ..
            })
        ));
        assert_eq!(e.stats().gaps, 0);
    }

    /// Linux's page-table isolation: user mode's tables map none of the
    /// kernel's data; the kernel's own tables are in the page below.
    #[test]
    fn kernel_data_is_read_through_the_kernel_tables_under_isolation() {
        let mut cpu = machine(&[0x90]);
        cpu.put_u64(0x4000, 0x2000 | 3);
        cpu.put_u64(0x4000 + 511 * 8, 0x2000 | 3);
        cpu.put_u64(0x5000, 0x2000 | 7);
        cpu.sregs.cr3 = 0x5000;
        cpu.put_u64(0x18_0000, 0x1122_3344_5566_7788);
        let kernel = 0xffff_ff80_0018_0000;
        let mut e = Engine::new();
        let mut b = [0u8; 8];
        assert!(
            !e.read_linear(&mut cpu, kernel, &mut b),
            "not in user tables"
        );
        assert!(e.read_kernel(&mut cpu, kernel, &mut b));
        assert_eq!(u64::from_le_bytes(b), 0x1122_3344_5566_7788);
        // Without the isolation pair's bit, there is nothing else to try.
        cpu.sregs.cr3 = 0x1000;
        assert!(!e.read_kernel(&mut cpu, kernel, &mut b));
    }

    #[test]
    fn fences_the_host_did_not_trap_after_are_rebuilt_exactly() {
        // lfence; lfence; inc esi; nop: this project's hosts trap only
        // after the inc.
        let mut cpu = machine(&[0x0f, 0xae, 0xe8, 0x0f, 0xae, 0xe8, 0xff, 0xc6, 0x90]);
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        cpu.regs.rsi = 1;
        debug_exit(&mut e, &mut cpu, CODE + 8, &mut out);
        assert_eq!(steps(&out), vec![CODE, CODE + 3, CODE + 6]);
        let rsi: Vec<u64> = out
            .iter()
            .filter_map(|r| match r {
                Record::Step(s) => Some(s.regs.gpr[6]),
                Record::Event(_) => None,
            })
            .collect();
        assert_eq!(rsi, vec![0, 0, 1], "the fences change nothing");
        assert_eq!(e.stats().gaps, 0);
        assert_eq!(e.steps_at_exit(), 3, "the step clock counts all three");
    }

    #[test]
    fn the_instruction_in_an_sti_shadow_is_rebuilt_exactly() {
        // sti; mov eax, 1; nop: the trap comes only after the mov.
        let mut cpu = machine(&[0xfb, 0xb8, 0x01, 0x00, 0x00, 0x00, 0x90]);
        cpu.regs.rflags = 0x2;
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        cpu.regs.rflags = 0x202;
        cpu.regs.rax = 1;
        debug_exit(&mut e, &mut cpu, CODE + 6, &mut out);
        assert_eq!(steps(&out), vec![CODE, CODE + 1]);
        let regs: Vec<Regs> = out
            .iter()
            .filter_map(|r| {
                if let Record::Step(s) = r {
                    Some(s.regs)
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(
            (regs[0].rflags, regs[0].gpr[0]),
            (0x202, 0),
            "sti: IF set, rax untouched"
        );
        assert_eq!(regs[1].gpr[0], 1);
        assert_eq!(e.stats().gaps, 0);
    }

    #[test]
    fn a_rep_batch_becomes_one_step_per_iteration_and_the_clock_counts_them() {
        // rep stosb; nop. KVM's emulator runs 3 iterations, then exits with
        // RIP still at the instruction and RCX at 0, then moves past it.
        let mut cpu = machine(&[0xf3, 0xaa, 0x90]);
        cpu.regs.rcx = 3;
        cpu.regs.rdi = 0x50000;
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        cpu.regs.rcx = 0;
        cpu.regs.rdi = 0x50003;
        debug_exit(&mut e, &mut cpu, CODE, &mut out);
        assert_eq!(e.steps_at_exit(), 3, "the clock counts each iteration");
        assert!(e.mid_rep(), "interrupts wait for the instruction's end");
        debug_exit(&mut e, &mut cpu, CODE + 2, &mut out);
        assert_eq!(e.steps_at_exit(), 0, "no instruction ran");
        assert!(!e.mid_rep());
        assert_eq!(steps(&out), vec![CODE, CODE, CODE]);
        // A host that traps after each iteration gives the same records.
        let mut cpu2 = machine(&[0xf3, 0xaa, 0x90]);
        cpu2.regs.rcx = 3;
        cpu2.regs.rdi = 0x50000;
        let (mut e2, mut out2) = (Engine::new(), Vec::new());
        e2.begin(&mut cpu2);
        for i in 1..=3u64 {
            cpu2.regs.rcx = 3 - i;
            cpu2.regs.rdi = 0x50000 + i;
            let rip = if i == 3 { CODE + 2 } else { CODE };
            debug_exit(&mut e2, &mut cpu2, rip, &mut out2);
            assert_eq!(e2.steps_at_exit(), 1);
        }
        assert_eq!(out, out2);
    }

    #[test]
    fn pushf_leaves_no_trap_flag_in_guest_memory() {
        // pushfq; nop. A TF host's PUSHF writes TF into the image; the
        // VMM's engine runs no TF, so a TF there is the guest's own.
        for (trap_flag_host, image) in [(true, 0x202), (false, 0x302)] {
            let mut cpu = machine(&[0x9c, 0x90]);
            let (mut e, mut out) = (Engine::new(), Vec::new());
            e.set_foresee_faults(trap_flag_host);
            e.begin(&mut cpu);
            cpu.regs.rsp = STACK - 8;
            cpu.put_u64(STACK - 8, 0x302);
            debug_exit(&mut e, &mut cpu, CODE + 1, &mut out);
            let mut b = [0u8; 8];
            assert!(cpu.read_physical(STACK - 8, &mut b));
            assert_eq!(u64::from_le_bytes(b), image, "TF host: {trap_flag_host}");
        }
    }

    #[test]
    fn a_page_fault_handled_out_of_sight_is_a_gap() {
        // mov [rbx], al; nop. On a TF host the CPU delivers the fault, its
        // handler runs unstepped and returns; only CR2 tells.
        let mut cpu = machine(&[0x88, 0x03, 0x90]);
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        cpu.sregs.cr2 = 0x40_0000;
        debug_exit(&mut e, &mut cpu, CODE + 2, &mut out);
        assert_eq!(e.stats().gaps, 1);
        assert_eq!(steps(&out), vec![CODE]);
    }

    #[test]
    fn status_flags_left_undefined_are_recorded_as_zero_until_defined() {
        // shl eax, 21 (AF undefined); nop; add eax, 0 (defines AF)
        let mut cpu = machine(&[0xc1, 0xe0, 0x15, 0x90, 0x83, 0xc0, 0x00, 0x90]);
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        cpu.regs.rflags = 0x202 | 0x10;
        debug_exit(&mut e, &mut cpu, CODE + 3, &mut out);
        debug_exit(&mut e, &mut cpu, CODE + 4, &mut out);
        debug_exit(&mut e, &mut cpu, CODE + 7, &mut out);
        let flags: Vec<u64> = out
            .iter()
            .filter_map(|r| {
                if let Record::Step(s) = r {
                    Some(s.regs.rflags)
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(flags, vec![0x202, 0x202, 0x212]);
    }

    #[test]
    fn straight_line_code_and_a_gap() {
        // nop; nop; jmp +0 (to the next instruction)
        let mut cpu = machine(&[0x90, 0x90, 0xeb, 0x00, 0x90]);
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        debug_exit(&mut e, &mut cpu, CODE + 1, &mut out);
        debug_exit(&mut e, &mut cpu, CODE + 2, &mut out);
        debug_exit(&mut e, &mut cpu, CODE + 4, &mut out);
        assert_eq!(steps(&out), vec![CODE, CODE + 1, CODE + 2]);
        assert_eq!(e.stats().gaps, 0);
        // The nop at CODE+4 "lands" somewhere it cannot go.
        debug_exit(&mut e, &mut cpu, CODE + 0x100, &mut out);
        assert_eq!(
            out.last(),
            Some(&Record::Event(Event::Gap {
                from: CODE + 5,
                to: CODE + 0x100
            }))
        );
    }

    #[test]
    fn queued_injection_reconstructs_the_handlers_first_step() {
        let mut cpu = machine(&[0x90, 0x90]);
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        e.note_injection(32);
        // KVM delivered before the nop and stepped the handler's push.
        cpu.regs.rsp = STACK - 48;
        debug_exit(&mut e, &mut cpu, TIMER_HANDLER + 2, &mut out);
        assert_eq!(
            out[0],
            Record::Event(Event::Interrupt {
                vector: 32,
                error_code: None,
                source: InterruptSource::Injected
            })
        );
        assert!(
            matches!(&out[1], Record::Step(s) if s.pc == TIMER_HANDLER && s.regs.gpr[4] == STACK - 48)
        );
        assert_eq!(e.stats().gaps, 0);
    }

    #[test]
    fn delivery_by_the_vmm_steps_the_handler_normally() {
        let (mut cpu, mut e, mut out) = at_timer_iretq(&[0x90, 0x90], STACK - 48);
        // iretq back to the interrupted nop: TF may be gone, so re-arm. The
        // engine checks the target against the RIP the iretq pops.
        cpu.put_u64(STACK - 48, CODE);
        cpu.regs.rsp = STACK;
        let d = debug_exit(&mut e, &mut cpu, CODE, &mut out);
        assert_eq!(d, Directive::ReArm);
        assert_eq!(steps(&out), vec![TIMER_HANDLER, TIMER_HANDLER + 2]);
        assert_eq!(e.stats().gaps, 0);
    }

    #[test]
    fn a_ret_run_without_its_exit_after_iretq_is_checked_then_recorded() {
        for (lands_where_ret_goes, gaps) in [(true, 0), (false, 1)] {
            // ret at CODE; its return address on the interrupted stack.
            let (mut cpu, mut e, mut out) = at_timer_iretq(&[0xc3, 0x90], STACK - 48);
            // The iretq pops CODE; KVM reports the next exit only after
            // the ret there ran too.
            cpu.put_u64(STACK - 48, CODE);
            let interrupted_rsp = STACK - 0x100;
            let back = if lands_where_ret_goes {
                CODE + 0x40
            } else {
                CODE + 0x80
            };
            cpu.put_u64(interrupted_rsp, CODE + 0x40);
            cpu.regs.rsp = interrupted_rsp + 8;
            debug_exit(&mut e, &mut cpu, back, &mut out);
            assert_eq!(e.stats().gaps, gaps);
            if lands_where_ret_goes {
                assert_eq!(steps(&out), vec![TIMER_HANDLER, TIMER_HANDLER + 2, CODE]);
                assert_eq!(e.stats().folded_after_iret, 1);
            } else {
                assert_eq!(steps(&out), vec![TIMER_HANDLER, TIMER_HANDLER + 2]);
            }
        }
    }

    #[test]
    fn a_fault_at_the_iretq_target_run_without_exits_is_inferred() {
        // mov [rax], al at CODE faults when the iretq returns to it. The
        // interrupted code's stack is at S; the timer's frame below it is
        // what the iretq pops: RIP = CODE at S - 40, RSP = S at S - 16.
        let s = STACK - 0x100;
        let (mut cpu, mut e, mut out) = at_timer_iretq(&[0x88, 0x00, 0x90], s - 40);
        cpu.put_u64(s - 40, CODE);
        cpu.put_u64(s - 16, s);
        // The store faults; the #PF frame lands on the same place, with its
        // error code below, and KVM's next exit comes after the #PF
        // handler's first push.
        cpu.put_u64(s - 48, 0x2);
        cpu.regs.rsp = s - 56;
        debug_exit(&mut e, &mut cpu, PF_HANDLER + 2, &mut out);
        assert_eq!(e.stats().gaps, 0, "{out:?}");
        assert_eq!(
            steps(&out),
            vec![TIMER_HANDLER, TIMER_HANDLER + 2, PF_HANDLER],
            "the store did not run: it runs again after the handler"
        );
        assert!(out.contains(&Record::Event(Event::Interrupt {
            vector: 14,
            error_code: Some(2),
            source: InterruptSource::InferredFromIdt
        })));
        assert_eq!(e.take_exception(), Some(14));
    }

    #[test]
    fn an_in_completes_before_a_queued_interrupt_arrives() {
        // in eax, dx; nop
        let mut cpu = machine(&[0xed, 0x90]);
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        let call = Hypercall {
            command: 2,
            ..Hypercall::default()
        };
        e.exit(&ExitView::Hypercall { call, result: 0 }, &mut cpu, &mut out);
        e.note_injection(32);
        debug_exit(&mut e, &mut cpu, CODE + 1, &mut out);
        assert_eq!(
            steps(&out),
            vec![CODE],
            "the IN's own step, no interrupt yet"
        );
        assert!(matches!(
            out[1],
            Record::Event(Event::Hypercall { command: 2, .. })
        ));
        cpu.regs.rsp = STACK - 48;
        debug_exit(&mut e, &mut cpu, TIMER_HANDLER + 2, &mut out);
        assert!(matches!(
            out[2],
            Record::Event(Event::Interrupt { vector: 32, .. })
        ));
        assert_eq!(steps(&out), vec![CODE, TIMER_HANDLER]);
        assert_eq!(e.stats().gaps, 0);
    }

    #[test]
    fn a_page_fault_is_inferred_with_its_error_code() {
        // mov [rax], al  -- faults; the handler's push has run at the exit.
        let mut cpu = machine(&[0x88, 0x00, 0x90]);
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        // Frame: error code at (old rsp aligned) - 48.
        cpu.put_u64(STACK - 48, 0x2);
        cpu.regs.rsp = STACK - 56;
        debug_exit(&mut e, &mut cpu, PF_HANDLER + 2, &mut out);
        assert_eq!(
            out[0],
            Record::Event(Event::Interrupt {
                vector: 14,
                error_code: Some(2),
                source: InterruptSource::InferredFromIdt
            })
        );
        assert_eq!(
            steps(&out),
            vec![PF_HANDLER],
            "the faulting store did not run"
        );
        assert_eq!(e.take_exception(), Some(14));
    }

    #[test]
    fn exception_caught_at_its_handler_entry_on_a_trap_flag_host() {
        // mov [rax], al faults; on a TF host the CPU runs the delivery and a
        // breakpoint on the handler's entry stops it there.
        let mut cpu = machine(&[0x88, 0x00, 0x90]);
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        assert_eq!(e.handler_of(14, &mut cpu), Some(PF_HANDLER));
        cpu.put_u64(STACK - 48, 0x6);
        cpu.regs.rip = PF_HANDLER;
        cpu.regs.rsp = STACK - 48;
        e.exit(&ExitView::Debug { breakpoint: true }, &mut cpu, &mut out);
        e.exception_entry(14, PF_HANDLER, &mut cpu, &mut out);
        assert_eq!(
            out,
            vec![Record::Event(Event::Interrupt {
                vector: 14,
                error_code: Some(6),
                source: InterruptSource::ReportedByKvm
            })]
        );
        // Stepping on from the entry records the handler from its first
        // instruction, and the faulting store was never recorded.
        debug_exit(&mut e, &mut cpu, PF_HANDLER + 2, &mut out);
        assert_eq!(steps(&out), vec![PF_HANDLER]);
        assert_eq!(e.stats().gaps, 0);
    }

    #[test]
    fn an_mmio_store_and_the_instruction_after_it_from_one_trap() {
        // mov [rdi], al; inc eax; nop: the store exits for MMIO, and the
        // next trap comes after the inc (this project's hosts).
        let mut cpu = machine(&[0x88, 0x07, 0xff, 0xc0, 0x90]);
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        let view = ExitView::Mmio {
            addr: 0xfed0_0000,
            size: 1,
            write: true,
            value: 0,
        };
        e.exit(&view, &mut cpu, &mut out);
        cpu.regs.rax += 1;
        debug_exit(&mut e, &mut cpu, CODE + 4, &mut out);
        assert_eq!(steps(&out), vec![CODE, CODE + 2]);
        assert!(matches!(
            out[1],
            Record::Event(Event::Mmio { write: true, .. })
        ));
        assert_eq!(e.stats().gaps, 0);
        // The store changed no register; the inc's step has rax + 1.
        let regs: Vec<u64> = out
            .iter()
            .filter_map(|r| match r {
                Record::Step(s) => Some(s.regs.gpr[0]),
                Record::Event(_) => None,
            })
            .collect();
        assert_eq!(regs, vec![0, 1]);
    }

    #[test]
    fn two_mmio_stores_in_a_row_and_the_instruction_after_them() {
        // mov [rdi], al; mov [rsi], al; inc eax; nop: as a local APIC's
        // ICR is written (high, then low). The first store's exit, then
        // the second's with RIP past it (this project's hosts ran both),
        // then the trap after the inc.
        let mut cpu = machine(&[0x88, 0x07, 0x88, 0x06, 0xff, 0xc0, 0x90]);
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        let store = |value| ExitView::Mmio {
            addr: 0xfee0_0300,
            size: 1,
            write: true,
            value,
        };
        e.exit(&store(1), &mut cpu, &mut out);
        assert_eq!(e.steps_at_exit(), 0);
        cpu.regs.rip = CODE + 4;
        e.exit(&store(2), &mut cpu, &mut out);
        assert_eq!(e.steps_at_exit(), 2, "both stores, for the step clock");
        cpu.regs.rax += 1;
        debug_exit(&mut e, &mut cpu, CODE + 6, &mut out);
        assert_eq!(steps(&out), vec![CODE, CODE + 2, CODE + 4]);
        let events: Vec<usize> = out
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Record::Event(Event::Mmio { .. })))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(events, vec![1, 3], "each store's event after its step");
        assert_eq!(e.stats().gaps, 0);
    }

    #[test]
    fn hlt_asks_the_vmm_to_wait_and_out_is_recorded_after_its_step() {
        // out dx, al; hlt
        let mut cpu = machine(&[0xee, 0xf4, 0x90]);
        let (mut e, mut out) = (Engine::new(), Vec::new());
        e.begin(&mut cpu);
        cpu.regs.rip = CODE + 1;
        let view = ExitView::IoOut {
            port: 0x3f8,
            size: 1,
            value: 0x41,
            completed: true,
        };
        e.exit(&view, &mut cpu, &mut out);
        assert!(matches!(out[0], Record::Step(s) if s.pc == CODE));
        assert!(matches!(
            out[1],
            Record::Event(Event::Io {
                port: 0x3f8,
                write: true,
                value: 0x41,
                ..
            })
        ));
        let d = debug_exit(&mut e, &mut cpu, CODE + 2, &mut out);
        assert_eq!(d, Directive::Halt);
        assert_eq!(out.last(), Some(&Record::Event(Event::Halt)));
    }
}
