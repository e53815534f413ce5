//! What an instruction is, decoded once per distinct instruction and
//! cached: how it moves control, its class and its memory operands.

use iced_x86::{
    Decoder, DecoderOptions, Instruction, InstructionInfoFactory, Mnemonic, OpKind, Register,
    UsedMemory,
};
use rustc_hash::FxHashMap;
use vtrace_storage::{Regs, Step};
use vtrace_x86::Flow;

/// Coarse instruction classes for the instruction mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// Jumps, conditional or not, and loops.
    Branch,
    /// CALL.
    Call,
    /// RET.
    Return,
    /// INT n, SYSCALL, SYSENTER, their returns.
    SystemCall,
    /// PUSH, POP, ENTER, LEAVE.
    Stack,
    /// MOVS, STOS, CMPS and the like.
    String,
    /// Reads memory (an explicit operand).
    Load,
    /// Writes memory (an explicit operand).
    Store,
    /// Reads and writes the same memory operand.
    ReadModifyWrite,
    /// Touches registers only.
    Register,
    /// x87, MMX, SSE, AVX.
    FloatSimd,
    /// Privileged and system instructions (MOV CR, WRMSR, HLT...).
    System,
    /// Bytes that do not decode.
    Invalid,
}

impl Class {
    /// Every class, in the order tables list them.
    pub const ALL: [Class; 13] = [
        Class::Branch,
        Class::Call,
        Class::Return,
        Class::SystemCall,
        Class::Stack,
        Class::String,
        Class::Load,
        Class::Store,
        Class::ReadModifyWrite,
        Class::Register,
        Class::FloatSimd,
        Class::System,
        Class::Invalid,
    ];

    /// The class as tables print it.
    pub fn name(self) -> &'static str {
        match self {
            Class::Branch => "branch",
            Class::Call => "call",
            Class::Return => "return",
            Class::SystemCall => "system call/interrupt",
            Class::Stack => "stack",
            Class::String => "string",
            Class::Load => "load",
            Class::Store => "store",
            Class::ReadModifyWrite => "read-modify-write",
            Class::Register => "register only",
            Class::FloatSimd => "float/SIMD",
            Class::System => "system (privileged)",
            Class::Invalid => "undecodable",
        }
    }
}

/// How an explicit memory operand forms its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddressingMode {
    /// `[disp]`.
    Absolute,
    /// `[rip+disp]`.
    RipRelative,
    /// `[base]`.
    Base,
    /// `[base+disp]`.
    BaseDisplacement,
    /// `[base+index*scale]`.
    BaseIndex,
    /// `[base+index*scale+disp]`.
    BaseIndexDisplacement,
    /// `[index*scale+disp]`.
    IndexDisplacement,
    /// String instructions: `[rsi]` and `[rdi]`.
    String,
    /// Push, pop, call, ret: the stack, implied.
    ImplicitStack,
}

impl AddressingMode {
    /// The mode as tables print it.
    pub fn name(self) -> &'static str {
        match self {
            AddressingMode::Absolute => "[disp]",
            AddressingMode::RipRelative => "[rip+disp]",
            AddressingMode::Base => "[base]",
            AddressingMode::BaseDisplacement => "[base+disp]",
            AddressingMode::BaseIndex => "[base+index*scale]",
            AddressingMode::BaseIndexDisplacement => "[base+index*scale+disp]",
            AddressingMode::IndexDisplacement => "[index*scale+disp]",
            AddressingMode::String => "string [rsi]/[rdi]",
            AddressingMode::ImplicitStack => "implicit stack",
        }
    }
}

/// Everything the analyses want from one instruction.
#[derive(Clone, Debug)]
pub struct InsnInfo {
    /// The instruction as iced-x86 decoded it.
    pub instruction: Instruction,
    /// Where it sends control.
    pub flow: Flow,
    /// Its class in the instruction mix.
    pub class: Class,
    /// Its mnemonic.
    pub mnemonic: Mnemonic,
    /// How its explicit memory operand is addressed, if it has one.
    pub addressing: Option<AddressingMode>,
    /// The memory it reads and writes (iced-x86's operand list).
    pub memory: Vec<UsedMemory>,
    /// The same operands, with where their values come from.
    pub(crate) operands: Vec<vtrace_x86::Operand>,
}

fn is_system(i: &Instruction) -> bool {
    use Mnemonic::*;
    matches!(
        i.mnemonic(),
        Cli | Sti
            | Hlt
            | Lgdt
            | Lidt
            | Lldt
            | Ltr
            | Lmsw
            | Clts
            | Invlpg
            | Invpcid
            | Wrmsr
            | Rdmsr
            | In
            | Out
            | Insb
            | Insw
            | Insd
            | Outsb
            | Outsw
            | Outsd
            | Swapgs
            | Wbinvd
            | Invd
            | Cpuid
            | Xsetbv
            | Rdpmc
            | Sgdt
            | Sidt
            | Str
            | Sldt
            | Smsw
    ) || (0..i.op_count()).any(|n| {
        i.op_kind(n) == OpKind::Register && (i.op_register(n).is_cr() || i.op_register(n).is_dr())
    })
}

