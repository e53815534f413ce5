//! gdb's watchpoints on a running guest that vtrace steps: before each
//! instruction runs, its memory operands are decoded and addressed with
//! the registers it starts from; after it ran, an operand that overlaps a
//! watched range stops the guest there, as a data breakpoint would (just
//! after the access). Exact on every host, since it needs nothing of the
//! debug registers: only the steps the run takes anyway.

use gdbstub::target::ext::breakpoints::WatchKind;
use iced_x86::{Decoder, DecoderOptions, InstructionInfoFactory, Mnemonic, OpAccess, Register};
use vtrace_vmm::CpuView;
use vtrace_x86::Walker;
use vtrace_x86::{Registers, Segment, SpecialRegisters};

/// One of gdb's watchpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveWatch {
    /// The first byte watched (a linear address).
    pub addr: u64,
    /// How many bytes.
    pub len: u64,
    /// Which accesses stop the guest.
    pub kind: WatchKind,
}

impl LiveWatch {
    /// Whether `access` touches this watch's bytes the way it watches.
    fn hit_by(&self, access: &Access) -> bool {
        let wanted = match self.kind {
            WatchKind::Write => access.write,
            WatchKind::Read => access.read,
            WatchKind::ReadWrite => access.read || access.write,
        };
        let end = self.addr.saturating_add(self.len);
        let access_end = access.addr.saturating_add(access.len);
        wanted && access.addr < end && self.addr < access_end
    }
}

/// A memory operand of an instruction about to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Its linear address.
    pub addr: u64,
    /// Its size in bytes.
    pub len: u64,
    /// The instruction may read it.
    pub read: bool,
    /// The instruction may write it.
    pub write: bool,
}

/// What an instruction about to run will do that a watcher needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Next {
    /// Its memory operands.
    pub accesses: Vec<Access>,
    /// It drops cached translations (INVLPG, INVPCID, a write to a control
    /// register).
    pub flushes_tlb: bool,
}

/// What the instruction in `code` at `rip` will do, for a CPU of `bitness`
/// with `regs` and `sregs`. An operand whose address cannot be computed (a
/// gather's vector index) is left out.
pub fn foresee(
    code: &[u8],
    bitness: u32,
    regs: &Registers,
    sregs: &SpecialRegisters,
    factory: &mut InstructionInfoFactory,
) -> Next {
    let mut decoder = Decoder::with_ip(bitness, code, regs.rip, DecoderOptions::NONE);
    let insn = decoder.decode();
    if insn.is_invalid() {
        return Next::default();
    }
    let flushes_tlb = matches!(
        insn.mnemonic(),
        Mnemonic::Invlpg | Mnemonic::Invlpga | Mnemonic::Invpcid
    ) || (insn.mnemonic() == Mnemonic::Mov && insn.op0_register().is_cr());
    let flat = bitness == 64;
    let value = |reg: Register, _: usize, _: usize| -> Option<u64> {
        let base_of = |s: &Segment| Some(s.base);
        match reg {
            Register::FS => base_of(&sregs.fs),
            Register::GS => base_of(&sregs.gs),
            // 64-bit mode ignores the other segments' bases.
            Register::ES | Register::CS | Register::SS | Register::DS if flat => Some(0),
            Register::ES => base_of(&sregs.es),
            Register::CS => base_of(&sregs.cs),
            Register::SS => base_of(&sregs.ss),
            Register::DS => base_of(&sregs.ds),
            // iced folds a RIP-relative displacement into an absolute one.
            Register::RIP | Register::EIP => Some(0),
            r => gpr_value(regs, r),
        }
    };
    let accesses = factory
        .info(&insn)
        .used_memory()
        .iter()
        .filter_map(|m| {
            let addr = m.try_virtual_address(0, value)?;
            let (read, write) = match m.access() {
                OpAccess::Read | OpAccess::CondRead => (true, false),
                OpAccess::Write | OpAccess::CondWrite => (false, true),
                OpAccess::ReadWrite | OpAccess::ReadCondWrite => (true, true),
                _ => return None,
            };
            let len = u64::try_from(m.memory_size().size()).ok()?.max(1);
            Some(Access {
                addr: if flat { addr } else { addr & 0xffff_ffff },
                len,
                read,
                write,
            })
        })
        .collect();
    Next {
        accesses,
        flushes_tlb,
    }
}

