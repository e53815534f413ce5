//! Whether a CPU's next step may run at the same time as another CPU's
//! (the VMM asks, see `vtrace_vmm::Monitor::runs_beside`).
//!
//! Two steps that write no memory cannot see each other: each reads what
//! it would have read had the other run first, so together they leave the
//! machine as they would one after the other, and the trace is the same.
//! An instruction qualifies where it:
//!
//! - writes no memory, by iced-x86's account of its operands (the stack
//!   included), and takes no LOCK;
//! - reads only RAM (an MMIO read reaches a device) through page walks,
//!   the fetch's included, that set no accessed bit: the bit must be set
//!   at every level already, or the walk writes a paging entry another
//!   CPU may read;
//! - reads nothing that moves with time or the host (RDTSC, RDRAND...),
//!   is not privileged (system state, I/O, HLT), and is no string
//!   instruction (a REP holds the CPU's turn);
//! - cannot lead to an IRETQ: before one, the tracer writes the trap flag
//!   it lends into the frame in memory (see `engine::trap_flag`), which
//!   the other CPU's step would then have run before. So the instruction
//!   at every place it may go to is decoded, and must not be one.
//!
//! 64-bit code only, as fault foresight.

use iced_x86::{FlowControl, Instruction, Mnemonic, OpAccess, OpKind};
use vtrace_vmm::CpuView;
use vtrace_x86::{Registers, SpecialRegisters};

use crate::fault::{register, Operands};
use crate::flow::DecodeCache;
use vtrace_x86::WalksNow;

/// What the judgement works with besides the CPU: the engine's operand
/// lists and decoded instructions (the places `insn` may go to are often
/// decoded already), and this look's page walks.
pub struct Judging<'a> {
    /// Where the instruction's memory operands are listed.
    pub operands: &'a mut Operands,
    /// The engine's decoded instructions, by address and bytes.
    pub decodes: &'a mut DecodeCache,
    /// The page walks of this judgement.
    pub walks: WalksNow,
}

/// Whether `insn`, about to run with `regs` and `sregs`, may step at the
/// same time as another CPU's step of which this is also true.
pub fn runs_beside(
    insn: &Instruction,
    regs: &Registers,
    sregs: &SpecialRegisters,
    cpu: &dyn CpuView,
    with: &mut Judging<'_>,
) -> bool {
    use vtrace_x86::efer::LMA;
    if sregs.efer & LMA == 0 || sregs.cs.l == 0 || regs.rip != insn.ip() {
        return false;
    }
    if !quiet(insn) {
        return false;
    }
    let last = insn.ip().wrapping_add(insn.len() as u64 - 1);
    let walks = &mut with.walks;
    if !reads_ram_quietly(cpu, sregs, walks, insn.ip(), last) {
        return false;
    }
    for m in with.operands.used_memory(insn) {
        match m.access() {
            OpAccess::Read | OpAccess::CondRead => {}
            // LEA, NOP and prefetches touch no memory.
            OpAccess::NoMemAccess | OpAccess::None => continue,
            _ => return false,
        }
        let Some(addr) = m.virtual_address(0, |reg, _, _| register(regs, sregs, reg)) else {
            return false;
        };
        let size = m.memory_size().size().max(1) as u64;
        if !reads_ram_quietly(cpu, sregs, walks, addr, addr.wrapping_add(size - 1)) {
            return false;
        }
    }
    goes_to_no_iret(insn, regs, sregs, cpu, with)
}

