//! What the tracer needs of an instruction, decoded once per distinct
//! instruction: where it may send execution next (its [`Flow`], from
//! `vtrace_x86`), and what the hosts' stepping does around it.

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use vtrace_storage::InsnBytes;
use vtrace_x86::{near_target, Flow};

/// Instructions after which a host may hold the single-step trap back
/// for one instruction: the next one runs in an interrupt shadow (and
/// with it, on AMD-V, without a trap of its own), or after a fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shadow {
    /// STI: sets IF.
    Sti,
    /// MOV SS: changes no general register.
    MovSs,
    /// POP SS: pops this many bytes.
    PopSs(u8),
    /// LFENCE, MFENCE, SFENCE and SWAPGS: change no general register.
    /// This project's paravirtual KVM reports no trap after them
    /// (measured: the exit comes after the next instruction that is not
    /// one of them; in Linux, `asm_load_gs_index`'s `mov gs` and `ret`
    /// were lost after its two SWAPGS), so a run of them and the
    /// instruction after it are one exit.
    NoTrapAfter,
}

/// A decoded instruction as the engine needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// The instruction as iced-x86 decoded it, for whoever needs more than
    /// the fields below (fault foresight, TF carrying): decoded once.
    pub insn: Instruction,
    /// Its length in bytes (1 to 15). A byte, as the two flag sets
    /// below are 32 bits: the engine copies this with every step, and at
    /// 96 bytes the copies were memcpy calls.
    pub len: u8,
    /// Where it may send control.
    pub flow: Flow,
    /// A direct near jump's, branch's or call's target.
    pub target: Option<u64>,
    /// The instruction invalidates cached translations (INVLPG, MOV to CR,
    /// INVPCID, WBINVD is not enough to matter).
    pub flushes_tlb: bool,
    /// Where stepping rides on RFLAGS.TF (VT-x, AMD-V), stepping must be
    /// armed again after it: the CPU may clear TF (SYSCALL, SYSENTER, POPF,
    /// IRET, SYSRET), or KVM intercepts the instruction and, where it
    /// emulates it, writes RFLAGS back without TF (KVM adds TF only at the
    /// RIP where stepping was armed). Measured on an AMD-V KVM: after a
    /// `mov cr4` no debug exit came until the next I/O exit.
    pub rearm: bool,
    /// IRETQ: its target is the RIP it pops, so the engine can check that
    /// the next step is there.
    pub iretq: bool,
    /// The instruction may set RFLAGS.IF (STI, IRET, POPF).
    pub enables_interrupts: bool,
    /// STI, MOV SS, POP SS.
    pub shadow: Option<Shadow>,
    /// SYSCALL: RFLAGS goes to R11.
    pub saves_flags_in_r11: bool,
    /// CPUID: its result may need correcting to the vCPU's table.
    pub cpuid: bool,
    /// The instruction may change the privilege level (system calls and
    /// their returns, IRET, INT n, far transfers).
    pub changes_privilege: bool,
    /// PUSHF: the size of the RFLAGS image it pushes.
    pub pushes_flags: Option<u8>,
    /// RFLAGS bits (x86 positions) the instruction defines.
    pub defines_flags: u32,
    /// RFLAGS bits the instruction leaves undefined: CPUs differ there.
    pub undefines_flags: u32,
}

/// Decoded instructions the cache holds, direct-mapped by address.
const DECODE_SLOTS: usize = 2048;

/// One cached decode: what it was decoded from, and the result.
#[derive(Clone, Copy)]
struct CachedDecode {
    ip: u64,
    bitness: u32,
    /// The instruction's bytes as [`prefix`] has them, for the compare.
    key: u128,
    /// The same bytes as a step records them.
    bytes: InsnBytes,
    decoded: Decoded,
}

