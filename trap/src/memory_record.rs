//! Which memory values a step's registers leave unknown, and where they
//! are: what `vtrace run --record-values` reads from guest memory.
//!
//! The trace records registers, not memory. The analyzer derives a load's
//! or a store's value where the instruction ties it to a register, an
//! immediate or the next pc (`mov`, `push`, `pop`, `call`, `ret`, `jmp
//! [m]`, `leave`, `stos`, `lods`, `pushf`, `xchg`: the one table of
//! `vtrace_x86`'s operands, which says so in `registers_give_values`). For
//! every other instruction that touches memory (arithmetic on
//! memory, compares, `lock xadd`, `cmpxchg`, `movs`, ...), [`plan`] lists
//! each access of at most 8 bytes, in the order of iced-x86's memory
//! operands (the analyzer walks them in the same order and matches them
//! by position), at the linear address the CPU uses (FS and GS bases
//! included). The engine reads loads before the instruction runs and
//! stores after it.

use iced_x86::{Instruction, OpAccess, UsedMemory};
use vtrace_storage::{MemoryValue, MAX_MEMORY_VALUES};
use vtrace_x86::{registers_give_values, Registers, SpecialRegisters};

use crate::fault::register;

/// The accesses of one instruction whose values are to be recorded.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Plan {
    /// The instruction's pc and address space, so that the values go
    /// with its step and no other.
    pub pc: u64,
    pub cr3: u64,
    pub accesses: [MemoryValue; MAX_MEMORY_VALUES],
    pub len: u8,
}

impl Plan {
    /// The planned accesses.
    pub fn accesses(&self) -> &[MemoryValue] {
        &self.accesses[..usize::from(self.len)]
    }

    /// The planned accesses, to fill in their values.
    pub fn accesses_mut(&mut self) -> &mut [MemoryValue] {
        &mut self.accesses[..usize::from(self.len)]
    }
}

/// The accesses of `insn` at `pc` to record, its registers before it
/// being `regs`: none where the registers give the values
/// ([`registers_give_values`]) or where it touches no memory. `used` is its memory operands as iced-x86 works them out.
pub(crate) fn plan(
    pc: u64,
    insn: &Instruction,
    used: &[UsedMemory],
    regs: &Registers,
    sregs: &SpecialRegisters,
) -> Option<Plan> {
    if used.is_empty() || registers_give_values(insn, used) {
        return None;
    }
    let mut plan = Plan {
        pc,
        cr3: sregs.cr3,
        ..Plan::default()
    };
    for m in used {
        // A REP string instruction's operand has no size in iced-x86 (the
        // count is not known); each step is one element.
        let size = match m.memory_size().size() {
            0 => insn.memory_size().size(),
            size => size,
        };
        let Ok(size @ 1..=8) = u8::try_from(size) else {
            continue;
        };
        let Some(addr) = m.virtual_address(0, |reg, _, _| register(regs, sregs, reg)) else {
            continue;
        };
        let (load, store) = directions(m.access());
        for write in [false, true] {
            if (write && !store) || (!write && !load) {
                continue;
            }
            let Some(slot) = plan.accesses.get_mut(usize::from(plan.len)) else {
                return Some(plan);
            };
            *slot = MemoryValue {
                addr,
                size,
                write,
                value: None,
            };
            plan.len += 1;
        }
    }
    (plan.len > 0).then_some(plan)
}

