//! REP string instructions, one step per iteration on every host.
//!
//! A CPU that steps with the trap flag traps after every iteration of a
//! `rep` string instruction. KVM's instruction emulator (on a paravirtual
//! host that emulates kernel code) runs up to 1,024 iterations before it exits. From the
//! registers before and after such an exit, and guest memory, this module
//! rebuilds the registers after each iteration, so the trace has the same
//! steps wherever it was taken.

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, Register};
use vtrace_x86::Registers;

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
    /// LODS: RSI advances, the accumulator loads from `[RSI]`.
    Lods,
    /// SCAS: RDI advances, flags compare the accumulator with `[RDI]`.
    Scas,
    /// CMPS: both advance, flags compare `[RSI]` with `[RDI]`.
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
    /// `before` to `after`, one at a time (the last is `after` itself).
    /// Lazy because `n` is the guest's: a REP STOSB to MMIO completes in
    /// one run of millions of iterations, which are never all held.
    pub fn rebuild(
        &self,
        before: &Registers,
        after: &Registers,
        n: u64,
        segments: (u64, u64),
    ) -> Iterations {
        Iterations {
            rep: *self,
            regs: *before,
            after: *after,
            n,
            done: 0,
            segments,
        }
    }

    /// The registers after one more iteration from `regs`; `None` when
    /// memory a comparison or load needs cannot be read.
    fn iterate(
        &self,
        mut regs: Registers,
        segments: (u64, u64),
        memory: &mut dyn ReadLinear,
    ) -> Option<Registers> {
        let down = regs.rflags & RFLAGS_DF != 0;
        let delta = u64::from(self.size);
        let advance = |v: u64| {
            if down {
                v.wrapping_sub(delta)
            } else {
                v.wrapping_add(delta)
            }
        };
        let (src_base, dst_base) = segments;
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
        Some(regs)
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

/// The iterations [`RepString::rebuild`] gives, one per call of
/// [`Iterations::next`]; it reads guest memory as it goes, so the memory
/// is lent to each call rather than held.
#[derive(Clone, Debug)]
pub struct Iterations {
    rep: RepString,
    /// The registers after the last iteration given.
    regs: Registers,
    after: Registers,
    n: u64,
    done: u64,
    segments: (u64, u64),
}

/// Memory an iteration needed could not be read: the iterations from
/// there on cannot be told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unreadable;

impl Iterations {
    /// The registers after the next iteration, `None` after the last.
    pub fn next(&mut self, memory: &mut dyn ReadLinear) -> Option<Result<Registers, Unreadable>> {
        if self.done >= self.n {
            return None;
        }
        self.done += 1;
        if self.done == self.n {
            return Some(Ok(self.after));
        }
        match self.rep.iterate(self.regs, self.segments, memory) {
            Some(regs) => {
                self.regs = regs;
                Some(Ok(regs))
            }
            None => {
                self.done = self.n;
                Some(Err(Unreadable))
            }
        }
    }
}

use vtrace_x86::rflags::DF as RFLAGS_DF;

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
    use vtrace_x86::rflags::{AF, CF, OF, PF, SF, ZF};
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

    /// Every iteration, or `None` where memory was unreadable.
    fn rebuilt(
        rep: &RepString,
        before: &Registers,
        after: &Registers,
        n: u64,
        memory: &mut dyn ReadLinear,
    ) -> Option<Vec<Registers>> {
        let mut each = rep.rebuild(before, after, n, (0, 0));
        let mut out = Vec::new();
        while let Some(r) = each.next(memory) {
            out.push(r.ok()?);
        }
        Some(out)
    }

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
        let steps = rebuilt(&rep, &before, &after, 3, &mut Bytes(vec![])).unwrap();
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
        let steps = rebuilt(&rep, &before, &after, 2, &mut Bytes(vec![])).unwrap();
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
        let steps = rebuilt(&rep, &before, &after, 2, &mut Bytes(mem)).unwrap();
        assert_ne!(steps[0].rflags & (1 << 6), 0, "ZF after 'a' == 'a'");
        assert_eq!((steps[0].rcx, steps[0].rsi, steps[0].rdi), (4, 1, 9));
        assert_eq!(steps[1], after);
    }

    #[test]
    fn iterations_come_one_at_a_time_until_memory_runs_out() {
        // repe cmpsb over "aa" vs "aa" then memory that is not there: one
        // iteration rebuilt, then unreadable, then nothing more.
        let rep = RepString::decode(&[0xf3, 0xa6], 64).unwrap();
        let before = Registers {
            rcx: 1000,
            rsi: 0,
            rdi: 2,
            rflags: 2,
            ..Default::default()
        };
        let after = Registers {
            rcx: 0,
            rsi: 1000,
            rdi: 1002,
            rflags: 0x46,
            ..Default::default()
        };
        let mut memory = Bytes(b"aaa".to_vec());
        let mut each = rep.rebuild(&before, &after, 1000, (0, 0));
        let first = each.next(&mut memory).unwrap().unwrap();
        assert_eq!((first.rcx, first.rsi, first.rdi), (999, 1, 3));
        assert_eq!(each.next(&mut memory), Some(Err(Unreadable)));
        assert_eq!(each.next(&mut memory), None);
        // A million STOSB iterations need no memory and hold none.
        let rep = RepString::decode(&[0xf3, 0xaa], 64).unwrap();
        let before = Registers {
            rcx: 1_000_000,
            rflags: 2,
            ..Default::default()
        };
        let after = Registers {
            rcx: 0,
            rdi: 1_000_000,
            rflags: 2,
            ..Default::default()
        };
        let mut each = rep.rebuild(&before, &after, 1_000_000, (0, 0));
        let mut count = 0u64;
        let mut last = before;
        while let Some(r) = each.next(&mut Bytes(vec![])) {
            last = r.unwrap();
            count += 1;
            assert_eq!(last.rdi, count);
        }
        assert_eq!((count, last), (1_000_000, after));
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