fn addressing_of(i: &Instruction) -> Option<AddressingMode> {
    let explicit = (0..i.op_count()).map(|n| i.op_kind(n)).find(|k| {
        matches!(
            k,
            OpKind::Memory
                | OpKind::MemorySegSI
                | OpKind::MemorySegESI
                | OpKind::MemorySegRSI
                | OpKind::MemoryESDI
                | OpKind::MemoryESEDI
                | OpKind::MemoryESRDI
                | OpKind::MemorySegDI
                | OpKind::MemorySegEDI
                | OpKind::MemorySegRDI
        )
    });
    match explicit {
        Some(OpKind::Memory) => {
            let base = i.memory_base();
            let index = i.memory_index();
            let disp = i.memory_displacement64() != 0;
            Some(if i.is_ip_rel_memory_operand() {
                AddressingMode::RipRelative
            } else {
                match (base != Register::None, index != Register::None, disp) {
                    (false, false, _) => AddressingMode::Absolute,
                    (true, false, false) => AddressingMode::Base,
                    (true, false, true) => AddressingMode::BaseDisplacement,
                    (true, true, false) => AddressingMode::BaseIndex,
                    (true, true, true) => AddressingMode::BaseIndexDisplacement,
                    (false, true, _) => AddressingMode::IndexDisplacement,
                }
            })
        }
        Some(_) => Some(AddressingMode::String),
        None if i.is_stack_instruction() => Some(AddressingMode::ImplicitStack),
        None => None,
    }
}

fn uses_float_simd(i: &Instruction) -> bool {
    (0..i.op_count()).any(|n| {
        i.op_kind(n) == OpKind::Register && {
            let r = i.op_register(n);
            r.is_xmm() || r.is_ymm() || r.is_zmm() || r.is_st() || r.is_mm()
        }
    })
}

fn class_of(i: &Instruction, flow: Flow, memory: &[UsedMemory]) -> Class {
    if i.is_invalid() {
        return Class::Invalid;
    }
    match flow {
        Flow::Jump | Flow::Branch => return Class::Branch,
        Flow::Call => return Class::Call,
        Flow::Return | Flow::InterruptReturn => return Class::Return,
        Flow::SystemCall => return Class::SystemCall,
        Flow::Next | Flow::Repeat | Flow::Halt | Flow::Trap | Flow::Transaction => {}
    }
    if is_system(i) {
        return Class::System;
    }
    if i.is_string_instruction() {
        return Class::String;
    }
    if i.is_stack_instruction() {
        return Class::Stack;
    }
    if uses_float_simd(i) {
        return Class::FloatSimd;
    }
    let reads = memory.iter().any(|m| {
        matches!(
            m.access(),
            iced_x86::OpAccess::Read
                | iced_x86::OpAccess::CondRead
                | iced_x86::OpAccess::ReadWrite
                | iced_x86::OpAccess::ReadCondWrite
        )
    });
    let writes = memory.iter().any(|m| {
        matches!(
            m.access(),
            iced_x86::OpAccess::Write
                | iced_x86::OpAccess::CondWrite
                | iced_x86::OpAccess::ReadWrite
                | iced_x86::OpAccess::ReadCondWrite
        )
    });
    match (reads, writes) {
        (true, true) => Class::ReadModifyWrite,
        (true, false) => Class::Load,
        (false, true) => Class::Store,
        (false, false) => Class::Register,
    }
}

/// Intel syntax with numbers as vtrace writes them everywhere (0x1005e0),
/// not MASM's 00000000001005E0h.
pub fn intel_formatter() -> iced_x86::IntelFormatter {
    let mut intel = iced_x86::IntelFormatter::new();
    let o = iced_x86::Formatter::options_mut(&mut intel);
    o.set_hex_prefix("0x");
    o.set_hex_suffix("");
    o.set_uppercase_hex(false);
    o.set_leading_zeros(false);
    o.set_branch_leading_zeros(false);
    intel
}

/// Decodes `bytes` at `pc` in a CPU of `bitness` (16, 32 or 64).
pub fn decode(bytes: &[u8], pc: u64, bitness: u32) -> InsnInfo {
    let mut decoder = Decoder::with_ip(bitness, bytes, pc, DecoderOptions::NONE);
    let instruction = decoder.decode();
    let mut factory = InstructionInfoFactory::new();
    let memory: Vec<UsedMemory> = if instruction.is_invalid() {
        Vec::new()
    } else {
        factory.info(&instruction).used_memory().to_vec()
    };
    let flow = Flow::of(&instruction);
    InsnInfo {
        flow,
        class: class_of(&instruction, flow, &memory),
        mnemonic: instruction.mnemonic(),
        addressing: addressing_of(&instruction),
        operands: vtrace_x86::memory_operands(&instruction, &memory),
        memory,
        instruction,
    }
}