/// The instructions the engine decoded lately, by address, so a loop's
/// instructions are decoded once. The engine decodes every step (its
/// flow, what it may fault on), and iced-x86's decoder was a sixth of
/// the tracer's own work; the bytes are still read every step and
/// compared, so code the guest rewrites is decoded anew.
pub struct DecodeCache {
    slots: Box<[Option<CachedDecode>]>,
}

impl Default for DecodeCache {
    fn default() -> Self {
        DecodeCache {
            slots: vec![None; DECODE_SLOTS].into_boxed_slice(),
        }
    }
}

/// The first `len` (at most 15) bytes of `buf` as one number, the rest
/// zero: a compare of two of these is a compare of two instructions'
/// bytes, without a memcmp call.
fn prefix(buf: &[u8; 15], len: usize) -> u128 {
    let mut wide = [0u8; 16];
    wide[..15].copy_from_slice(buf);
    u128::from_le_bytes(wide) & ((1u128 << (8 * len.min(15))) - 1)
}

impl DecodeCache {
    /// [`decode`] of the first `got` bytes of `buf`, with the
    /// instruction's bytes, from the cache where the same bytes were
    /// decoded at the same address and code size before.
    pub fn decode(
        &mut self,
        buf: &[u8; 15],
        got: usize,
        bitness: u32,
        ip: u64,
    ) -> Option<(&Decoded, &InsnBytes)> {
        let slot = &mut self.slots[((ip ^ (ip >> 11)) as usize) & (DECODE_SLOTS - 1)];
        let hit = slot.as_ref().is_some_and(|c| {
            let len = usize::from(c.decoded.len);
            c.ip == ip && c.bitness == bitness && len <= got && prefix(buf, len) == c.key
        });
        if !hit {
            let decoded = decode(buf.get(..got)?, bitness, ip)?;
            *slot = Some(CachedDecode {
                ip,
                bitness,
                key: prefix(buf, usize::from(decoded.len)),
                bytes: InsnBytes::from_prefix(buf, usize::from(decoded.len))?,
                decoded,
            });
        }
        slot.as_ref().map(|c| (&c.decoded, &c.bytes))
    }
}

/// Decodes the instruction at the start of `bytes` (at address `ip`).
pub fn decode(bytes: &[u8], bitness: u32, ip: u64) -> Option<Decoded> {
    let mut decoder = Decoder::with_ip(bitness, bytes, ip, DecoderOptions::NONE);
    let insn: Instruction = decoder.decode();
    if insn.is_invalid() {
        return None;
    }
    let flow = Flow::of(&insn);
    let flushes_tlb = matches!(
        insn.mnemonic(),
        Mnemonic::Invlpg | Mnemonic::Invpcid | Mnemonic::Invlpga
    ) || (insn.mnemonic() == Mnemonic::Mov
        && insn.op0_kind() == OpKind::Register
        && insn.op0_register().is_cr());
    let rearm = rearm_after(&insn);
    let shadow = match insn.mnemonic() {
        Mnemonic::Sti => Some(Shadow::Sti),
        Mnemonic::Mov
            if insn.op0_kind() == OpKind::Register && insn.op0_register() == Register::SS =>
        {
            Some(Shadow::MovSs)
        }
        Mnemonic::Pop
            if insn.op0_kind() == OpKind::Register && insn.op0_register() == Register::SS =>
        {
            Some(Shadow::PopSs(if insn.code() == iced_x86::Code::Popw_SS {
                2
            } else {
                (bitness / 8) as u8
            }))
        }
        Mnemonic::Lfence | Mnemonic::Mfence | Mnemonic::Sfence | Mnemonic::Swapgs => {
            Some(Shadow::NoTrapAfter)
        }
        _ => None,
    };
    Some(Decoded {
        insn,
        len: insn.len() as u8,
        shadow,
        saves_flags_in_r11: insn.mnemonic() == Mnemonic::Syscall,
        changes_privilege: changes_privilege(&insn),
        cpuid: insn.mnemonic() == Mnemonic::Cpuid,
        pushes_flags: match insn.mnemonic() {
            Mnemonic::Pushf => Some(2),
            Mnemonic::Pushfd => Some(4),
            Mnemonic::Pushfq => Some(8),
            _ => None,
        },
        defines_flags: x86_flags(insn.rflags_written() | insn.rflags_cleared() | insn.rflags_set()),
        undefines_flags: x86_flags(insn.rflags_undefined()),
        flow,
        target: near_target(&insn),
        flushes_tlb,
        rearm,
        iretq: insn.mnemonic() == Mnemonic::Iretq,
        enables_interrupts: matches!(
            insn.mnemonic(),
            Mnemonic::Sti
                | Mnemonic::Iret
                | Mnemonic::Iretd
                | Mnemonic::Iretq
                | Mnemonic::Popf
                | Mnemonic::Popfd
                | Mnemonic::Popfq
        ),
    })
}

