//! The values a step loaded from memory and stored to it, where the
//! recorded registers make them exact.
//!
//! The trace records each step's registers after it, not the memory it
//! touched. A value is derived only where the instruction's semantics tie
//! it to a register or to its own bytes:
//!
//! | instruction | load | store |
//! |---|---|---|
//! | `mov r, [m]`, `movzx`/`movsx`/`movsxd r, [m]` | `r` after (its low bytes) | |
//! | `mov [m], r` / `mov [m], imm` | | `r` before / the immediate |
//! | `push r` / `push imm` | | `r` before / the immediate |
//! | `pop r` (not `rsp`) | `r` after | |
//! | `call` | the target, for `call [m]` (the next step's pc) | the return address |
//! | `ret`, `jmp [m]` | the next step's pc | |
//! | `leave` | `rbp` after | |
//! | `stos` / `lods` (each step of a `rep`) | `lods`: `rax` after | `stos`: `rax` before |
//! | `pushf` | | `rflags` before |
//! | `xchg [m], r` | `r` after | `r` before |
//!
//! Everything else (read-modify-write arithmetic, compares, `movs` and
//! `cmps`, vector instructions, `iret`) has its
//! addresses but no value: none is guessed. A branch's target is the next
//! step's pc only where nothing came between them (an interrupt's
//! delivery, a break in the trace).
//!
//! A trace made with `vtrace run --record-values` holds those values too:
//! the tracer read them from guest memory (loads before the instruction
//! ran, stores after it) into an `Event::MemoryValues` just before the
//! step, which its callers hand to [`accesses`] (see `fill_recorded`).

use iced_x86::Register;
use vtrace_storage::{MemoryValue, Regs};

use crate::insn::{gpr_index, memory_address, InsnInfo};
use vtrace_x86::{Rule, Source};

/// One memory access of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Linear address (segment bases count as 0).
    pub addr: u64,
    /// Bytes accessed (0 where iced-x86 gives no size).
    pub size: u16,
    /// The value, where the trace makes it exact (accesses of at most 8
    /// bytes only).
    pub value: Option<u64>,
}

/// The low `size` bytes of `v`.
fn low(v: u64, size: u16) -> u64 {
    match size {
        0 => 0,
        1..=7 => v & ((1u64 << (8 * u32::from(size))) - 1),
        _ => v,
    }
}

/// The value of `reg` (any width, `ah`..`bh` too) in `regs`.
fn register(regs: &Regs, reg: Register) -> Option<u64> {
    let v = regs.gpr[gpr_index(reg)?];
    Some(match reg {
        Register::AH | Register::CH | Register::DH | Register::BH => (v >> 8) & 0xff,
        _ => low(v, u16::try_from(reg.size()).ok()?),
    })
}

/// What a step loaded and stored: for each memory operand whose address
/// is known, its read and its write (pushed to `reads`, `writes`), with
/// the value where it is exact. `before` and `after` are the registers
/// around the step; `next_pc` the next step's pc where nothing came
/// between; `recorded` the values `run --record-values` read for the
/// step, matched to the operands by position. Without `next_pc`,
/// returns the index in `reads` of a branch's target read, left without
/// its value for the caller to give once the next step is known.
pub fn accesses(
    info: &InsnInfo,
    around: (&Regs, &Regs),
    next_pc: Option<u64>,
    recorded: &[MemoryValue],
    reads: &mut Vec<Access>,
    writes: &mut Vec<Access>,
) -> Option<usize> {
    let (first_read, first_write) = (reads.len(), writes.len());
    let (before, after) = around;
    let mut awaiting = None;
    for op in &info.operands {
        let Some(addr) = memory_address(&op.memory, before) else {
            continue;
        };
        let size = op.size;
        let fits = (1..=8).contains(&size);
        let value = |s: Source| match s {
            Source::Unknown => None,
            Source::Before(r) => register(before, r),
            Source::After(r) => register(after, r),
            Source::Constant(v) => Some(v),
            Source::FlagsBefore => Some(before.rflags),
        };
        let (load, store) = match op.rule {
            Rule::Load(s) => (value(s), None),
            Rule::Store(s) => (None, value(s)),
            Rule::Both(l, s) => (value(l), value(s)),
            Rule::Target => {
                if next_pc.is_none() && fits {
                    awaiting = Some(reads.len());
                }
                (next_pc, None)
            }
        };
        let within = |v: Option<u64>| v.filter(|_| fits).map(|v| low(v, size));
        if op.reads {
            reads.push(Access {
                addr,
                size,
                value: within(load),
            });
        }
        if op.writes {
            writes.push(Access {
                addr,
                size,
                value: within(store),
            });
        }
    }
    if !recorded.is_empty() {
        fill_recorded(
            info,
            recorded,
            &mut reads[first_read..],
            &mut writes[first_write..],
        );
    }
    awaiting
}