/// Index of a full 64-bit general register in [`Regs::gpr`].
pub(crate) fn gpr_index(r: Register) -> Option<usize> {
    let full = r.full_register();
    let n = full as usize;
    let rax = Register::RAX as usize;
    (rax..rax + 16).contains(&n).then(|| n - rax)
}

/// Linear addresses the instruction touched, computed from the registers
/// before it (`before`), one per memory operand whose address is known.
/// Segment bases count as 0: the trace does not record FS/GS bases, so
/// FS/GS-relative references are approximate.
pub fn memory_addresses<'a>(
    info: &'a InsnInfo,
    before: &'a Regs,
) -> impl Iterator<Item = u64> + 'a {
    info.memory
        .iter()
        .filter_map(move |m| memory_address(m, before))
}

/// The linear address of one memory operand (see [`memory_addresses`]).
pub fn memory_address(m: &UsedMemory, before: &Regs) -> Option<u64> {
    m.try_virtual_address(0, |reg, _, _| {
        if reg.is_segment_register() || reg == Register::RIP || reg == Register::EIP {
            return Some(0);
        }
        let v = before.gpr[gpr_index(reg)?];
        Some(match reg.size() {
            1 if reg.is_gpr8() && (Register::AH..=Register::BH).contains(&reg) => (v >> 8) & 0xff,
            1 => v & 0xff,
            2 => v & 0xffff,
            4 => v & 0xffff_ffff,
            _ => v,
        })
    })
}

/// Decoded instructions by address, checked against the bytes so code
/// that changes (self-modifying code, a reused address in another address
/// space) is decoded again.
pub struct InsnCache {
    /// Each instruction decoded: its pc, bytes and bitness, and what it
    /// is. A pc whose bytes change gets a new entry.
    entries: Vec<(u64, vtrace_storage::InsnBytes, u32, InsnInfo)>,
    /// Each pc's latest entry.
    by_pc: FxHashMap<u64, u32>,
    /// The entry of a pc seen lately, a slot per pc (`u32::MAX`: none):
    /// most steps find theirs here without hashing (a hash lookup a step
    /// was a third of the cache's time).
    recent: Vec<u32>,
}

/// Slots in [`InsnCache`]'s recent entries.
const RECENT_INSNS: usize = 1024;

impl Default for InsnCache {
    fn default() -> Self {
        InsnCache {
            entries: Vec::new(),
            by_pc: FxHashMap::default(),
            recent: vec![u32::MAX; RECENT_INSNS],
        }
    }
}

impl std::fmt::Debug for InsnCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InsnCache").finish_non_exhaustive()
    }
}

impl InsnCache {
    /// The decoded instruction of `step`, decoded once per pc and bytes.
    pub fn get(&mut self, step: &Step) -> &InsnInfo {
        let slot = (step.pc ^ step.pc >> 12) as usize % RECENT_INSNS;
        let recent = self.recent.get(slot).map_or(usize::MAX, |i| *i as usize);
        let index = match self.entries.get(recent) {
            Some(e) if (e.0, e.1, e.2) == (step.pc, step.bytes, step.mode.bitness()) => recent,
            _ => self.look_up(step, slot),
        };
        // An entry's, found or pushed.
        &self.entries[index].3
    }

