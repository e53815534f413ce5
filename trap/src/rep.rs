//! REP string instructions, one step per iteration on every host.
//!
//! A CPU that steps with the trap flag traps after every iteration of a
//! `rep` string instruction. KVM's instruction emulator (this project's
//! paravirtual hosts) runs up to 1,024 iterations before it exits. From the
//! registers before and after such an exit, and guest memory, this module
//! rebuilds the registers after each iteration, so the trace has the same
//! steps wherever it was taken.

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, Register};
use vtrace_vmm::x86::Registers;

/// Reads guest memory at a linear address; false if unreadable.
pub trait ReadLinear {
    /// Fills `buf` from linear address `addr`; false where any of it is
    /// not mapped.
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> bool;
}

/// What one iteration of the instruction does to the registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// MOVS: RSI and RDI advance.
    Movs,
    /// STOS, INS: RDI advances.
    Stos,
    /// OUTS: RSI advances.
    Outs,
    /// LODS: RSI advances, the accumulator loads from [RSI].
    Lods,
    /// SCAS: RDI advances, flags compare the accumulator with [RDI].
    Scas,
    /// CMPS: both advance, flags compare [RSI] with [RDI].
    Cmps,
}

/// A `rep` string instruction as decoded for rebuilding.
#[derive(Clone, Copy, Debug)]
pub struct RepString {
    kind: Kind,
    /// Element size in bytes.
    size: u8,
    /// Address size in bits (which of CX/ECX/RCX, SI/ESI/RSI...).
    address_bits: u32,
    /// Code bitness (64-bit mode zero-extends 32-bit register writes).
    bitness: u32,
}

impl RepString {
    /// Decodes `bytes`; `None` unless it is a `rep` string instruction.
    pub fn decode(bytes: &[u8], bitness: u32) -> Option<RepString> {
        let insn = Decoder::with_ip(bitness, bytes, 0, DecoderOptions::NONE).decode();
        if !(insn.has_rep_prefix() || insn.has_repne_prefix()) {
            return None;
        }
        use Mnemonic::*;
        let (kind, size) = match insn.mnemonic() {
            Movsb => (Kind::Movs, 1),
            Movsw => (Kind::Movs, 2),
            Movsd => (Kind::Movs, 4),
            Movsq => (Kind::Movs, 8),
            Stosb | Insb => (Kind::Stos, 1),
            Stosw | Insw => (Kind::Stos, 2),
            Stosd | Insd => (Kind::Stos, 4),
            Stosq => (Kind::Stos, 8),
            Outsb => (Kind::Outs, 1),
            Outsw => (Kind::Outs, 2),
            Outsd => (Kind::Outs, 4),
            Lodsb => (Kind::Lods, 1),
            Lodsw => (Kind::Lods, 2),
            Lodsd => (Kind::Lods, 4),
            Lodsq => (Kind::Lods, 8),
            Scasb => (Kind::Scas, 1),
            Scasw => (Kind::Scas, 2),
            Scasd => (Kind::Scas, 4),
            Scasq => (Kind::Scas, 8),
            Cmpsb => (Kind::Cmps, 1),
            Cmpsw => (Kind::Cmps, 2),
            Cmpsd => (Kind::Cmps, 4),
            Cmpsq => (Kind::Cmps, 8),
            _ => return None,
        };
        Some(RepString {
            kind,
            size,
            address_bits: address_bits(&insn),
            bitness,
        })
    }

    fn mask(&self) -> u64 {
        match self.address_bits {
            64 => u64::MAX,
            32 => 0xffff_ffff,
            _ => 0xffff,
        }
    }

    /// Iterations run between `before` and `after` (the count register's
    /// decrease).
    pub fn iterations(&self, before: &Registers, after: &Registers) -> u64 {
        before.rcx.wrapping_sub(after.rcx) & self.mask()
    }