/// iced-x86's `RflagsBits` at their RFLAGS positions (the status flags,
/// the only ones an instruction can leave undefined, and DF).
fn x86_flags(iced: u32) -> u32 {
    use iced_x86::RflagsBits as B;
    [
        (B::CF, 1u32),
        (B::PF, 1 << 2),
        (B::AF, 1 << 4),
        (B::ZF, 1 << 6),
        (B::SF, 1 << 7),
        (B::DF, 1 << 10),
        (B::OF, 1 << 11),
    ]
    .iter()
    .filter(|(bit, _)| iced & bit != 0)
    .fold(0, |acc, (_, x86)| acc | x86)
}

/// See [`Decoded::rearm`]: instructions that change TF themselves, and
/// those KVM intercepts on VT-x or AMD-V (its default intercepts), which
/// it may emulate.
fn rearm_after(insn: &Instruction) -> bool {
    use Mnemonic::*;
    let system_register = |i: u32| {
        matches!(insn.op_kind(i), OpKind::Register)
            && (insn.op_register(i).is_cr() || insn.op_register(i).is_dr())
    };
    match insn.mnemonic() {
        Mov => system_register(0) || system_register(1),
        Syscall | Sysenter | Sysret | Sysretq | Sysexit | Sysexitq | Popf | Popfd | Popfq
        | Iret | Iretd | Iretq => true,
        Clts | Lmsw | Smsw | Rdmsr | Wrmsr | Cpuid | Hlt | In | Out | Insb | Insw | Insd
        | Outsb | Outsw | Outsd | Invlpg | Invlpga | Invpcid | Invd | Wbinvd | Wbnoinvd
        | Xsetbv | Rdpmc | Rdtsc | Rdtscp | Rdpid | Monitor | Monitorx | Mwait | Mwaitx | Pause
        | Vmcall | Vmmcall | Lgdt | Lidt | Lldt | Ltr | Sgdt | Sidt | Sldt | Str | Rsm => true,
        _ => false,
    }
}

/// See [`Decoded::changes_privilege`].
fn changes_privilege(insn: &Instruction) -> bool {
    use Mnemonic::*;
    insn.is_jmp_far()
        || insn.is_jmp_far_indirect()
        || insn.is_call_far()
        || insn.is_call_far_indirect()
        || matches!(
            insn.mnemonic(),
            Syscall
                | Sysenter
                | Sysret
                | Sysretq
                | Sysexit
                | Sysexitq
                | Iret
                | Iretd
                | Iretq
                | Int
                | Int1
                | Int3
                | Into
                | Retf
                | Rsm
        )
}

