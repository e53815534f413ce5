//! `vtrace run --record-values`: the memory values of a step that its
//! registers do not give (see `memory_record`), read through the guest's
//! page tables (loads before the instruction runs, stores after it) and
//! recorded as an event just before its step.

use vtrace_storage::Event;
use vtrace_vmm::CpuView;
use vtrace_x86::{Registers, SpecialRegisters};

use super::{Engine, Pending, RecordSink};
use crate::memory_record::{self, Plan};
use crate::probe_values::read_u64;

impl Engine {
    /// Records the memory values the registers do not give, from the
    /// next [`Engine::begin`] on.
    pub fn set_record_values(&mut self, on: bool) {
        self.record_values = on;
    }

    /// Plans the pending instruction's values and reads its loads, with
    /// `regs` the registers before it.
    pub(super) fn plan_values(
        &mut self,
        cpu: &dyn CpuView,
        sregs: &SpecialRegisters,
        regs: &Registers,
    ) {
        self.values = None;
        let Some((pc, d)) = self.pending.and_then(|p| Some((p.pc, p.decoded?))) else {
            return;
        };
        self.values = self.plan_at(pc, &d.insn, cpu, sregs, regs, false);
    }

    /// The plan of `insn` at `pc` with `regs` before it, its loads read
    /// (its stores too where `stores`).
    fn plan_at(
        &mut self,
        pc: u64,
        insn: &iced_x86::Instruction,
        cpu: &dyn CpuView,
        sregs: &SpecialRegisters,
        regs: &Registers,
        stores: bool,
    ) -> Option<Plan> {
        let used = self.operands.used_memory(insn);
        let mut plan = memory_record::plan(pc, insn, used, regs, sregs)?;
        let read = &mut |at, buf: &mut [u8]| self.walker.read(cpu, sregs, at, buf);
        for a in plan
            .accesses_mut()
            .iter_mut()
            .filter(|a| stores || !a.write)
        {
            a.value = read_u64(a.addr, a.size, read);
        }
        Some(plan)
    }

    /// The pending instruction `p` ran: reads what it stored.
    pub(super) fn read_stored_values(
        &mut self,
        p: &Pending,
        cpu: &dyn CpuView,
        sregs: &SpecialRegisters,
    ) {
        let Some(plan) = self.values.as_mut().filter(|v| v.pc == p.pc) else {
            return;
        };
        let read = &mut |at, buf: &mut [u8]| self.walker.read(cpu, sregs, at, buf);
        for a in plan.accesses_mut().iter_mut().filter(|a| a.write) {
            a.value = read_u64(a.addr, a.size, read);
        }
    }

    /// A REP iteration after the first of a batch the host ran in one
    /// exit: its loads and stores both read after the batch (exact unless
    /// a later iteration stored over them).
    pub(super) fn plan_iteration(
        &mut self,
        p: &Pending,
        cpu: &dyn CpuView,
        sregs: &SpecialRegisters,
        before: &Registers,
    ) {
        if !self.record_values {
            return;
        }
        self.values = p
            .decoded
            .and_then(|d| self.plan_at(p.pc, &d.insn, cpu, sregs, before, true));
    }

    /// Records the values planned for step `p`, just before it.
    #[cold]
    pub(super) fn emit_values<S: RecordSink + ?Sized>(&mut self, p: &Pending, sink: &mut S) {
        if let Some(plan) = self.values.take() {
            if plan.pc == p.pc && plan.cr3 == p.cr3 {
                sink.event(&Event::MemoryValues(plan.accesses().to_vec()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The engine against a fake vCPU whose memory the test changes as
    //! the instruction would: what is read before and after a step.
    use vtrace_storage::{MemoryValue, Record};
    use vtrace_vmm::ExitView;

    use super::*;
    use crate::test_machine::{machine, CODE};

    const DATA: u64 = 0x5000;

    fn value(addr: u64, size: u8, write: bool, value: u64) -> MemoryValue {
        MemoryValue {
            addr,
            size,
            write,
            value: Some(value),
        }
    }

    #[test]
    fn a_read_modify_write_gets_its_load_before_and_its_store_after() {
        // add dword [rbx], 1; mov rax, [rbx]; nop
        let mut cpu = machine(&[0x83, 0x03, 0x01, 0x48, 0x8b, 0x03, 0x90]);
        cpu.regs.rbx = DATA;
        cpu.put(DATA, &41u32.to_le_bytes());
        let (mut e, mut out) = (Engine::new(), Vec::<Record>::new());
        e.set_record_values(true);
        e.begin(&mut cpu);
        // The add ran: memory holds the sum at its exit.
        cpu.put(DATA, &42u32.to_le_bytes());
        cpu.regs.rip = CODE + 3;
        e.exit(&ExitView::Debug { breakpoint: false }, &mut cpu, &mut out);
        // The load's value is rax after it: nothing recorded.
        cpu.regs.rip = CODE + 6;
        cpu.regs.rax = 42;
        e.exit(&ExitView::Debug { breakpoint: false }, &mut cpu, &mut out);
        let values = Event::MemoryValues(vec![value(DATA, 4, false, 41), value(DATA, 4, true, 42)]);
        assert_eq!(out[0], Record::Event(values));
        assert!(matches!(&out[1], Record::Step(s) if s.pc == CODE));
        assert!(matches!(&out[2], Record::Step(s) if s.pc == CODE + 3));
        assert_eq!(out.len(), 3, "{out:?}");
    }

    #[test]
    fn off_by_default_and_unreadable_memory_has_no_value() {
        // cmp byte [rbx], 0; nop
        let code = [0x80, 0x3b, 0x00, 0x90];
        let mut cpu = machine(&code);
        cpu.regs.rbx = DATA;
        let (mut e, mut out) = (Engine::new(), Vec::<Record>::new());
        e.begin(&mut cpu);
        cpu.regs.rip = CODE + 3;
        e.exit(&ExitView::Debug { breakpoint: false }, &mut cpu, &mut out);
        assert!(matches!(&out[..], [Record::Step(_)]), "{out:?}");

        // Past the 2 MiB the machine maps.
        let mut cpu = machine(&code);
        cpu.regs.rbx = 0x40_0000;
        let (mut e, mut out) = (Engine::new(), Vec::<Record>::new());
        e.set_record_values(true);
        e.begin(&mut cpu);
        cpu.regs.rip = CODE + 3;
        e.exit(&ExitView::Debug { breakpoint: false }, &mut cpu, &mut out);
        let unread = MemoryValue {
            addr: 0x40_0000,
            size: 1,
            write: false,
            value: None,
        };
        assert_eq!(out[0], Record::Event(Event::MemoryValues(vec![unread])));
    }
}