    /// The registers after each of the `n` iterations that led from
    /// `before` to `after`, in order (the last is `after` itself).
    /// `None` when memory a comparison or load needs cannot be read.
    pub fn rebuild(
        &self,
        before: &Registers,
        after: &Registers,
        n: u64,
        segments: (u64, u64),
        memory: &mut dyn ReadLinear,
    ) -> Option<Vec<Registers>> {
        let mut out = Vec::with_capacity(usize::try_from(n).ok()?);
        let mut regs = *before;
        let down = before.rflags & RFLAGS_DF != 0;
        let delta = u64::from(self.size);
        let advance = |v: u64| {
            if down {
                v.wrapping_sub(delta)
            } else {
                v.wrapping_add(delta)
            }
        };
        let (src_base, dst_base) = segments;
        for i in 1..=n {
            if i == n {
                out.push(*after);
                break;
            }
            let si = regs.rsi & self.mask();
            let di = regs.rdi & self.mask();
            match self.kind {
                Kind::Lods => {
                    let v = self.load(memory, src_base.wrapping_add(si))?;
                    regs.rax = self.merge(regs.rax, v, u32::from(self.size) * 8);
                }
                Kind::Scas => {
                    let b = self.load(memory, dst_base.wrapping_add(di))?;
                    regs.rflags = compare_flags(regs.rflags, regs.rax, b, self.size);
                }
                Kind::Cmps => {
                    let a = self.load(memory, src_base.wrapping_add(si))?;
                    let b = self.load(memory, dst_base.wrapping_add(di))?;
                    regs.rflags = compare_flags(regs.rflags, a, b, self.size);
                }
                Kind::Movs | Kind::Stos | Kind::Outs => {}
            }
            if matches!(self.kind, Kind::Movs | Kind::Outs | Kind::Lods | Kind::Cmps) {
                regs.rsi = self.merge(regs.rsi, advance(si), self.address_bits);
            }
            if matches!(self.kind, Kind::Movs | Kind::Stos | Kind::Scas | Kind::Cmps) {
                regs.rdi = self.merge(regs.rdi, advance(di), self.address_bits);
            }
            let count = (regs.rcx & self.mask()).wrapping_sub(1);
            regs.rcx = self.merge(regs.rcx, count, self.address_bits);
            out.push(regs);
        }
        Some(out)
    }

    fn load(&self, memory: &mut dyn ReadLinear, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        memory
            .read(addr, &mut b[..usize::from(self.size)])
            .then(|| u64::from_le_bytes(b))
    }

    /// Writes the low `bits` of `value` into `old` as the CPU does: 64-bit
    /// mode zero-extends a 32-bit write, narrower writes keep the rest.
    fn merge(&self, old: u64, value: u64, bits: u32) -> u64 {
        match bits {
            64 => value,
            32 if self.bitness == 64 => value & 0xffff_ffff,
            32 => (old & !0xffff_ffff) | (value & 0xffff_ffff),
            16 => (old & !0xffff) | (value & 0xffff),
            _ => (old & !0xff) | (value & 0xff),
        }
    }
}

use vtrace_vmm::x86::rflags::DF as RFLAGS_DF;

fn address_bits(insn: &Instruction) -> u32 {
    match insn.memory_base() {
        Register::RSI | Register::RDI => 64,
        Register::ESI | Register::EDI => 32,
        Register::SI | Register::DI => 16,
        // INS/OUTS name their string operand as memory too; anything else
        // falls back to the code size's default.
        _ => match insn.code_size() {
            iced_x86::CodeSize::Code64 => 64,
            iced_x86::CodeSize::Code32 => 32,
            _ => 16,
        },
    }
}

