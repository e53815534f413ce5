//! Linux x86 system calls by number, from the `syscalls` crate's tables
//! (generated from the kernel's own `syscall_64.tbl` and `syscall_32.tbl`).
//!
//! Which table a call goes through depends on how user mode entered the
//! kernel, not on the process: `syscall` from 64-bit code takes the x86-64
//! table; `int 0x80` from any code, and `sysenter` or `syscall` from 32-bit
//! code, take the i386 one (the kernel's `ia32_sys_call_table` under
//! `IA32_EMULATION`), where `write` is 4, not 1.

use std::fmt;

use syscalls::{x86::Sysno as Ia32Sysno, x86_64::Sysno};
use vtrace_storage::{CpuMode, Step};

/// `syscall`.
const SYSCALL: [u8; 2] = [0x0f, 0x05];
/// `sysenter`.
const SYSENTER: [u8; 2] = [0x0f, 0x34];
/// `int 0x80`.
const INT_80: [u8; 2] = [0xcd, 0x80];
/// The vector `int 0x80` delivers.
pub const INT_80_VECTOR: u8 = 0x80;

/// The table a system call's number indexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Abi {
    /// x86-64: `syscall` from 64-bit code.
    X86_64,
    /// i386: `int 0x80`, or `sysenter`/`syscall` from 32-bit code.
    Ia32,
}

/// A system call a user-mode step made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SystemCall {
    /// The table its number indexes.
    pub abi: Abi,
    /// Its number (RAX; EAX for i386, whose entry reads only that).
    pub number: u64,
}

impl SystemCall {
    /// The call's name: `write`, `write (ia32)` for the i386 table's, or
    /// its number (`#1000`) where the table has none.
    pub fn name(self) -> String {
        let name = self.table_name();
        match self.abi {
            Abi::X86_64 => name,
            Abi::Ia32 => format!("{name} (ia32)"),
        }
    }

    /// The name its table gives it, else `#NUMBER`.
    fn table_name(self) -> String {
        usize::try_from(self.number)
            .ok()
            .and_then(|n| match self.abi {
                Abi::X86_64 => Sysno::new(n).map(|s| s.name()),
                Abi::Ia32 => Ia32Sysno::new(n).map(|s| s.name()),
            })
            .map_or_else(|| format!("#{}", self.number), str::to_string)
    }
}

/// `write (1)`, `write (ia32 4)`: the name and the number as the table
/// has it.
impl fmt::Display for SystemCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.table_name();
        match self.abi {
            Abi::X86_64 => write!(f, "{name} ({})", self.number),
            Abi::Ia32 => write!(f, "{name} (ia32 {})", self.number),
        }
    }
}

/// The system call a step made: a `syscall`, `sysenter` or `int 0x80` in
/// user mode, with the number in RAX (which each leaves as it was).
pub fn made_by(step: &Step) -> Option<SystemCall> {
    if step.cpl != 3 {
        return None;
    }
    let code64 = step.mode == CpuMode::Long64;
    let abi = match step.bytes.as_slice() {
        b if b == SYSCALL && code64 => Abi::X86_64,
        b if b == INT_80 || b == SYSENTER || b == SYSCALL => Abi::Ia32,
        _ => return None,
    };
    let number = match abi {
        Abi::X86_64 => step.regs.gpr[0],
        Abi::Ia32 => step.regs.gpr[0] & 0xffff_ffff,
    };
    Some(SystemCall { abi, number })
}

/// Whether `step` is a user-mode `int 0x80`. An interrupt of
/// [`INT_80_VECTOR`] recorded right after it (on the same CPU) is its
/// delivery: the system call's entry, which some hosts record as an
/// interrupt (AMD-V) and others do not, so the analyses count it as the
/// system call alone.
pub fn is_int_80(step: &Step) -> bool {
    step.cpl == 3 && step.bytes.as_slice() == INT_80
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtrace_storage::InsnBytes;

    fn call(abi: Abi, number: u64) -> SystemCall {
        SystemCall { abi, number }
    }

    #[test]
    fn numbers_are_named_as_the_kernel_names_them() {
        assert_eq!(call(Abi::X86_64, 0).name(), "read");
        assert_eq!(call(Abi::X86_64, 1).name(), "write");
        assert_eq!(call(Abi::X86_64, 59).name(), "execve");
        assert_eq!(call(Abi::X86_64, 231).name(), "exit_group");
        assert_eq!(call(Abi::X86_64, 100_000).name(), "#100000");
        // arch/x86/entry/syscalls/syscall_32.tbl
        assert_eq!(call(Abi::Ia32, 4).name(), "write (ia32)");
        assert_eq!(call(Abi::Ia32, 20).name(), "getpid (ia32)");
        assert_eq!(call(Abi::Ia32, 252).name(), "exit_group (ia32)");
        assert_eq!(call(Abi::Ia32, 100_000).name(), "#100000 (ia32)");
        assert_eq!(call(Abi::X86_64, 1).to_string(), "write (1)");
        assert_eq!(call(Abi::Ia32, 4).to_string(), "write (ia32 4)");
        assert_eq!(call(Abi::Ia32, 9999).to_string(), "#9999 (ia32 9999)");
    }

    fn step(bytes: &[u8], mode: CpuMode, cpl: u8, rax: u64) -> Step {
        let mut s = Step {
            pc: 0x40_1000,
            bytes: InsnBytes::new(bytes).unwrap(),
            cr3: 0x1000,
            mode,
            cpl,
            regs: Default::default(),
        };
        s.regs.gpr[0] = rax;
        s
    }

    #[test]
    fn the_entry_instruction_and_the_code_size_choose_the_table() {
        let high = 0xdead_0000_0000_0000 | 20;
        let cases = [
            (&SYSCALL, CpuMode::Long64, Some(call(Abi::X86_64, high))),
            (&INT_80, CpuMode::Long64, Some(call(Abi::Ia32, 20))),
            (&INT_80, CpuMode::Compat32, Some(call(Abi::Ia32, 20))),
            (&SYSENTER, CpuMode::Compat32, Some(call(Abi::Ia32, 20))),
            (&SYSCALL, CpuMode::Compat32, Some(call(Abi::Ia32, 20))),
            (&INT_80, CpuMode::Protected32, Some(call(Abi::Ia32, 20))),
            (&[0xcd, 0x03], CpuMode::Long64, None),
            (&[0x90, 0x90], CpuMode::Long64, None),
        ];
        for (bytes, mode, want) in cases {
            assert_eq!(
                made_by(&step(bytes, mode, 3, high)),
                want,
                "{bytes:x?} {mode:?}"
            );
        }
        // The kernel's own (a hypervisor's guest kernel may `syscall` too).
        assert_eq!(made_by(&step(&SYSCALL, CpuMode::Long64, 0, 1)), None);
        assert_eq!(made_by(&step(&INT_80, CpuMode::Long64, 0, 1)), None);
    }
}
