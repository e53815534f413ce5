//! Where a tracepoint's arguments are at one of its sites, read from the
//! code the site jumps to when the tracepoint is enabled.
//!
//! A disabled tracepoint is a 5-byte NOP in its caller (a static key);
//! enabling it makes the NOP a jump to an out-of-line block that checks
//! for probes and calls the tracepoint's static call (`__SCT__tp_func_X`,
//! or `__traceiter_X`) with `__data` and the arguments. vtrace does not
//! enable it (the guest stays unmodified): at the NOP it reads the block
//! from the image and follows the moves that load the argument registers,
//! so each argument is known as a register, a stack slot, an address or a
//! constant of the site's own state. The walk is straight-line: a
//! conditional branch falls through (the block's checks branch away when
//! no probe is attached), a `jmp` is followed, another call clobbers the
//! caller-saved registers, and anything the walk does not understand
//! makes what it wrote unknown.

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess,
    OpKind, Register,
};

use crate::probe_fetch::ArgSource;

/// Instructions a walk looks at, at most.
const MAX_INSTRUCTIONS: usize = 64;

/// Longest x86 instruction.
const MAX_INSTRUCTION: usize = 15;

/// The registers of the arguments after `__data` (rdi), in `Regs::gpr`
/// numbering: rsi, rdx, rcx, r8, r9.
const TRACEPOINT_ARGUMENT_REGISTERS: [usize; 5] = [6, 2, 1, 8, 9];

/// Caller-saved registers: rax, rcx, rdx, rsi, rdi, r8 to r11.
const CLOBBERED_BY_CALL: [usize; 9] = [0, 1, 2, 6, 7, 8, 9, 10, 11];

/// How a walk ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SiteWalk {
    /// It reached the call: each argument after `__data` where the site
    /// has it (`None`: the walk could not tell).
    Arguments(Vec<Option<ArgSource>>),
    /// It met another site of the same tracepoint first: this site only
    /// guards the code that computes the arguments (`trace_X_enabled()`).
    Guard,
    /// It found no call (an indirect jump, a return, bytes it cannot
    /// decode, or too long a block).
    NoCall,
}

/// Walks the block at `target` (bytes from `code(address)`: as many as
/// the image holds from there, at least one instruction's worth) until a
/// call to one of `calls`, reading `count` arguments; `sites` are the
/// tracepoint's sites, sorted, among them `own`, the one walked from.
pub fn walk(
    code: &dyn Fn(u64) -> Option<Vec<u8>>,
    target: u64,
    calls: &[u64],
    sites: &[u64],
    own: u64,
    count: usize,
) -> SiteWalk {
    let mut regs: [Option<ArgSource>; 16] = std::array::from_fn(|r| Some(ArgSource::register(r)));
    let mut info = InstructionInfoFactory::new();
    let mut ip = target;
    for _ in 0..MAX_INSTRUCTIONS {
        if ip != own && sites.binary_search(&ip).is_ok() {
            return SiteWalk::Guard;
        }
        let Some(bytes) = code(ip) else {
            return SiteWalk::NoCall;
        };
        let mut decoder = Decoder::with_ip(64, &bytes, ip, DecoderOptions::NONE);
        let insn = decoder.decode();
        if insn.is_invalid() {
            return SiteWalk::NoCall;
        }
        match insn.flow_control() {
            FlowControl::Next | FlowControl::ConditionalBranch => {
                step(&insn, &mut regs, &mut info);
                ip = insn.next_ip();
            }
            FlowControl::UnconditionalBranch if insn.op0_kind() == OpKind::NearBranch64 => {
                ip = insn.near_branch_target();
            }
            FlowControl::Call if calls.contains(&insn.near_branch_target()) => {
                let arguments = (0..count)
                    .map(|i| TRACEPOINT_ARGUMENT_REGISTERS.get(i).and_then(|&r| regs[r]))
                    .collect();
                return SiteWalk::Arguments(arguments);
            }
            FlowControl::Call | FlowControl::IndirectCall => {
                for r in CLOBBERED_BY_CALL {
                    regs[r] = None;
                }
                ip = insn.next_ip();
            }
            _ => return SiteWalk::NoCall,
        }
    }
    SiteWalk::NoCall
}