/// RFLAGS after `CMP a, b` on `size`-byte operands.
fn compare_flags(rflags: u64, a: u64, b: u64, size: u8) -> u64 {
    use vtrace_vmm::x86::rflags::{AF, CF, OF, PF, SF, ZF};
    let bits = u32::from(size) * 8;
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let sign = 1u64 << (bits - 1);
    let (a, b) = (a & mask, b & mask);
    let r = a.wrapping_sub(b) & mask;
    let mut f = rflags & !(CF | PF | AF | ZF | SF | OF);
    if a < b {
        f |= CF;
    }
    if (r as u8).count_ones().is_multiple_of(2) {
        f |= PF;
    }
    if (a ^ b ^ r) & 0x10 != 0 {
        f |= AF;
    }
    if r == 0 {
        f |= ZF;
    }
    if r & sign != 0 {
        f |= SF;
    }
    if (a ^ b) & (a ^ r) & sign != 0 {
        f |= OF;
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Bytes(Vec<u8>);
    impl ReadLinear for Bytes {
        fn read(&mut self, addr: u64, buf: &mut [u8]) -> bool {
            let Ok(at) = usize::try_from(addr) else {
                return false;
            };
            match self.0.get(at..at + buf.len()) {
                Some(src) => {
                    buf.copy_from_slice(src);
                    true
                }
                None => false,
            }
        }
    }

    #[test]
    fn rep_stosb_iterations_count_down_and_advance() {
        let rep = RepString::decode(&[0xf3, 0xaa], 64).unwrap();
        let before = Registers {
            rcx: 3,
            rdi: 0x1000,
            rflags: 2,
            ..Default::default()
        };
        let after = Registers {
            rcx: 0,
            rdi: 0x1003,
            rflags: 2,
            ..Default::default()
        };
        assert_eq!(rep.iterations(&before, &after), 3);
        let steps = rep
            .rebuild(&before, &after, 3, (0, 0), &mut Bytes(vec![]))
            .unwrap();
        let seen: Vec<(u64, u64)> = steps.iter().map(|r| (r.rcx, r.rdi)).collect();
        assert_eq!(seen, vec![(2, 0x1001), (1, 0x1002), (0, 0x1003)]);
    }

    #[test]
    fn rep_movsq_backwards_moves_both_pointers_down() {
        let rep = RepString::decode(&[0xf3, 0x48, 0xa5], 64).unwrap();
        let before = Registers {
            rcx: 2,
            rsi: 0x2010,
            rdi: 0x3010,
            rflags: 2 | RFLAGS_DF,
            ..Default::default()
        };
        let after = Registers {
            rcx: 0,
            rsi: 0x2000,
            rdi: 0x3000,
            rflags: 2 | RFLAGS_DF,
            ..Default::default()
        };
        let steps = rep
            .rebuild(&before, &after, 2, (0, 0), &mut Bytes(vec![]))
            .unwrap();
        assert_eq!(
            (steps[0].rcx, steps[0].rsi, steps[0].rdi),
            (1, 0x2008, 0x3008)
        );
    }

    #[test]
    fn repe_cmpsb_flags_follow_each_comparison() {
        // "ab" vs "ac": equal, then different; the first iteration's flags
        // say equal (ZF), the last are the exit's.
        let mut mem = vec![0u8; 16];
        mem[0..2].copy_from_slice(b"ab");
        mem[8..10].copy_from_slice(b"ac");
        let rep = RepString::decode(&[0xf3, 0xa6], 64).unwrap();
        let before = Registers {
            rcx: 5,
            rsi: 0,
            rdi: 8,
            rflags: 2,
            ..Default::default()
        };
        let after = Registers {
            rcx: 3,
            rsi: 2,
            rdi: 10,
            rflags: 0x93,
            ..Default::default()
        };
        let steps = rep
            .rebuild(&before, &after, 2, (0, 0), &mut Bytes(mem))
            .unwrap();
        assert_ne!(steps[0].rflags & (1 << 6), 0, "ZF after 'a' == 'a'");
        assert_eq!((steps[0].rcx, steps[0].rsi, steps[0].rdi), (4, 1, 9));
        assert_eq!(steps[1], after);
    }

    #[test]
    fn compare_flags_match_the_cpu() {
        // cmp al=1, 2: borrow, negative, AF.
        assert_eq!(compare_flags(2, 1, 2, 1) & 0x8d5, 0x95);
        // cmp 0x80, 1 (byte): signed overflow.
        assert_eq!(compare_flags(2, 0x80, 1, 1) & 0x8d5, 0x810);
    }

    #[test]
    fn non_rep_and_non_string_instructions_are_not_rebuilt() {
        assert!(
            RepString::decode(&[0xaa], 64).is_none(),
            "stosb without rep"
        );
        assert!(RepString::decode(&[0x90], 64).is_none());
    }
}