impl Decoded {
    /// Whether a CPU's turn goes on past this instruction (a machine of
    /// several CPUs): where some host runs on to the next instruction
    /// without a trap, so that turns end at the same instructions on every
    /// host. A MOV store (an MMIO store, on this project's paravirtual
    /// hosts), PAUSE (QEMU's SVM), the instructions whose shadow holds
    /// the trap (STI, MOV SS, POP SS) and those that may set IF (IRET to
    /// a shadow, POPF; this project's hosts trap after the instruction
    /// after them there).
    pub fn holds_turn(&self) -> bool {
        use iced_x86::{Mnemonic, OpKind};
        let m = self.insn.mnemonic();
        self.shadow.is_some()
            || self.enables_interrupts
            || m == Mnemonic::Pause
            || (m == Mnemonic::Mov && self.insn.op0_kind() == OpKind::Memory)
    }

    /// Whether its bytes say where it goes: false for an indirect or far
    /// transfer, a return or a kernel entry (any next pc is accepted).
    pub fn predictable(&self) -> bool {
        match self.flow {
            Flow::Next | Flow::Halt | Flow::Repeat | Flow::Trap => true,
            Flow::Jump | Flow::Branch | Flow::Call => self.target.is_some(),
            Flow::Return | Flow::InterruptReturn | Flow::SystemCall | Flow::Transaction => false,
        }
    }

    /// Whether execution going from `pc` to `next` is what this instruction
    /// does. An instruction that raises an exception by design explains no
    /// next pc: its handler's is the engine's to identify (through the IDT).
    pub fn explains(&self, pc: u64, next: u64) -> bool {
        let fall = pc.wrapping_add(u64::from(self.len));
        // One match, once a step: what `predictable` calls unpredictable
        // explains any next pc.
        match (self.flow, self.target) {
            (Flow::Next | Flow::Halt, _) => next == fall,
            (Flow::Repeat, _) => next == fall || next == pc,
            (Flow::Jump | Flow::Call, Some(t)) => next == t,
            (Flow::Branch, Some(t)) => next == t || next == fall,
            (Flow::Trap, _) => false,
            (Flow::Jump | Flow::Call | Flow::Branch, None)
            | (Flow::Return | Flow::InterruptReturn | Flow::SystemCall | Flow::Transaction, _) => {
                true
            }
        }
    }

