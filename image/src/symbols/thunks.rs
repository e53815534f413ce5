//! Compiler- and kernel-made trampolines that stand in for a `ret` or an
//! indirect branch. Linux on x86-64 since 5.19 (retbleed, SRSO and ITS
//! mitigations) ends functions with `jmp __x86_return_thunk` instead of
//! `ret`, and makes indirect calls through retpolines
//! (`call __x86_indirect_thunk_rax`, which itself does `call`, `mov
//! [rsp], rax`, `ret`). Followed literally, every return would look like
//! a tail call and every indirect call like a `ret` to nowhere, so the
//! level engine treats their steps as part of the routines on either
//! side: see the analyzer's `levels::ItemBuilder`. User programs' PLT stubs are
//! indirect jumps of the same kind.

/// What a trampoline stands in for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Thunk {
    /// A `ret`: its steps belong to the routine that jumped to it.
    Return,
    /// An indirect call or jump: its steps belong to the routine it
    /// reaches.
    IndirectBranch,
}

/// The trampoline kind of a routine named `name`, if it is one.
pub fn thunk_kind(name: &str) -> Option<Thunk> {
    const INDIRECT: &[&str] = &[
        "__x86_indirect_thunk",
        "__x86_indirect_jump_thunk",
        "__x86_indirect_call_thunk",
        "__x86_indirect_its_thunk",
        "__x86_indirect_alt_call",
        "__x86_indirect_alt_jmp",
    ];
    // A PLT stub is `jmp [GOT slot]`: the routine it reaches is the one
    // called (sections named in `elf`).
    if INDIRECT.iter().any(|p| name.starts_with(p)) || super::elf::is_plt(name) {
        return Some(Thunk::IndirectBranch);
    }
    // __x86_return_thunk, retbleed_return_thunk, srso_return_thunk,
    // srso_alias_return_thunk, its_return_thunk; __ret with call depth
    // tracking. SRSO's thunks are `call srso_safe_ret`, and that is
    // `lea 8(%rsp), %rsp; ret` (arch/x86/lib/retpoline.S): the stub is
    // part of the return too.
    if name.ends_with("_return_thunk")
        || name == "__ret"
        || name == "srso_safe_ret"
        || name == "srso_alias_safe_ret"
    {
        return Some(Thunk::Return);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_linux_trampolines() {
        assert_eq!(thunk_kind("__x86_return_thunk"), Some(Thunk::Return));
        assert_eq!(thunk_kind("srso_alias_return_thunk"), Some(Thunk::Return));
        assert_eq!(thunk_kind("srso_safe_ret"), Some(Thunk::Return));
        assert_eq!(
            thunk_kind("__x86_indirect_thunk_array"),
            Some(Thunk::IndirectBranch)
        );
        assert_eq!(
            thunk_kind("__x86_indirect_thunk_r11"),
            Some(Thunk::IndirectBranch)
        );
        assert_eq!(thunk_kind(".plt"), Some(Thunk::IndirectBranch));
        assert_eq!(thunk_kind(".plt.sec"), Some(Thunk::IndirectBranch));
        assert_eq!(thunk_kind("schedule"), None);
        assert_eq!(thunk_kind("entry_untrain_ret"), None);
    }
}