/// The value of a general register (any width) in `regs`.
fn gpr_value(regs: &Registers, reg: Register) -> Option<u64> {
    let full = reg.full_register();
    let all = [
        regs.rax, regs.rcx, regs.rdx, regs.rbx, regs.rsp, regs.rbp, regs.rsi, regs.rdi, regs.r8,
        regs.r9, regs.r10, regs.r11, regs.r12, regs.r13, regs.r14, regs.r15,
    ];
    let n = (full as usize).checked_sub(Register::RAX as usize)?;
    let v = *all.get(n)?;
    Some(match reg.size() {
        1 if (Register::AH..=Register::BH).contains(&reg) => (v >> 8) & 0xff,
        1 => v & 0xff,
        2 => v & 0xffff,
        4 => v & 0xffff_ffff,
        _ => v,
    })
}

/// The first of `watches` that one of `accesses` hits: its address and
/// kind, as gdb's stop reply names it.
pub fn first_hit(watches: &[LiveWatch], accesses: &[Access]) -> Option<(u64, WatchKind)> {
    watches
        .iter()
        .find(|w| accesses.iter().any(|a| w.hit_by(a)))
        .map(|w| (w.addr, w.kind))
}

/// gdb's watchpoints and what the next instruction will touch.
pub struct Watcher {
    watches: Vec<LiveWatch>,
    next: Next,
    factory: InstructionInfoFactory,
    /// Its own: flushed where the guest flushes its TLB, which it sees.
    walker: Walker,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("watches", &self.watches)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl Default for Watcher {
    fn default() -> Self {
        Watcher {
            watches: Vec::new(),
            next: Next::default(),
            factory: InstructionInfoFactory::new(),
            walker: Walker::default(),
        }
    }
}

impl Watcher {
    /// The watchpoints from now on.
    pub fn set(&mut self, watches: Vec<LiveWatch>) {
        self.watches = watches;
        self.next = Next::default();
        self.walker.flush();
    }

    /// Whether gdb watches anything.
    pub fn is_empty(&self) -> bool {
        self.watches.is_empty()
    }

    /// Right before an entry: notes the memory the instruction at RIP
    /// will touch (nothing where its bytes cannot be read).
    pub fn before(&mut self, cpu: &mut dyn CpuView) {
        self.next = Next::default();
        if self.watches.is_empty() {
            return;
        }
        let regs = cpu.regs();
        let sregs = cpu.sregs();
        let mut code = [0u8; 15];
        let read = self.walker.read(cpu, &sregs, regs.rip, &mut code);
        let bitness = match (sregs.cs.l, sregs.cs.db) {
            (1, _) => 64,
            (_, 1) => 32,
            _ => 16,
        };
        self.next = foresee(&code[..read], bitness, &regs, &sregs, &mut self.factory);
    }