/// The bytes an image's code read for a walk: `MAX_INSTRUCTION` from
/// `addr`, fewer at the end of what it holds.
pub fn instruction_window(image: &[u8], offset: usize) -> Option<Vec<u8>> {
    let end = offset.checked_add(MAX_INSTRUCTION)?.min(image.len());
    image.get(offset..end).map(<[u8]>::to_vec)
}

/// A 64-bit general register's `Regs::gpr` index, for any of its widths
/// (`r12d` is 12).
fn gpr(r: Register) -> Option<usize> {
    let full = r.full_register();
    (Register::RAX..=Register::R15)
        .contains(&full)
        .then(|| full as usize - Register::RAX as usize)
}

/// `value` seen through a `size`-byte register write that zero-extends
/// (a 32-bit or 64-bit destination).
fn narrowed(value: Option<ArgSource>, size: u8) -> Option<ArgSource> {
    let mask = |c: u64| match size {
        8 => c,
        _ => c & ((1u64 << (8 * u32::from(size))) - 1),
    };
    match value? {
        ArgSource::Register { register, size: s } => Some(ArgSource::Register {
            register,
            size: s.min(size),
        }),
        ArgSource::Memory {
            base,
            disp,
            size: s,
            signed,
        } => Some(ArgSource::Memory {
            base,
            disp,
            size: s.min(size),
            // A narrower view of a sign-extended value is its low bytes.
            signed: signed && size >= s,
        }),
        ArgSource::Address { .. } if size < 8 => None,
        a @ ArgSource::Address { .. } => Some(a),
        ArgSource::Constant(c) => Some(ArgSource::Constant(mask(c))),
    }
}

/// The memory operand's place as the site sees it: `[base + disp]`
/// where the base still holds the site's own value, or an absolute
/// (RIP-relative or plain) address.
fn memory_place(
    insn: &Instruction,
    regs: &[Option<ArgSource>; 16],
) -> Option<(Option<usize>, u64)> {
    if insn.memory_index() != Register::None || insn.segment_prefix() != Register::None {
        return None;
    }
    let disp = insn.memory_displacement64();
    match insn.memory_base() {
        Register::None | Register::RIP => Some((None, disp)),
        base => {
            let b = gpr(base)?;
            // The base must still be the site's register, whole.
            match regs[b] {
                Some(ArgSource::Register { register, size: 8 }) => Some((Some(register), disp)),
                _ => None,
            }
        }
    }
}

/// What `insn` leaves in the registers it writes.
fn step(insn: &Instruction, regs: &mut [Option<ArgSource>; 16], info: &mut InstructionInfoFactory) {
    let destination = (insn.op_count() > 0 && insn.op0_kind() == OpKind::Register)
        .then(|| insn.op0_register())
        .and_then(|r| Some((gpr(r)?, u8::try_from(r.size()).ok()?)));
    let value = destination.and_then(|(_, size)| value_of(insn, regs, size));
    // Everything written is unknown, unless understood below.
    for used in info.info(insn).used_registers() {
        if matches!(
            used.access(),
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        ) {
            if let Some(r) = gpr(used.register()) {
                regs[r] = None;
            }
        }
    }
    if let (Some((r, _)), Some(v)) = (destination, value) {
        regs[r] = Some(v);
    }
}

