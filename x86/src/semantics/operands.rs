//! The memory operands of a decoded instruction, with where each access's
//! value comes from: a register before or after the step, a constant, the
//! next pc, or nowhere the registers show. One table ([`memory_operands`]'s
//! rules) for both sides of the trace: the analyzer derives values from it
//! (worked out once per distinct instruction, so that a step only reads
//! registers), and the tracer reads from guest memory, with `run
//! --record-values`, the values of every instruction it does not cover
//! ([`registers_give_values`]).

use iced_x86::{Instruction, Mnemonic, OpAccess, OpKind, Register, UsedMemory};

/// A memory operand of an instruction with what a step's accesses need of
/// it: size, direction and the rule for its value.
#[derive(Clone, Debug)]
pub struct Operand {
    /// The operand as iced-x86 works it out (its address's registers).
    pub memory: UsedMemory,
    /// Bytes (a `rep` string instruction's operand has no size in
    /// iced-x86, the count not being known: a step is one element).
    pub size: u16,
    /// The step reads it.
    pub reads: bool,
    /// The step writes it.
    pub writes: bool,
    /// Where its value comes from.
    pub rule: Rule,
}

/// The memory operands of `instruction` (iced-x86's `memory` list, in its
/// order: the tracer records values in that order and the analyzer matches
/// them by position).
pub fn memory_operands(instruction: &Instruction, memory: &[UsedMemory]) -> Vec<Operand> {
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Nowhere the registers show.
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// A load, its value from the source.
    Load(Source),
    /// A store, its value from the source.
    Store(Source),
    /// A load and a store (XCHG), each from its source.
    Both(Source, Source),
    /// A branch's target: the next step's pc.
    Target,
}

impl Source {
    /// Whether a step's registers give the value: general registers
    /// (a segment register's value is not in a step), constants, RFLAGS.
    pub fn known(self) -> bool {
        match self {
            Source::Unknown => false,
            Source::Before(r) | Source::After(r) => r.is_gpr(),
            Source::Constant(_) | Source::FlagsBefore => true,
        }
    }
}

impl Rule {
    /// The sources of the load and of the store; a branch target's load is
    /// the next step's pc, known.
    fn sources(self) -> (Source, Source) {
        match self {
            Rule::Load(s) => (s, Source::Unknown),
            Rule::Store(s) => (Source::Unknown, s),
            Rule::Both(l, s) => (l, s),
            Rule::Target => (Source::Constant(0), Source::Unknown),
        }
    }
}

/// Whether the registers around a step of `insn` and the next pc give the
/// value of every memory access it makes: false where the tracer must read
/// them from memory to know them (and for an instruction without memory
/// operands, which has none to give).
pub fn registers_give_values(insn: &Instruction, memory: &[UsedMemory]) -> bool {
    !memory.is_empty()
        && memory.iter().all(|m| {
            let (load, store) = rule(insn, m).sources();
            (!reads_memory(m.access()) || load.known())
                && (!writes_memory(m.access()) || store.known())
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, InstructionInfoFactory};

    /// The rules of `bytes`' memory operands, and whether the registers
    /// give every value.
    fn table(bytes: &[u8]) -> (Vec<Rule>, bool) {
        let insn = Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE).decode();
        let mut factory = InstructionInfoFactory::new();
        let used = factory.info(&insn).used_memory().to_vec();
        let rules = memory_operands(&insn, &used)
            .iter()
            .map(|o| o.rule)
            .collect();
        (rules, registers_give_values(&insn, &used))
    }

    use Source::{After, Before, Constant, FlagsBefore};

    #[test]
    fn each_row_of_the_table_gives_its_values() {
        let rows: &[(&[u8], &[Rule], &str)] = &[
            (
                &[0x48, 0x8b, 0x03],
                &[Rule::Load(After(Register::RAX))],
                "mov rax, [rbx]",
            ),
            (
                &[0x89, 0x43, 0x08],
                &[Rule::Store(Before(Register::EAX))],
                "mov [rbx+8], eax",
            ),
            (
                &[0xc7, 0x03, 7, 0, 0, 0],
                &[Rule::Store(Constant(7))],
                "mov dword [rbx], 7",
            ),
            (
                &[0x48, 0x0f, 0xbe, 0x03],
                &[Rule::Load(After(Register::RAX))],
                "movsx rax, [rbx]",
            ),
            (&[0x50], &[Rule::Store(Before(Register::RAX))], "push rax"),
            (&[0x59], &[Rule::Load(After(Register::RCX))], "pop rcx"),
            (
                &[0xe8, 0, 1, 0, 0],
                &[Rule::Store(Constant(0x1005))],
                "call rel32: the return address",
            ),
            (
                &[0xff, 0x13],
                &[Rule::Target, Rule::Store(Constant(0x1002))],
                "call [rbx]",
            ),
            (&[0xc3], &[Rule::Target], "ret"),
            (&[0xff, 0x23], &[Rule::Target], "jmp [rbx]"),
            (&[0xc9], &[Rule::Load(After(Register::RBP))], "leave"),
            (
                &[0xf3, 0x48, 0xab],
                &[Rule::Store(Before(Register::RAX))],
                "rep stosq",
            ),
            (&[0xac], &[Rule::Load(After(Register::RAX))], "lodsb"),
            (&[0x9c], &[Rule::Store(FlagsBefore)], "pushfq"),
            (
                &[0x48, 0x87, 0x03],
                &[Rule::Both(After(Register::RAX), Before(Register::RAX))],
                "xchg [rbx], rax",
            ),
        ];
        for (bytes, rules, what) in rows {
            let (got, given) = table(bytes);
            assert_eq!(&got[..], *rules, "{what}");
            assert!(given, "{what}: the registers give its values");
        }
    }

    #[test]
    fn what_the_registers_do_not_give_the_tracer_reads() {
        for (bytes, what) in [
            (&[0x48, 0x01, 0x03][..], "add [rbx], rax"),
            (&[0x48, 0x39, 0x03], "cmp [rbx], rax"),
            (&[0xf0, 0x48, 0x0f, 0xc1, 0x03], "lock xadd [rbx], rax"),
            (&[0xa4], "movsb"),
            (&[0x5c], "pop rsp: its load is not rsp after it"),
            (
                &[0x8c, 0x03],
                "mov [rbx], es: no segment register is in a step",
            ),
            (&[0x0f, 0xa1], "pop fs"),
            (&[0xff, 0x33], "push [rbx]"),
            (&[0x48, 0xcf], "iretq"),
            (
                &[0x48, 0x01, 0xd8],
                "add rax, rbx: no memory, nothing to give",
            ),
        ] {
            assert!(!table(bytes).1, "{what}");
        }
    }
}
