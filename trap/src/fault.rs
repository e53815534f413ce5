//! Exceptions foreseen before an instruction runs.
//!
//! Where stepping rides on RFLAGS.TF (VT-x, AMD-V), an exception the CPU
//! delivers itself clears TF: its handler runs unstepped, and KVM gives
//! user space no way to intercept it. So before each step the engine works
//! out whether the instruction about to run will fault, from its decoding,
//! the registers and the guest's page tables, and the VMM delivers that
//! exception through the guest's IDT itself (as it does interrupts); the
//! handler is then stepped from its first instruction. Foreseen: page
//! faults of 64-bit code (data accesses and the fetch), UD2, division by
//! zero or with a quotient too large, and the software interrupts INT n,
//! INT3 and INTO. What is not foreseen still runs on the CPU, and a page
//! fault there is noticed afterwards through CR2 and marked as a gap.

use iced_x86::{
    Code, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register, UsedMemory,
};
use vtrace_vmm::{CpuView, Exception, ExceptionKind};
use vtrace_x86::{Registers, SpecialRegisters};

use vtrace_x86::{PageAccess, Walker};

use vtrace_x86::cr0::WP as CR0_WP;
use vtrace_x86::cr4::SMAP as CR4_SMAP;
use vtrace_x86::cr4::SMEP as CR4_SMEP;
use vtrace_x86::efer::NXE as EFER_NXE;
use vtrace_x86::rflags::AC as RFLAGS_AC;

// Page-fault error code bits.
use vtrace_x86::pf_error::I as PF_FETCH;
use vtrace_x86::pf_error::P as PF_PRESENT;
use vtrace_x86::pf_error::U as PF_USER;
use vtrace_x86::pf_error::W as PF_WRITE;

/// Instructions whose memory operands [`Operands`] keeps, by address.
const OPERAND_SLOTS: usize = 1024;
/// Memory operands kept for one instruction; those with more (gathers)
/// are worked out every time.
const MAX_KEPT: usize = 4;

/// An instruction's memory operands as iced-x86 worked them out.
type KeptOperands = (Instruction, [UsedMemory; MAX_KEPT], u8);

/// The memory operands of instructions, kept from step to step: iced-x86
/// works them out for every instruction the engine foresees, which was
/// the largest part of foresight, so the last ones are kept by address
/// (the same bits at the same address give the same operands).
pub struct Operands {
    factory: InstructionInfoFactory,
    kept: Box<[Option<KeptOperands>]>,
}

impl Default for Operands {
    fn default() -> Self {
        Operands {
            factory: InstructionInfoFactory::new(),
            kept: vec![None; OPERAND_SLOTS].into_boxed_slice(),
        }
    }
}

impl Operands {
    /// The memory `insn` uses.
    pub(crate) fn used_memory(&mut self, insn: &Instruction) -> &[UsedMemory] {
        let slot = (insn.ip() as usize) & (OPERAND_SLOTS - 1);
        let hit = matches!(&self.kept[slot], Some((i, _, _)) if i.eq_all_bits(insn));
        if !hit {
            let used = self.factory.info(insn).used_memory();
            if used.len() > MAX_KEPT {
                return self.factory.info(insn).used_memory();
            }
            let mut kept = [UsedMemory::default(); MAX_KEPT];
            kept[..used.len()].copy_from_slice(used);
            self.kept[slot] = Some((*insn, kept, used.len() as u8));
        }
        match &self.kept[slot] {
            Some((_, kept, n)) => &kept[..usize::from(*n)],
            None => &[],
        }
    }
}

/// The instruction about to run, as the engine fetched it.
#[derive(Clone, Copy, Debug)]
pub struct Next<'a> {
    /// Its address.
    pub pc: u64,
    /// The instruction as the engine decoded it, `None` where the
    /// `fetched` bytes did not make one (fewer than it needs when the
    /// next page is not mapped).
    pub insn: Option<&'a Instruction>,
    /// Bytes the engine could read at `pc`.
    pub fetched: usize,
}