    /// The entry of `step` where its slot of the recent entries holds
    /// another, decoded if it is new; remembered in the slot. Apart from
    /// [`InsnCache::get`]: inlined, the decoder's stack frame was made
    /// for every step.
    #[cold]
    #[inline(never)]
    fn look_up(&mut self, step: &Step, slot: usize) -> usize {
        let (pc, bitness) = (step.pc, step.mode.bitness());
        let known = self.by_pc.get(&pc).map(|i| *i as usize);
        let index = match known {
            Some(i)
                if self
                    .entries
                    .get(i)
                    .is_some_and(|e| (e.0, e.1, e.2) == (pc, step.bytes, bitness)) =>
            {
                i
            }
            _ => {
                let info = decode(step.bytes.as_slice(), pc, bitness);
                self.entries.push((pc, step.bytes, bitness, info));
                // Fewer entries than a segment's steps.
                let i = self.entries.len() - 1;
                self.by_pc.insert(pc, i as u32);
                i
            }
        };
        if let Some(r) = self.recent.get_mut(slot) {
            *r = index as u32;
        }
        index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_decodes_a_pc_again_when_its_bytes_or_mode_change() {
        use vtrace_storage::{CpuMode, InsnBytes};
        let step = |pc: u64, bytes: &[u8], mode| Step {
            pc,
            bytes: InsnBytes::new(bytes).unwrap(),
            cr3: 0,
            mode,
            cpl: 0,
            regs: Regs::default(),
        };
        let mut cache = InsnCache::default();
        let mnemonic = |cache: &mut InsnCache, s: &Step| cache.get(s).mnemonic;
        // 0x1000 and 0x1400 share a slot of the recent entries; the code
        // at 0x1000 changes and changes back; 0x48 0x90 is `dec eax; nop`
        // in 32-bit code, `xchg rax, rax`'s `nop` in 64-bit code.
        let (nop, push) = (step(0x1000, &[0x90], CpuMode::Long64), [0x50]);
        assert_eq!(RECENT_INSNS, 1024, "the slot these pcs share");
        for (s, want) in [
            (nop, Mnemonic::Nop),
            (step(0x1400, &push, CpuMode::Long64), Mnemonic::Push),
            (nop, Mnemonic::Nop),
            (step(0x1000, &push, CpuMode::Long64), Mnemonic::Push),
            (nop, Mnemonic::Nop),
            (step(0x2000, &[0x48, 0x90], CpuMode::Long64), Mnemonic::Nop),
            (
                step(0x2000, &[0x48, 0x90], CpuMode::Protected32),
                Mnemonic::Dec,
            ),
            (step(0x2000, &[0x48, 0x90], CpuMode::Long64), Mnemonic::Nop),
        ] {
            assert_eq!(mnemonic(&mut cache, &s), want, "{s:x?}");
        }
    }

    #[test]
    fn flows_and_classes() {
        let d = |b: &[u8]| decode(b, 0x1000, 64);
        assert_eq!(d(&[0xe8, 0, 0, 0, 0]).flow, Flow::Call);
        assert_eq!(d(&[0xc3]).flow, Flow::Return);
        assert_eq!(d(&[0x48, 0xcf]).flow, Flow::InterruptReturn);
        assert_eq!(d(&[0xeb, 0xfe]).flow, Flow::Jump);
        assert_eq!(d(&[0x74, 0x02]).flow, Flow::Branch);
        assert_eq!(d(&[0x74, 0x02]).class, Class::Branch);
        assert_eq!(d(&[0xf4]).class, Class::System, "hlt");
        assert_eq!(d(&[0x0f, 0x05]).flow, Flow::SystemCall);
        assert_eq!(d(&[0x90]).flow, Flow::Next);
        assert_eq!(d(&[0xfa]).class, Class::System); // cli
        assert_eq!(d(&[0x0f, 0x22, 0xd8]).class, Class::System); // mov cr3, rax
        assert_eq!(d(&[0x48, 0x8b, 0x07]).class, Class::Load); // mov rax, [rdi]
        assert_eq!(d(&[0x48, 0x89, 0x07]).class, Class::Store);
        assert_eq!(d(&[0x48, 0x01, 0x07]).class, Class::ReadModifyWrite);
        assert_eq!(d(&[0x50]).class, Class::Stack);
        assert_eq!(d(&[0xf3, 0xa4]).class, Class::String);
        assert_eq!(d(&[0x48, 0x01, 0xd8]).class, Class::Register);
        assert_eq!(d(&[0x0f, 0x0b]).class, Class::Register); // ud2 is not invalid
        assert_eq!(d(&[0x0f, 0xff]).class, Class::Invalid);
    }

    #[test]
    fn addressing_modes_and_addresses() {
        let mut regs = Regs::default();
        regs.gpr[7] = 0x5000; // rdi
        regs.gpr[1] = 3; // rcx
        regs.gpr[4] = 0x8000; // rsp
                              // mov rax, [rdi+rcx*8+0x10]
        let i = decode(&[0x48, 0x8b, 0x44, 0xcf, 0x10], 0x1000, 64);
        assert_eq!(i.addressing, Some(AddressingMode::BaseIndexDisplacement));
        assert_eq!(memory_addresses(&i, &regs).collect::<Vec<_>>(), [0x5028]);
        // mov rax, [rip+0x10] at 0x1000, 7 bytes: 0x1017
        let i = decode(&[0x48, 0x8b, 0x05, 0x10, 0, 0, 0], 0x1000, 64);
        assert_eq!(i.addressing, Some(AddressingMode::RipRelative));
        assert_eq!(memory_addresses(&i, &regs).collect::<Vec<_>>(), [0x1017]);
        // push rax writes below rsp
        let i = decode(&[0x50], 0x1000, 64);
        assert_eq!(i.addressing, Some(AddressingMode::ImplicitStack));
        assert_eq!(memory_addresses(&i, &regs).collect::<Vec<_>>(), [0x7ff8]);
    }
}