/// Gives one step's accesses (`reads`, `writes`, as [`accesses`] pushed
/// them) the values recorded for it (`Event::MemoryValues`) where the
/// registers left them unknown. The tracer lists the accesses of at most
/// 8 bytes in the order of iced-x86's memory operands, as [`accesses`]
/// walks them, so they are matched by position, loads and stores each on
/// their own; where their number, a size or an address disagrees with the
/// step's (the address may differ only by an FS or GS base, which the
/// trace does not hold), none of that direction is used.
fn fill_recorded(
    info: &InsnInfo,
    recorded: &[MemoryValue],
    reads: &mut [Access],
    writes: &mut [Access],
) {
    let segmented = matches!(
        info.instruction.memory_segment(),
        Register::FS | Register::GS
    );
    for (write, list) in [(false, reads), (true, writes)] {
        let fitting = || list.iter().filter(|a| (1..=8).contains(&a.size));
        let entries = || recorded.iter().filter(|v| v.write == write);
        let agree = fitting().count() == entries().count()
            && fitting()
                .zip(entries())
                .all(|(a, v)| a.size == u16::from(v.size) && (a.addr == v.addr || segmented));
        if !agree {
            continue;
        }
        let fitting = list.iter_mut().filter(|a| (1..=8).contains(&a.size));
        for (a, v) in fitting.zip(entries()) {
            if a.value.is_none() {
                a.value = v.value;
            }
        }
    }
}