/// The value a move-like `insn` gives its `size`-byte destination
/// register; `None` where it is not one of those, or writes only part of
/// the register (8 and 16-bit destinations keep the rest).
fn value_of(insn: &Instruction, regs: &[Option<ArgSource>; 16], size: u8) -> Option<ArgSource> {
    if size < 4 {
        return None;
    }
    let source_register = || gpr(insn.op1_register()).and_then(|r| regs[r]);
    match (insn.mnemonic(), insn.op1_kind()) {
        (Mnemonic::Mov, OpKind::Register) => narrowed(source_register(), size),
        (Mnemonic::Mov, OpKind::Memory) => {
            let (base, disp) = memory_place(insn, regs)?;
            Some(ArgSource::Memory {
                base,
                disp,
                size,
                signed: false,
            })
        }
        (Mnemonic::Mov, OpKind::Immediate32 | OpKind::Immediate64 | OpKind::Immediate32to64) => {
            narrowed(Some(ArgSource::Constant(insn.immediate(1))), size)
        }
        (Mnemonic::Movzx | Mnemonic::Movsx | Mnemonic::Movsxd, OpKind::Memory) => {
            let (base, disp) = memory_place(insn, regs)?;
            let read = u8::try_from(insn.memory_size().size()).ok()?;
            let signed = insn.mnemonic() != Mnemonic::Movzx;
            // Sign-extended to 32 bits, then zero-extended: not a plain load.
            (!signed || size == 8 || read == 4).then_some(ArgSource::Memory {
                base,
                disp,
                size: read,
                signed,
            })
        }
        (Mnemonic::Movzx, OpKind::Register) => {
            let read = u8::try_from(insn.op1_register().size()).ok()?;
            narrowed(source_register(), read)
        }
        (Mnemonic::Xor, OpKind::Register) if insn.op0_register() == insn.op1_register() => {
            Some(ArgSource::Constant(0))
        }
        (Mnemonic::Lea, OpKind::Memory) if size == 8 => match memory_place(insn, regs)? {
            (Some(register), disp) => Some(ArgSource::Address { register, disp }),
            (None, addr) => Some(ArgSource::Constant(addr)),
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block Debian's 6.1 kernel (6.1.0-56-cloud-amd64) jumps to from
    /// `__schedule`'s sched_switch site (0xffffffff81a10cac), as objdump
    /// shows it; the static call is `__SCT__tp_func_sched_switch` at
    /// 0xffffffff81e00478.
    const SCHED_SWITCH_BLOCK: u64 = 0xffff_ffff_81a1_0fa8;
    const SCT: u64 = 0xffff_ffff_81e0_0478;
    const SITE: u64 = 0xffff_ffff_81a1_0cac;
    const BLOCK: &[u8] = &[
        0x65, 0x8b, 0x05, 0xb1, 0x81, 0x60, 0x7e, // mov eax, gs:[rip+...]
        0x89, 0xc0, // mov eax, eax
        0x48, 0x0f, 0xa3, 0x05, 0x67, 0x85, 0x22, 0x01, // bt [rip+...], rax
        0x0f, 0x83, 0xf2, 0xfc, 0xff, 0xff, // jae back
        0x65, 0xff, 0x05, 0x7a, 0xeb, 0x60, 0x7e, // inc dword gs:[rip+...]
        0x48, 0x8b, 0x05, 0xf3, 0x94, 0x1f, 0x01, // mov rax, [rip+...] (funcs)
        0x48, 0x85, 0xc0, // test rax, rax
        0x74, 0x16, // je past the call
        0x48, 0x8b, 0x78, 0x08, // mov rdi, [rax+8]
        0x44, 0x8b, 0x45, 0xb8, // mov r8d, [rbp-0x48]
        0x4c, 0x89, 0xe1, // mov rcx, r12
        0x4c, 0x89, 0xea, // mov rdx, r13
        0x8b, 0x75, 0xbc, // mov esi, [rbp-0x44]
        0xe8, 0x90, 0xf4, 0x3e, 0x00, // call __SCT__tp_func_sched_switch
    ];

    fn code_at(base: u64, bytes: &'static [u8]) -> impl Fn(u64) -> Option<Vec<u8>> {
        move |addr| {
            let offset = usize::try_from(addr.checked_sub(base)?).ok()?;
            instruction_window(bytes, offset).filter(|b| !b.is_empty())
        }
    }

    fn slot(disp: i64) -> Option<ArgSource> {
        Some(ArgSource::Memory {
            base: Some(5),
            disp: disp as u64,
            size: 4,
            signed: false,
        })
    }

    #[test]
    fn sched_switch_arguments_are_found_in_the_site_registers_and_frame() {
        let code = code_at(SCHED_SWITCH_BLOCK, BLOCK);
        let walk = walk(&code, SCHED_SWITCH_BLOCK, &[SCT], &[SITE], SITE, 4);
        // (preempt, prev, next, prev_state)
        assert_eq!(
            walk,
            SiteWalk::Arguments(vec![
                slot(-0x44),
                Some(ArgSource::register(13)),
                Some(ArgSource::register(12)),
                slot(-0x48),
            ])
        );
    }

    #[test]
    fn a_walk_stops_at_a_guard_an_unknown_call_or_a_return() {
        let code = code_at(SCHED_SWITCH_BLOCK, BLOCK);
        // The block reaches another site of the tracepoint first.
        let inner = SCHED_SWITCH_BLOCK + 7;
        assert_eq!(
            walk(&code, SCHED_SWITCH_BLOCK, &[SCT], &[SITE, inner], SITE, 4),
            SiteWalk::Guard
        );
        // No call it knows: the walk runs off the bytes.
        assert_eq!(
            walk(&code, SCHED_SWITCH_BLOCK, &[0x1234], &[], SITE, 4),
            SiteWalk::NoCall
        );
        let ret: &'static [u8] = &[0xc3];
        assert_eq!(
            walk(&code_at(0x1000, ret), 0x1000, &[SCT], &[], 0, 1),
            SiteWalk::NoCall
        );
    }

    #[test]
    fn moves_jumps_and_other_calls_are_followed() {
        // 0x1000: mov esi, 5; lea rdx, [rbp-0x10]; xor ecx, ecx;
        //         movsx r8, byte [rbx+1]; mov r9, rbx; add r9, 1;
        //         jmp 0x1020
        // 0x1020: call 0x3000 (another routine: clobbers rcx);
        //         call 0x2000 (the tracepoint)
        let mut bytes = vec![
            0xbe, 5, 0, 0, 0, // mov esi, 5
            0x48, 0x8d, 0x55, 0xf0, // lea rdx, [rbp-0x10]
            0x31, 0xc9, // xor ecx, ecx
            0x4c, 0x0f, 0xbe, 0x43, 0x01, // movsx r8, byte [rbx+1]
            0x49, 0x89, 0xd9, // mov r9, rbx
            0x49, 0x83, 0xc1, 0x01, // add r9, 1
            0xeb, 0x07, // jmp 0x1020
        ];
        bytes.resize(0x20, 0xcc);
        bytes.extend_from_slice(&[0xe8, 0xdb, 0x1f, 0, 0]); // call 0x3000
        bytes.extend_from_slice(&[0xe8, 0xd6, 0x0f, 0, 0]); // call 0x2000
        let bytes: &'static [u8] = bytes.leak();
        let code = code_at(0x1000, bytes);
        let SiteWalk::Arguments(args) = walk(&code, 0x1000, &[0x2000], &[], 0, 6) else {
            panic!("no call");
        };
        assert_eq!(args[0], None, "rsi: clobbered by the call between");
        assert_eq!(args[1], None, "rdx too");
        assert_eq!(args[2], None, "rcx too");
        assert_eq!(args[3], None, "r8 too");
        assert_eq!(args[4], None, "r9: added to, then clobbered");
        assert_eq!(args[5], None, "a sixth goes on the stack");

        // The same without the call between.
        let mut direct = bytes.to_vec();
        direct[0x20..0x25].fill(0x90);
        let direct: &'static [u8] = direct.leak();
        let SiteWalk::Arguments(args) =
            walk(&code_at(0x1000, direct), 0x1000, &[0x2000], &[], 0, 5)
        else {
            panic!("no call");
        };
        assert_eq!(args[0], Some(ArgSource::Constant(5)));
        assert_eq!(
            args[1],
            Some(ArgSource::Address {
                register: 5,
                disp: (-0x10i64) as u64
            })
        );
        assert_eq!(args[2], Some(ArgSource::Constant(0)));
        assert_eq!(
            args[3],
            Some(ArgSource::Memory {
                base: Some(3),
                disp: 1,
                size: 1,
                signed: true
            })
        );
        assert_eq!(args[4], None, "r9 = rbx + 1 is not a move");
    }
}