    /// Where execution was expected to go (for a gap record).
    pub fn expected(&self, pc: u64) -> u64 {
        match (self.flow, self.target) {
            (Flow::Jump | Flow::Call, Some(t)) => t,
            _ => pc.wrapping_add(u64::from(self.len)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_control_flow() {
        let predicted = |bytes: &[u8]| {
            let d = decode(bytes, 64, 0x10).unwrap();
            d.predictable().then_some((d.flow, d.target))
        };
        assert_eq!(predicted(&[0x90]), Some((Flow::Next, None)));
        assert_eq!(predicted(&[0xf4]), Some((Flow::Halt, None)));
        assert_eq!(predicted(&[0xeb, 0xfe]), Some((Flow::Jump, Some(0x10))));
        assert_eq!(predicted(&[0x74, 0x02]), Some((Flow::Branch, Some(0x14))));
        assert_eq!(
            predicted(&[0xe8, 0, 0, 0, 0]),
            Some((Flow::Call, Some(0x15)))
        );
        assert_eq!(predicted(&[0xc3]), None, "ret");
        assert_eq!(predicted(&[0xff, 0xe0]), None, "jmp rax");
        assert_eq!(predicted(&[0x0f, 0x05]), None, "syscall");
        assert_eq!(predicted(&[0xf3, 0xa4]), Some((Flow::Repeat, None)));
        assert_eq!(predicted(&[0xf3, 0x90]), Some((Flow::Next, None)), "pause");
        assert!(
            decode(&[0x0f, 0x01, 0x38], 64, 0).unwrap().flushes_tlb,
            "invlpg [rax]"
        );
        assert!(
            decode(&[0x0f, 0x22, 0xd8], 64, 0).unwrap().flushes_tlb,
            "mov cr3, rax"
        );
        let rearm = |bytes: &[u8]| decode(bytes, 64, 0).unwrap().rearm;
        assert!(rearm(&[0x48, 0xcf]), "iretq");
        assert!(rearm(&[0x9d]), "popfq");
        assert!(rearm(&[0x0f, 0x05]), "syscall");
        assert!(rearm(&[0x0f, 0x22, 0xe0]), "mov cr4, rax: KVM emulates it");
        assert!(rearm(&[0x0f, 0x20, 0xe0]), "mov rax, cr4");
        assert!(rearm(&[0x0f, 0x30]), "wrmsr");
        assert!(rearm(&[0xf3, 0x6e]), "rep outsb: KVM emulates string I/O");
        assert!(!rearm(&[0x90]), "nop");
        assert!(!rearm(&[0x48, 0x89, 0xc3]), "mov rbx, rax");
        assert!(!rearm(&[0x48, 0x8b, 0x03]), "mov rax, [rbx]");
        assert_eq!(
            decode(&[0x0f, 0x0b], 64, 0).unwrap().flow,
            Flow::Trap,
            "ud2"
        );
        assert!(decode(&[0x0f, 0xff], 64, 0).is_none() || decode(&[0x0f, 0xff], 64, 0).is_some());
    }

    #[test]
    fn explains_next_pcs() {
        let jz = decode(&[0x74, 0x02], 64, 0x10).unwrap();
        assert!(jz.explains(0x10, 0x12) && jz.explains(0x10, 0x14));
        assert!(!jz.explains(0x10, 0x20));
        let call = decode(&[0xe8, 0, 0, 0, 0], 64, 0x10).unwrap();
        assert!(call.explains(0x10, 0x15) && !call.explains(0x10, 0x15 + 5));
        assert_eq!(call.expected(0x10), 0x15);
        let ret = decode(&[0xc3], 64, 0x10).unwrap();
        assert!(ret.explains(0x10, 0x1234), "a return goes anywhere");
        let ud2 = decode(&[0x0f, 0x0b], 64, 0x10).unwrap();
        assert!(!ud2.explains(0x10, 0x12), "UD2 does not fall through");
        let rep = decode(&[0xf3, 0xaa], 64, 0x10).unwrap();
        assert!(rep.explains(0x10, 0x10) && rep.explains(0x10, 0x12));
        assert_eq!(
            decode(&[0x90], 16, 0x7c00).unwrap().expected(0x7c00),
            0x7c01
        );
    }

    #[test]
    fn the_decode_cache_decodes_anew_what_changed_or_was_cut_short() {
        let mut cache = DecodeCache::default();
        let mut buf = [0u8; 15];
        // mov eax, 1
        buf[..5].copy_from_slice(&[0xb8, 1, 0, 0, 0]);
        let (d, b) = cache.decode(&buf, 15, 64, 0x1000).unwrap();
        assert_eq!((d.len, b.as_slice()), (5, &buf[..5]));
        // The guest rewrote the immediate: a new decode, new bytes.
        buf[1] = 2;
        let (d, b) = cache.decode(&buf, 15, 64, 0x1000).unwrap();
        assert_eq!((d.insn.immediate32(), b.as_slice()), (2, &buf[..5]));
        // Bytes past the instruction do not matter.
        buf[5] = 0x90;
        let (d, _) = cache.decode(&buf, 15, 64, 0x1000).unwrap();
        assert_eq!(d.insn.immediate32(), 2);
        // Only 3 bytes readable: a mov eax, imm32 it cannot be.
        assert!(cache.decode(&buf, 3, 64, 0x1000).is_none());
        // The same bytes in 32-bit code, or elsewhere, are decoded there.
        let (d, _) = cache.decode(&buf, 15, 32, 0x1000).unwrap();
        assert_eq!(d.insn.ip(), 0x1000);
        let (d, _) = cache.decode(&buf, 15, 64, 0x2000).unwrap();
        assert_eq!(d.insn.ip(), 0x2000);
    }
}