/// The low `size` bytes of `pc`: a branch target read of that size, once
/// known.
pub fn target_value(pc: u64, size: u16) -> u64 {
    low(pc, size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::insn::decode;

    const RSP: u64 = 0x8000;

    fn regs(rax: u64, rsp: u64) -> Regs {
        let mut r = Regs::default();
        r.gpr[0] = rax;
        r.gpr[4] = rsp;
        r.gpr[3] = 0x5000; // rbx: the memory operands' base
        r.gpr[5] = 0x9000; // rbp
        r
    }

    /// (reads, writes, awaiting) of `bytes` at 0x1000 between `before`
    /// and `after`.
    fn run(
        bytes: &[u8],
        before: Regs,
        after: Regs,
        next_pc: Option<u64>,
    ) -> (Vec<Access>, Vec<Access>, Option<usize>) {
        let info = decode(bytes, 0x1000, 64);
        let (mut r, mut w) = (Vec::new(), Vec::new());
        let awaiting = accesses(&info, (&before, &after), next_pc, &[], &mut r, &mut w);
        (r, w, awaiting)
    }

    fn access(addr: u64, size: u16, value: Option<u64>) -> Access {
        Access { addr, size, value }
    }

    #[test]
    fn moves_give_the_register_or_immediate_they_move() {
        // mov [rbx+8], eax: the low 4 bytes of rax before.
        let (r, w, _) = run(
            &[0x89, 0x43, 0x08],
            regs(0x1_2345_6789, RSP),
            regs(0, RSP),
            None,
        );
        assert!(r.is_empty());
        assert_eq!(w, [access(0x5008, 4, Some(0x2345_6789))]);
        // mov rax, [rbx]: rax after.
        let (r, w, _) = run(&[0x48, 0x8b, 0x03], regs(0, RSP), regs(0xfeed, RSP), None);
        assert_eq!(r, [access(0x5000, 8, Some(0xfeed))]);
        assert!(w.is_empty());
        // movsx rax, byte [rbx]: the byte loaded is rax's low byte.
        let (r, _, _) = run(
            &[0x48, 0x0f, 0xbe, 0x03],
            regs(0, RSP),
            regs(u64::MAX - 1, RSP),
            None,
        );
        assert_eq!(r, [access(0x5000, 1, Some(0xfe))]);
        // mov qword [rbx], -2 (imm32 sign-extended).
        let (_, w, _) = run(
            &[0x48, 0xc7, 0x03, 0xfe, 0xff, 0xff, 0xff],
            regs(0, RSP),
            regs(0, RSP),
            None,
        );
        assert_eq!(w, [access(0x5000, 8, Some(u64::MAX - 1))]);
        // mov byte [rbx], ah.
        let (_, w, _) = run(&[0x88, 0x23], regs(0xab12, RSP), regs(0, RSP), None);
        assert_eq!(w, [access(0x5000, 1, Some(0xab))]);
    }

    #[test]
    fn the_stack_gets_pushed_registers_and_return_addresses() {
        // push rax
        let (_, w, _) = run(&[0x50], regs(7, RSP), regs(7, RSP - 8), None);
        assert_eq!(w, [access(RSP - 8, 8, Some(7))]);
        // pop rcx: rcx after (rcx is gpr 1).
        let mut after = regs(0, RSP + 8);
        after.gpr[1] = 0x77;
        let (r, _, _) = run(&[0x59], regs(0, RSP), after, None);
        assert_eq!(r, [access(RSP, 8, Some(0x77))]);
        // call rel32 at 0x1000 (5 bytes): the return address 0x1005.
        let (_, w, _) = run(&[0xe8, 0, 1, 0, 0], regs(0, RSP), regs(0, RSP - 8), None);
        assert_eq!(w, [access(RSP - 8, 8, Some(0x1005))]);
        // ret: the target is the next step's pc, once known.
        let (r, _, awaiting) = run(&[0xc3], regs(0, RSP), regs(0, RSP + 8), None);
        assert_eq!(r, [access(RSP, 8, None)]);
        assert_eq!(awaiting, Some(0));
        let (r, _, awaiting) = run(&[0xc3], regs(0, RSP), regs(0, RSP + 8), Some(0x4242));
        assert_eq!(r, [access(RSP, 8, Some(0x4242))]);
        assert_eq!(awaiting, None);
        // call [rbx]: reads the target, writes the return address.
        let (r, w, awaiting) = run(&[0xff, 0x13], regs(0, RSP), regs(0, RSP - 8), None);
        assert_eq!(r, [access(0x5000, 8, None)]);
        assert_eq!(awaiting, Some(0));
        assert_eq!(w, [access(RSP - 8, 8, Some(0x1002))]);
        // leave: reads the saved rbp at the old rbp.
        let mut after = regs(0, 0x9010);
        after.gpr[5] = 0xa000;
        let (r, _, _) = run(&[0xc9], regs(0, RSP), after, None);
        assert_eq!(r, [access(0x9000, 8, Some(0xa000))]);
    }

    fn recorded(addr: u64, size: u8, write: bool, value: u64) -> MemoryValue {
        MemoryValue {
            addr,
            size,
            write,
            value: Some(value),
        }
    }

    #[test]
    fn recorded_values_fill_what_the_registers_do_not_say() {
        // add [rbx], eax: the old value loaded, the sum stored.
        let add = [0x01, 0x03];
        let info = decode(&add, 0x1000, 64);
        let (mut r, mut w, _) = run(&add, regs(1, RSP), regs(1, RSP), None);
        let values = [
            recorded(0x5000, 4, false, 41),
            recorded(0x5000, 4, true, 42),
        ];
        fill_recorded(&info, &values, &mut r, &mut w);
        assert_eq!(r, [access(0x5000, 4, Some(41))]);
        assert_eq!(w, [access(0x5000, 4, Some(42))]);
        // Recorded for another address (another step's): none is used.
        let (mut r, mut w, _) = run(&add, regs(1, RSP), regs(1, RSP), None);
        let other = [
            recorded(0x6000, 4, false, 41),
            recorded(0x6000, 4, true, 42),
        ];
        fill_recorded(&info, &other, &mut r, &mut w);
        assert_eq!((r[0].value, w[0].value), (None, None));
        // A size that disagrees, or one access too many: none either.
        let wrong = [recorded(0x5000, 8, false, 41)];
        fill_recorded(&info, &wrong, &mut r, &mut w);
        let extra = [recorded(0x5000, 4, true, 1), recorded(0x5004, 4, true, 2)];
        fill_recorded(&info, &extra, &mut r, &mut w);
        assert_eq!((r[0].value, w[0].value), (None, None));
        // inc dword gs:[0x20]: the trace has no GS base, the tracer did.
        let inc = [0x65, 0xff, 0x04, 0x25, 0x20, 0, 0, 0];
        let info = decode(&inc, 0x1000, 64);
        let (mut r, mut w, _) = run(&inc, regs(1, RSP), regs(1, RSP), None);
        let base = 0xffff_8880_1000_0000;
        let values = [
            recorded(base + 0x20, 4, false, 7),
            recorded(base + 0x20, 4, true, 8),
        ];
        fill_recorded(&info, &values, &mut r, &mut w);
        assert_eq!((r[0].value, w[0].value), (Some(7), Some(8)));
        // A value already derived stays.
        let mov = [0x48, 0x8b, 0x03];
        let info = decode(&mov, 0x1000, 64);
        let (mut r, mut w, _) = run(&mov, regs(0, RSP), regs(5, RSP), None);
        fill_recorded(&info, &[recorded(0x5000, 8, false, 9)], &mut r, &mut w);
        assert_eq!(r, [access(0x5000, 8, Some(5))]);
    }

    #[test]
    fn what_the_registers_do_not_say_has_no_value() {
        // add [rbx], eax: read and written, neither known.
        let (r, w, _) = run(&[0x01, 0x03], regs(1, RSP), regs(1, RSP), None);
        assert_eq!(r, [access(0x5000, 4, None)]);
        assert_eq!(w, [access(0x5000, 4, None)]);
        // cmp rax, [rbx]
        let (r, _, _) = run(&[0x48, 0x3b, 0x03], regs(1, RSP), regs(1, RSP), None);
        assert_eq!(r, [access(0x5000, 8, None)]);
        // xchg [rbx], rax: the old value is rax after, the new rax before.
        let (r, w, _) = run(&[0x48, 0x87, 0x03], regs(5, RSP), regs(9, RSP), None);
        assert_eq!(r, [access(0x5000, 8, Some(9))]);
        assert_eq!(w, [access(0x5000, 8, Some(5))]);
        // stosb: al before, at rdi (rdi is gpr 7).
        let mut before = regs(0x1234, RSP);
        before.gpr[7] = 0x6000;
        let (_, w, _) = run(&[0xaa], before, regs(0x1234, RSP), None);
        assert_eq!(w, [access(0x6000, 1, Some(0x34))]);
        // rep stosq: one element of rax a step.
        let mut before = regs(0x1122_3344_5566_7788, RSP);
        before.gpr[7] = 0x6000;
        let (_, w, _) = run(&[0xf3, 0x48, 0xab], before, regs(0, RSP), None);
        assert_eq!(w, [access(0x6000, 8, Some(0x1122_3344_5566_7788))]);
        // movsb: read and written, the value not in a register.
        let mut before = regs(0, RSP);
        (before.gpr[6], before.gpr[7]) = (0x6000, 0x7000);
        let (r, w, _) = run(&[0xa4], before, regs(0, RSP), None);
        assert_eq!((r[0].value, w[0].value), (None, None));
        // movdqu xmm0, [rbx]: 16 bytes, more than a value holds.
        let (r, _, _) = run(&[0xf3, 0x0f, 0x6f, 0x03], regs(0, RSP), regs(0, RSP), None);
        assert_eq!(r, [access(0x5000, 16, None)]);
    }
}