/// The exception the `next` instruction will raise, if it is one this
/// module foresees.
pub fn foresee(
    walker: &mut Walker,
    operands: &mut Operands,
    cpu: &dyn CpuView,
    sregs: &SpecialRegisters,
    regs: &Registers,
    next: Next<'_>,
) -> Option<Exception> {
    let Next { pc, insn, fetched } = next;
    // 64-bit code only: segmentation, 32-bit paging and real mode are
    // not modelled here.
    if sregs.efer & vtrace_x86::efer::LMA == 0 || sregs.cs.l == 0 {
        return None;
    }
    let cpl = sregs.cs.dpl;
    let Some(insn) = insn else {
        // Too few bytes: the fetch ran into a page that is not mapped.
        let end = pc.wrapping_add(fetched as u64);
        return (fetched < 15)
            .then(|| page_fault(walker, cpu, sregs, regs, end, Access::Fetch, cpl))
            .flatten();
    };
    let fault = |vector: u8, error_code: Option<u32>, cr2: Option<u64>| Exception {
        vector,
        error_code,
        cr2,
        return_rip: pc,
        kind: ExceptionKind::Fault,
    };
    let software = |vector: u8| Exception {
        vector,
        error_code: None,
        cr2: None,
        return_rip: pc.wrapping_add(insn.len() as u64),
        kind: ExceptionKind::SoftwareInterrupt,
    };
    match insn.code() {
        Code::Ud2 => return Some(fault(6, None, None)),
        Code::Int3 => return Some(software(3)),
        Code::Int_imm8 => return Some(software(insn.immediate8())),
        _ => {}
    }
    // The fetch of an instruction that straddles into a page it may not
    // execute (the first page was fetched, so is mapped).
    let last = pc.wrapping_add(insn.len() as u64 - 1);
    for at in ends(pc, last) {
        if let Some(e) = page_fault(walker, cpu, sregs, regs, at, Access::Fetch, cpl) {
            return Some(e);
        }
    }
    // A REP string instruction with a zero count touches no memory; with
    // any other, its next iteration does (iced calls that conditional).
    let rep_string =
        (insn.has_rep_prefix() || insn.has_repne_prefix()) && insn.is_string_instruction();
    if rep_string && count_register(insn, regs) == 0 {
        return None;
    }
    for m in operands.used_memory(insn) {
        let access = match m.access() {
            // CMOVcc reads its memory operand whatever the condition.
            OpAccess::Read | OpAccess::CondRead => Access::Read,
            // CMPXCHG writes back even when the comparison fails.
            OpAccess::Write | OpAccess::ReadWrite | OpAccess::ReadCondWrite => Access::Write,
            OpAccess::CondWrite if rep_string => Access::Write,
            // Masked stores may not write at all; LEA, NOP and prefetches
            // do not access memory.
            _ => continue,
        };
        let Some(addr) = m.virtual_address(0, |reg, _, _| register(regs, sregs, reg)) else {
            continue;
        };
        let size = m.memory_size().size().max(1) as u64;
        for at in ends(addr, addr.wrapping_add(size - 1)) {
            if let Some(e) = page_fault(walker, cpu, sregs, regs, at, access, cpl) {
                return Some(e);
            }
        }
    }
    if divides_badly(insn, regs, walker, cpu, sregs) {
        return Some(fault(0, None, None));
    }
    None
}