    /// After a step: the watch the instruction hit, if any.
    pub fn after_step(&mut self) -> Option<(u64, WatchKind)> {
        let next = std::mem::take(&mut self.next);
        if next.flushes_tlb {
            self.walker.flush();
        }
        first_hit(&self.watches, &next.accesses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs() -> Registers {
        Registers {
            rip: 0x1000,
            rax: 0x8000,
            rsp: 0x9000,
            ..Default::default()
        }
    }

    fn long_mode() -> SpecialRegisters {
        let mut s = SpecialRegisters::default();
        s.cs.l = 1;
        s.fs.base = 0x5_0000;
        s
    }

    fn of(code: &[u8], regs: &Registers) -> Vec<Access> {
        let mut f = InstructionInfoFactory::new();
        foresee(code, 64, regs, &long_mode(), &mut f).accesses
    }

    fn watch(addr: u64, len: u64, kind: WatchKind) -> LiveWatch {
        LiveWatch { addr, len, kind }
    }

    #[test]
    fn a_store_hits_a_write_watch_on_any_byte_it_covers() {
        // mov [rax+8], rbx
        let a = of(&[0x48, 0x89, 0x58, 0x08], &regs());
        assert_eq!(
            a,
            [Access {
                addr: 0x8008,
                len: 8,
                read: false,
                write: true
            }]
        );
        assert_eq!(
            first_hit(&[watch(0x800f, 1, WatchKind::Write)], &a),
            Some((0x800f, WatchKind::Write))
        );
        assert_eq!(first_hit(&[watch(0x8010, 4, WatchKind::Write)], &a), None);
        assert_eq!(first_hit(&[watch(0x8000, 8, WatchKind::Write)], &a), None);
        assert_eq!(first_hit(&[watch(0x8008, 8, WatchKind::Read)], &a), None);
        assert!(first_hit(&[watch(0x8008, 8, WatchKind::ReadWrite)], &a).is_some());
    }

    #[test]
    fn a_load_hits_read_and_access_watches_only() {
        // mov ebx, [rax]
        let a = of(&[0x8b, 0x18], &regs());
        assert!(first_hit(&[watch(0x8000, 4, WatchKind::Read)], &a).is_some());
        assert!(first_hit(&[watch(0x8002, 1, WatchKind::ReadWrite)], &a).is_some());
        assert_eq!(first_hit(&[watch(0x8000, 4, WatchKind::Write)], &a), None);
        // add [rax], ebx reads and writes.
        let a = of(&[0x01, 0x18], &regs());
        assert!(first_hit(&[watch(0x8000, 4, WatchKind::Write)], &a).is_some());
        assert!(first_hit(&[watch(0x8000, 4, WatchKind::Read)], &a).is_some());
    }

    #[test]
    fn a_push_writes_below_the_stack_pointer() {
        // push rbx
        let a = of(&[0x53], &regs());
        assert!(first_hit(&[watch(0x8ff8, 8, WatchKind::Write)], &a).is_some());
        assert_eq!(first_hit(&[watch(0x9000, 8, WatchKind::Write)], &a), None);
    }

    #[test]
    fn fs_relative_and_rip_relative_operands_are_linear() {
        // mov rbx, fs:[0x10]
        let a = of(&[0x64, 0x48, 0x8b, 0x1c, 0x25, 0x10, 0, 0, 0], &regs());
        assert_eq!(a.first().map(|a| a.addr), Some(0x5_0010));
        // mov [rip+0x100], eax: after the 6-byte instruction at 0x1000.
        let a = of(&[0x89, 0x05, 0x00, 0x01, 0, 0], &regs());
        assert_eq!(a.first().map(|a| a.addr), Some(0x1106));
    }

    #[test]
    fn nothing_is_made_up_for_bytes_that_do_not_decode() {
        assert!(of(&[], &regs()).is_empty());
        assert!(of(&[0x0f, 0xff], &regs()).is_empty());
    }

    #[test]
    fn tlb_flushes_are_seen() {
        let mut f = InstructionInfoFactory::new();
        let mut flushes =
            |code: &[u8]| foresee(code, 64, &regs(), &long_mode(), &mut f).flushes_tlb;
        assert!(flushes(&[0x0f, 0x01, 0x38]), "invlpg [rax]");
        assert!(flushes(&[0x0f, 0x22, 0xd8]), "mov cr3, rax");
        assert!(!flushes(&[0x0f, 0x20, 0xd8]), "mov rax, cr3");
        assert!(!flushes(&[0x48, 0x89, 0x58, 0x08]));
    }
}
