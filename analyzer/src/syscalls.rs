//! Linux x86-64 system calls by number, from the `syscalls` crate's table
//! (generated from the kernel's own `syscall_64.tbl`).

use syscalls::x86_64::Sysno;
use vtrace_storage::Step;

/// `syscall`.
const SYSCALL: [u8; 2] = [0x0f, 0x05];

/// The number of the system call a step made: a `syscall` in user mode,
/// with the number in RAX (which the instruction leaves as it was).
pub fn number_of(step: &Step) -> Option<u64> {
    (step.cpl == 3 && step.bytes.as_slice() == SYSCALL).then_some(step.regs.gpr[0])
}

/// The call's name (`read`), or its number (`#1000`) where x86-64 Linux
/// has none.
pub fn name(number: u64) -> String {
    usize::try_from(number)
        .ok()
        .and_then(Sysno::new)
        .map_or_else(|| format!("#{number}"), |s| s.name().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_named_as_the_kernel_names_them() {
        assert_eq!(name(0), "read");
        assert_eq!(name(1), "write");
        assert_eq!(name(59), "execve");
        assert_eq!(name(231), "exit_group");
        assert_eq!(name(100_000), "#100000");
    }
}