/// Whether an access loads and whether it stores, as the analyzer counts
/// them (conditional accesses included).
fn directions(access: OpAccess) -> (bool, bool) {
    match access {
        OpAccess::Read | OpAccess::CondRead => (true, false),
        OpAccess::Write | OpAccess::CondWrite => (false, true),
        OpAccess::ReadWrite | OpAccess::ReadCondWrite => (true, true),
        _ => (false, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, InstructionInfoFactory};

    fn decode(bytes: &[u8]) -> Instruction {
        Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE).decode()
    }

    fn planned(bytes: &[u8], regs: &Registers, sregs: &SpecialRegisters) -> Vec<MemoryValue> {
        let insn = decode(bytes);
        let mut factory = InstructionInfoFactory::new();
        let used = factory.info(&insn).used_memory().to_vec();
        plan(0x1000, &insn, &used, regs, sregs)
            .map(|p| p.accesses().to_vec())
            .unwrap_or_default()
    }

    fn access(addr: u64, size: u8, write: bool) -> MemoryValue {
        MemoryValue {
            addr,
            size,
            write,
            value: None,
        }
    }

    #[test]
    fn what_the_analyzer_derives_is_not_recorded() {
        for bytes in [
            &[0x48, 0x8b, 0x03][..],   // mov rax, [rbx]
            &[0x89, 0x43, 0x08],       // mov [rbx+8], eax
            &[0x48, 0x0f, 0xbe, 0x03], // movsx rax, byte [rbx]
            &[0x50],                   // push rax
            &[0x59],                   // pop rcx
            &[0xe8, 0, 1, 0, 0],       // call rel32
            &[0xff, 0x13],             // call [rbx]
            &[0xc3],                   // ret
            &[0xff, 0x23],             // jmp [rbx]
            &[0xc9],                   // leave
            &[0xf3, 0x48, 0xab],       // rep stosq
            &[0xac],                   // lodsb
            &[0x9c],                   // pushfq
            &[0x48, 0x87, 0x03],       // xchg [rbx], rax
            &[0x48, 0x01, 0xd8],       // add rax, rbx: no memory
        ] {
            assert!(
                planned(bytes, &Registers::default(), &SpecialRegisters::default()).is_empty(),
                "{bytes:x?}"
            );
        }
    }

    #[test]
    fn read_modify_write_compares_and_copies_are_recorded_in_operand_order() {
        let regs = Registers {
            rbx: 0x5000,
            rsi: 0x6000,
            rdi: 0x7000,
            rsp: 0x8000,
            ..Registers::default()
        };
        let sregs = SpecialRegisters::default();
        // add [rbx], eax: loaded and stored.
        assert_eq!(
            planned(&[0x01, 0x03], &regs, &sregs),
            [access(0x5000, 4, false), access(0x5000, 4, true)]
        );
        // cmp rax, [rbx]: a load.
        assert_eq!(
            planned(&[0x48, 0x3b, 0x03], &regs, &sregs),
            [access(0x5000, 8, false)]
        );
        // lock xadd [rbx], eax
        assert_eq!(
            planned(&[0xf0, 0x0f, 0xc1, 0x03], &regs, &sregs),
            [access(0x5000, 4, false), access(0x5000, 4, true)]
        );
        // movsb: iced-x86 names the destination first.
        assert_eq!(
            planned(&[0xa4], &regs, &sregs),
            [access(0x7000, 1, true), access(0x6000, 1, false)]
        );
        // rep movsq: one element a step.
        assert_eq!(
            planned(&[0xf3, 0x48, 0xa5], &regs, &sregs),
            [access(0x7000, 8, true), access(0x6000, 8, false)]
        );
        // push qword [rbx]: the load, then the stack slot.
        assert_eq!(
            planned(&[0xff, 0x33], &regs, &sregs),
            [access(0x5000, 8, false), access(0x7ff8, 8, true)]
        );
        // movdqu xmm0, [rbx]: 16 bytes, more than a value holds.
        assert!(planned(&[0xf3, 0x0f, 0x6f, 0x03], &regs, &sregs).is_empty());
    }

    #[test]
    fn gs_relative_accesses_are_at_the_linear_address() {
        let regs = Registers::default();
        let mut sregs = SpecialRegisters::default();
        sregs.gs.base = 0xffff_8880_1000_0000;
        // inc dword gs:[0x20] (Linux's per-CPU preempt count).
        assert_eq!(
            planned(&[0x65, 0xff, 0x04, 0x25, 0x20, 0, 0, 0], &regs, &sregs),
            [
                access(0xffff_8880_1000_0020, 4, false),
                access(0xffff_8880_1000_0020, 4, true)
            ]
        );
    }
}