/// Whether the kind of `insn` allows it: see the module documentation.
fn quiet(insn: &Instruction) -> bool {
    let flow = matches!(
        insn.flow_control(),
        FlowControl::Next
            | FlowControl::UnconditionalBranch
            | FlowControl::ConditionalBranch
            | FlowControl::IndirectBranch
            | FlowControl::Return
    );
    let timed = matches!(
        insn.mnemonic(),
        Mnemonic::Rdtsc
            | Mnemonic::Rdtscp
            | Mnemonic::Rdpid
            | Mnemonic::Rdpmc
            | Mnemonic::Rdrand
            | Mnemonic::Rdseed
            | Mnemonic::Cpuid
            | Mnemonic::Pause
            | Mnemonic::Xgetbv
            | Mnemonic::Retf
            | Mnemonic::Iret
            | Mnemonic::Iretd
            | Mnemonic::Iretq
            | Mnemonic::Sysret
            | Mnemonic::Sysretq
            | Mnemonic::Sysexit
            | Mnemonic::Sysexitq
    );
    flow && !timed
        && !insn.is_privileged()
        && !insn.is_string_instruction()
        && !insn.has_lock_prefix()
        && !matches!(insn.op0_kind(), OpKind::FarBranch16 | OpKind::FarBranch32)
}

/// Whether bytes `first..=last` (linear) lie in RAM on pages whose walks
/// set no accessed bit.
fn reads_ram_quietly(
    cpu: &dyn CpuView,
    sregs: &SpecialRegisters,
    walks: &mut WalksNow,
    first: u64,
    last: u64,
) -> bool {
    let other_page = (first ^ last) & !0xfff != 0;
    std::iter::once(first)
        .chain(other_page.then_some(last))
        .all(|at| match walks.walk(cpu, sregs, at) {
            Some((phys, access)) => access.accessed && cpu.read_physical(phys, &mut [0u8; 1]),
            None => false,
        })
}

/// Whether no place `insn` may go to holds an IRET.
fn goes_to_no_iret(
    insn: &Instruction,
    regs: &Registers,
    sregs: &SpecialRegisters,
    cpu: &dyn CpuView,
    with: &mut Judging<'_>,
) -> bool {
    let mut read = |addr: u64| {
        let mut b = [0u8; 8];
        (with.walks.read(cpu, sregs, addr, &mut b) == 8).then(|| u64::from_le_bytes(b))
    };
    let after = insn.next_ip();
    let targets: [Option<u64>; 2] = match insn.flow_control() {
        FlowControl::Next => [Some(after), None],
        FlowControl::ConditionalBranch => [Some(after), Some(insn.near_branch_target())],
        FlowControl::UnconditionalBranch => [Some(insn.near_branch_target()), None],
        FlowControl::IndirectBranch => match insn.op0_kind() {
            OpKind::Register => [regs.value(insn.op0_register()), None],
            OpKind::Memory => {
                let addr = insn.virtual_address(0, 0, |r, _, _| register(regs, sregs, r));
                [addr.and_then(read), None]
            }
            _ => [None, None],
        },
        FlowControl::Return => [read(regs.rsp), None],
        _ => [None, None],
    };
    if targets[0].is_none() {
        return false;
    }
    targets
        .into_iter()
        .flatten()
        .all(|at| !is_iret_at(at, sregs, cpu, with))
}

