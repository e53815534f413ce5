//! The memory operands of a decoded instruction, with what the export,
//! the listing and the replay need of each to give a step's accesses:
//! size, direction and where the value comes from (a register before or
//! after the step, a constant, the next pc). Worked out once per distinct
//! instruction (`insn::decode` keeps them in its `InsnInfo`), so a step
//! only reads registers (`memory_values::accesses`).

use iced_x86::{Instruction, Mnemonic, OpAccess, OpKind, Register, UsedMemory};

/// A memory operand of an instruction with what `memory_values::accesses` needs of it,
/// worked out once per distinct instruction (when `insn` decodes it):
/// a step then only reads registers.
#[derive(Clone, Debug)]
pub struct Operand {
    pub memory: UsedMemory,
    /// Bytes (a `rep` string instruction's operand has no size in
    /// iced-x86, the count not being known: a step is one element).
    pub size: u16,
    pub reads: bool,
    pub writes: bool,
    pub rule: Rule,
}

/// The memory operands of `instruction` (iced-x86's `memory` list).
pub(crate) fn operands(instruction: &Instruction, memory: &[UsedMemory]) -> Vec<Operand> {
    memory
        .iter()
        .map(|m| Operand {
            memory: *m,
            size: match u16::try_from(m.memory_size().size()).unwrap_or(0) {
                0 => string_element(instruction.mnemonic()).unwrap_or(0),
                size => size,
            },
            reads: reads_memory(m.access()),
            writes: writes_memory(m.access()),
            rule: rule(instruction, m),
        })
        .collect()
}

/// The element size of a string instruction.
fn string_element(mnemonic: Mnemonic) -> Option<u16> {
    use Mnemonic::*;
    match mnemonic {
        Stosb | Lodsb | Movsb | Cmpsb | Scasb | Insb | Outsb => Some(1),
        Stosw | Lodsw | Movsw | Cmpsw | Scasw | Insw | Outsw => Some(2),
        Stosd | Lodsd | Movsd | Cmpsd | Scasd | Insd | Outsd => Some(4),
        Stosq | Lodsq | Movsq | Cmpsq | Scasq => Some(8),
        _ => None,
    }
}

fn reads_memory(access: OpAccess) -> bool {
    matches!(
        access,
        OpAccess::Read | OpAccess::CondRead | OpAccess::ReadWrite | OpAccess::ReadCondWrite
    )
}

fn writes_memory(access: OpAccess) -> bool {
    matches!(
        access,
        OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
    )
}

/// Where a value comes from at a step.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Source {
    Unknown,
    /// A register before the step.
    Before(Register),
    /// A register after it.
    After(Register),
    /// An immediate, or the return address.
    Constant(u64),
    /// RFLAGS before the step.
    FlagsBefore,
}

/// What the trace says of one memory operand's value.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rule {
    Load(Source),
    Store(Source),
    Both(Source, Source),
    /// A branch's target: the next step's pc.
    Target,
}

/// The rule for memory operand `m` of `i`.
fn rule(i: &Instruction, m: &UsedMemory) -> Rule {
    let op = |n: u32| i.op_kind(n);
    // Operand `n`'s register, where it is one.
    let reg = |n: u32| (op(n) == OpKind::Register).then(|| i.op_register(n));
    let immediate = || {
        (0..i.op_count())
            .find(|&n| {
                matches!(
                    op(n),
                    OpKind::Immediate8
                        | OpKind::Immediate16
                        | OpKind::Immediate32
                        | OpKind::Immediate64
                        | OpKind::Immediate8to16
                        | OpKind::Immediate8to32
                        | OpKind::Immediate8to64
                        | OpKind::Immediate32to64
                )
            })
            .map_or(Source::Unknown, |n| Source::Constant(i.immediate(n)))
    };
    let before = |r: Option<Register>| r.map_or(Source::Unknown, Source::Before);
    let after = |r: Option<Register>| r.map_or(Source::Unknown, Source::After);
    let explicit = (0..i.op_count()).any(|n| op(n) == OpKind::Memory);
    let stack_write = writes_memory(m.access());
    match i.mnemonic() {
        Mnemonic::Mov if op(0) == OpKind::Memory => Rule::Store(match reg(1) {
            Some(r) => Source::Before(r),
            None => immediate(),
        }),
        // A destination of 8 or 16 bits keeps the rest of the register:
        // its low bytes are still the value loaded.
        Mnemonic::Mov | Mnemonic::Movzx | Mnemonic::Movsx | Mnemonic::Movsxd
            if op(1) == OpKind::Memory =>
        {
            Rule::Load(after(reg(0)))
        }
        Mnemonic::Push if !explicit => Rule::Store(match reg(0) {
            Some(r) => Source::Before(r),
            None => immediate(),
        }),
        Mnemonic::Pop if !explicit => {
            Rule::Load(after(reg(0).filter(|r| r.full_register() != Register::RSP)))
        }
        // The stack slot gets the return address; `call [m]` reads its
        // target.
        Mnemonic::Call if stack_write => Rule::Store(Source::Constant(i.next_ip())),
        Mnemonic::Ret => Rule::Target,
        Mnemonic::Call | Mnemonic::Jmp if explicit => Rule::Target,
        Mnemonic::Leave => Rule::Load(Source::After(Register::RBP)),
        // `rep` or not, each step stores or loads one element of rax.
        Mnemonic::Stosb | Mnemonic::Stosw | Mnemonic::Stosd | Mnemonic::Stosq => {
            Rule::Store(Source::Before(Register::RAX))
        }
        Mnemonic::Lodsb | Mnemonic::Lodsw | Mnemonic::Lodsd | Mnemonic::Lodsq => {
            Rule::Load(Source::After(Register::RAX))
        }
        Mnemonic::Pushf | Mnemonic::Pushfd | Mnemonic::Pushfq => Rule::Store(Source::FlagsBefore),
        Mnemonic::Xchg if explicit => {
            let r = reg(0).or_else(|| reg(1));
            Rule::Both(after(r), before(r))
        }
        _ => Rule::Load(Source::Unknown),
    }
}