/// RCX, ECX or CX, by the instruction's address size.
fn count_register(insn: &Instruction, regs: &Registers) -> u64 {
    match insn.memory_base() {
        Register::ESI | Register::EDI => regs.rcx & 0xffff_ffff,
        Register::SI | Register::DI => regs.rcx & 0xffff,
        _ => regs.rcx,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
    Fetch,
}

/// A register's value in a linear address, FS and GS as their bases.
pub(crate) fn register(regs: &Registers, sregs: &SpecialRegisters, reg: Register) -> Option<u64> {
    match reg {
        Register::FS => Some(sregs.fs.base),
        Register::GS => Some(sregs.gs.base),
        r if r.is_segment_register() => Some(0),
        r => regs.value(r),
    }
}

/// The addresses whose pages an access from `first` to `last` touches, as
/// far as a page fault can tell them apart: `last` only where it is on
/// another page (the same page allows the same, and the fault reports the
/// first byte).
fn ends(first: u64, last: u64) -> impl Iterator<Item = u64> {
    let other = (first ^ last) & !0xfff != 0;
    std::iter::once(first).chain(other.then_some(last))
}

/// Whether paging lets an access of kind `access` at privilege `cpl`
/// through a page that allows `page` (None: not mapped), checked as the
/// CPU checks: presence, then write, user, execute, SMEP and SMAP.
fn allowed(
    page: Option<PageAccess>,
    access: Access,
    cpl: u8,
    sregs: &SpecialRegisters,
    regs: &Registers,
) -> bool {
    let Some(p) = page else {
        return false;
    };
    let user = cpl == 3;
    let wp = user || sregs.cr0 & CR0_WP != 0;
    !((access == Access::Write && !p.writable && wp)
        || (user && !p.user)
        || (access == Access::Fetch && !p.executable && sregs.efer & EFER_NXE != 0)
        || (access == Access::Fetch && !user && p.user && sregs.cr4 & CR4_SMEP != 0)
        || (access != Access::Fetch
            && !user
            && p.user
            && sregs.cr4 & CR4_SMAP != 0
            && regs.rflags & RFLAGS_AC == 0))
}

/// The page fault an access to `addr` raises. Checked about once a step,
/// nearly always a cached translation that allows it: that part is
/// inlined, the rest out of line.
#[inline]
fn page_fault(
    walker: &mut Walker,
    cpu: &dyn CpuView,
    sregs: &SpecialRegisters,
    regs: &Registers,
    addr: u64,
    access: Access,
    cpl: u8,
) -> Option<Exception> {
    if allowed(walker.access(cpu, sregs, addr), access, cpl, sregs, regs) {
        return None;
    }
    denied(walker, cpu, sregs, regs, addr, access, cpl)
}

/// [`page_fault`] where the cached translation denies the access: the
/// page tables as they are now decide.
#[cold]
fn denied(
    walker: &mut Walker,
    cpu: &dyn CpuView,
    sregs: &SpecialRegisters,
    regs: &Registers,
    addr: u64,
    access: Access,
    cpl: u8,
) -> Option<Exception> {
    let now = walker.access_now(cpu, sregs, addr);
    if allowed(now, access, cpl, sregs, regs) {
        return None;
    }
    let mut code = 0;
    if access == Access::Write {
        code |= PF_WRITE;
    }
    if cpl == 3 {
        code |= PF_USER;
    }
    if access == Access::Fetch && (sregs.efer & EFER_NXE != 0 || sregs.cr4 & CR4_SMEP != 0) {
        code |= PF_FETCH;
    }
    if now.is_some() {
        code |= PF_PRESENT;
    }
    Some(Exception {
        vector: 14,
        error_code: Some(code),
        cr2: Some(addr),
        return_rip: regs.rip,
        kind: ExceptionKind::Fault,
    })
}

/// DIV and IDIV by zero, or with a quotient that does not fit (#DE).
fn divides_badly(
    insn: &Instruction,
    regs: &Registers,
    walker: &mut Walker,
    cpu: &dyn CpuView,
    sregs: &SpecialRegisters,
) -> bool {
    let signed = match insn.mnemonic() {
        Mnemonic::Div => false,
        Mnemonic::Idiv => true,
        _ => return false,
    };
    let bits = match insn.op0_kind() {
        OpKind::Register => insn.op0_register().size() as u32 * 8,
        _ => insn.memory_size().size() as u32 * 8,
    };
    let divisor = match insn.op0_kind() {
        OpKind::Register => regs.value(insn.op0_register()),
        OpKind::Memory => insn
            .virtual_address(0, 0, |r, _, _| register(regs, sregs, r))
            .and_then(|addr| {
                let mut b = [0u8; 8];
                let n = (bits / 8) as usize;
                (walker.read(cpu, sregs, addr, &mut b[..n]) == n).then(|| u64::from_le_bytes(b))
            }),
        _ => None,
    };
    let Some(divisor) = divisor else {
        return false;
    };
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let divisor = divisor & mask;
    if divisor == 0 {
        return true;
    }
    // The dividend: AX for bytes, DX:AX, EDX:EAX, RDX:RAX otherwise.
    let (high, low) = match bits {
        8 => ((regs.rax >> 8) & 0xff, regs.rax & 0xff),
        _ => (regs.rdx & mask, regs.rax & mask),
    };
    let dividend = (u128::from(high) << bits) | u128::from(low);
    if !signed {
        return dividend / u128::from(divisor) > u128::from(mask);
    }
    let sign_extend = |v: u128, width: u32| -> i128 {
        let shift = 128 - width;
        ((v << shift) as i128) >> shift
    };
    let n = sign_extend(dividend, bits * 2);
    let d = sign_extend(u128::from(divisor), bits);
    let q = n / d;
    let half = 1i128 << (bits - 1);
    q >= half || q < -half
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_machine::{machine, CODE, STACK};

    fn foreseen(
        code: &[u8],
        setup: impl FnOnce(&mut crate::test_machine::FlatCpu),
    ) -> Option<Exception> {
        let mut cpu = machine(code);
        setup(&mut cpu);
        let (regs, sregs) = (cpu.regs, cpu.sregs);
        // Decoded as the engine does, from the bytes given.
        let insn = crate::flow::decode(code, 64, CODE).map(|d| d.insn);
        foresee(
            &mut Walker::default(),
            &mut Operands::default(),
            &cpu,
            &sregs,
            &regs,
            Next {
                pc: CODE,
                insn: insn.as_ref(),
                fetched: code.len(),
            },
        )
    }

    #[test]
    fn a_store_to_an_unmapped_page_is_a_not_present_write_fault() {
        // mov [rbx], al with RBX beyond the 2 MiB the machine maps.
        let e = foreseen(&[0x88, 0x03], |cpu| cpu.regs.rbx = 0x40_0010).unwrap();
        assert_eq!(
            (e.vector, e.error_code, e.cr2),
            (14, Some(PF_WRITE), Some(0x40_0010))
        );
        assert_eq!((e.return_rip, e.kind), (CODE, ExceptionKind::Fault));
    }

    #[test]
    fn a_push_onto_an_unmapped_stack_faults_at_rsp_minus_8() {
        let e = foreseen(&[0x41, 0x55], |cpu| cpu.regs.rsp = 0x40_0000).unwrap();
        assert_eq!((e.vector, e.cr2), (14, Some(0x3f_fff8)));
    }

    #[test]
    fn mapped_accesses_and_address_arithmetic_do_not_fault() {
        assert!(foreseen(&[0x88, 0x03], |cpu| cpu.regs.rbx = STACK - 8).is_none());
        // lea rax, [rbx]: no access.
        assert!(foreseen(&[0x48, 0x8d, 0x03], |cpu| cpu.regs.rbx = 0x40_0000).is_none());
        // rep stosb with RCX = 0 touches nothing.
        assert!(foreseen(&[0xf3, 0xaa], |cpu| cpu.regs.rdi = 0x40_0000).is_none());
    }

    #[test]
    fn rep_stosb_faults_where_the_next_iteration_writes() {
        let e = foreseen(&[0xf3, 0xaa], |cpu| {
            cpu.regs.rdi = 0x40_0000;
            cpu.regs.rcx = 5;
        })
        .unwrap();
        assert_eq!(e.cr2, Some(0x40_0000));
    }

    #[test]
    fn a_write_to_a_read_only_page_is_a_protection_fault_with_cr0_wp() {
        // Make the 2 MiB page read-only.
        let e = foreseen(&[0x88, 0x03], |cpu| {
            cpu.put_u64(0x3000, 0x81);
            cpu.sregs.cr0 |= CR0_WP;
            cpu.regs.rbx = STACK - 8;
        })
        .unwrap();
        assert_eq!(e.error_code, Some(PF_PRESENT | PF_WRITE));
        // Without CR0.WP, CPL 0 writes anyway.
        assert!(foreseen(&[0x88, 0x03], |cpu| {
            cpu.put_u64(0x3000, 0x81);
            cpu.regs.rbx = STACK - 8;
        })
        .is_none());
    }

    #[test]
    fn ud2_div_by_zero_and_software_interrupts() {
        assert_eq!(foreseen(&[0x0f, 0x0b], |_| {}).map(|e| e.vector), Some(6));
        // div ecx with ECX = 0.
        assert_eq!(foreseen(&[0xf7, 0xf1], |_| {}).map(|e| e.vector), Some(0));
        // div ecx: EDX:EAX = 2^32, ECX = 1: the quotient does not fit.
        let e = foreseen(&[0xf7, 0xf1], |cpu| {
            cpu.regs.rdx = 1;
            cpu.regs.rcx = 1;
        });
        assert_eq!(e.map(|e| e.vector), Some(0));
        assert!(foreseen(&[0xf7, 0xf1], |cpu| cpu.regs.rcx = 3).is_none());
        let int = foreseen(&[0xcd, 0x80], |_| {}).unwrap();
        assert_eq!(
            (int.vector, int.return_rip, int.kind),
            (0x80, CODE + 2, ExceptionKind::SoftwareInterrupt)
        );
    }
}