/// Whether the instruction at `at` is an IRET (or cannot be read or
/// decoded: then it may be).
fn is_iret_at(
    at: u64,
    sregs: &SpecialRegisters,
    cpu: &dyn CpuView,
    with: &mut Judging<'_>,
) -> bool {
    let mut bytes = [0u8; 15];
    let n = with.walks.read(cpu, sregs, at, &mut bytes);
    match with.decodes.decode(&bytes, n, 64, at) {
        Some((next, _)) => matches!(
            next.insn.mnemonic(),
            Mnemonic::Iret | Mnemonic::Iretd | Mnemonic::Iretq
        ),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_machine::FlatCpu;
    use iced_x86::{Decoder, DecoderOptions};

    /// [`runs_beside`] with fresh operand lists, decodes and walks.
    fn judge(
        insn: &Instruction,
        regs: &Registers,
        sregs: &SpecialRegisters,
        cpu: &FlatCpu,
    ) -> bool {
        let mut with = Judging {
            operands: &mut Operands::default(),
            decodes: &mut DecodeCache::default(),
            walks: WalksNow::default(),
        };
        runs_beside(insn, regs, sregs, cpu, &mut with)
    }

    /// The walker tests' machine, its paging entries accessed already.
    fn machine(code: &[u8]) -> FlatCpu {
        let cpu = crate::test_machine::machine(code);
        cpu.put_u64(0x1000, 0x2000 | 0x23);
        cpu.put_u64(0x2000, 0x3000 | 0x23);
        cpu.put_u64(LEAF, 0xa3);
        cpu
    }

    /// The 2 MiB page's entry that maps all of the test machine.
    const LEAF: u64 = 0x3000;

    /// The instruction at the flat test machine's pc.
    fn at_pc(cpu: &mut FlatCpu) -> (Instruction, Registers, SpecialRegisters) {
        let regs = cpu.regs();
        let sregs = cpu.sregs();
        let mut bytes = [0u8; 15];
        let n = WalksNow::default().read(cpu, &sregs, regs.rip, &mut bytes);
        let insn = Decoder::with_ip(64, &bytes[..n], regs.rip, DecoderOptions::NONE).decode();
        (insn, regs, sregs)
    }

    fn beside(code: &[u8]) -> bool {
        let mut cpu = machine(code);
        let (insn, regs, sregs) = at_pc(&mut cpu);
        judge(&insn, &regs, &sregs, &cpu)
    }

    #[test]
    fn register_work_and_plain_loads_run_beside() {
        assert!(beside(&[0x48, 0x01, 0xd8])); // add rax, rbx
        assert!(beside(&[0x48, 0x8b, 0x04, 0x24])); // mov rax, [rsp]
        assert!(beside(&[0x75, 0x00])); // jne +0
        assert!(beside(&[0x90])); // nop
    }

    #[test]
    fn stores_and_locked_or_timed_instructions_do_not() {
        assert!(!beside(&[0x48, 0x89, 0x04, 0x24])); // mov [rsp], rax
        assert!(!beside(&[0x50])); // push rax
        assert!(!beside(&[0xe8, 0, 0, 0, 0])); // call +0
        assert!(!beside(&[0x0f, 0x31])); // rdtsc
        assert!(!beside(&[0xf3, 0x90])); // pause
        assert!(!beside(&[0xf4])); // hlt
        assert!(!beside(&[0xe6, 0x80])); // out 0x80, al
        assert!(!beside(&[0xf0, 0x48, 0x0f, 0xc1, 0x04, 0x24])); // lock xadd
        assert!(!beside(&[0xf3, 0x48, 0xab])); // rep stosq
    }

    #[test]
    fn nothing_that_goes_to_an_iret_runs_beside() {
        assert!(!beside(&[0x90, 0x48, 0xcf])); // nop; iretq
        assert!(!beside(&[0x48, 0xcf])); // iretq itself
        assert!(!beside(&[0x74, 0x01, 0x90, 0x48, 0xcf])); // je to an iretq
    }

    #[test]
    fn a_read_of_what_is_not_ram_does_not() {
        // mov rax, [0x200000], a 2 MiB page that is accessed, its frame
        // first where no RAM backs it (a device's), then in RAM.
        let mut cpu = machine(&[0x48, 0x8b, 0x04, 0x25, 0x00, 0x00, 0x20, 0x00]);
        cpu.put_u64(LEAF + 8, 0x4000_0000 | 0xa3);
        let (insn, regs, sregs) = at_pc(&mut cpu);
        let beside = |cpu: &FlatCpu| judge(&insn, &regs, &sregs, cpu);
        assert!(!beside(&cpu));
        cpu.put_u64(LEAF + 8, 0xa3);
        assert!(beside(&cpu));
    }

    #[test]
    fn a_walk_that_would_set_an_accessed_bit_does_not() {
        let mut cpu = machine(&[0x48, 0x8b, 0x04, 0x24]); // mov rax, [rsp]
        let (insn, regs, sregs) = at_pc(&mut cpu);
        let run = |cpu: &FlatCpu| judge(&insn, &regs, &sregs, cpu);
        assert!(run(&cpu));
        cpu.put_u64(LEAF, 0x83);
        assert!(!run(&cpu));
    }
}
