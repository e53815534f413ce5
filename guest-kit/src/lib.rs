//! The vtrace hypercall ABI: the single source of truth shared by the host
//! (the VMM decodes calls with these constants) and by guests written in Rust.
//! C guests use `include/vtrace.h`, which a host test checks against this file.
//!
//! # Calling convention
//!
//! A hypercall is one `IN` from [`PORT`] with a 32-bit operand:
//!
//! | register | meaning |
//! |---|---|
//! | `EAX` | command ([`cmd`]) on entry, result ([`status`]) on return |
//! | `RBX`, `RCX`, `RSI`, `RDI` | arguments 0 to 3 |
//! | `R8`, `R9` | arguments 4 and 5 ([`cmd::PROBE`] only) |
//! | `DX` | [`PORT`] |
//!
//! A single `IN` (rather than `OUT` then `IN`) keeps a hypercall to one exit
//! and makes the result arrive atomically with the call. Outside long mode the
//! arguments are truncated to 32 bits. Pointers are guest-virtual addresses,
//! translated through the guest's current page tables; every pointer and
//! length is checked by the host, and a bad one yields [`status::BAD_ADDRESS`]
//! or [`status::BAD_LENGTH`], never a host failure.

#![no_std]

/// The I/O port every hypercall goes through ("VT").
pub const PORT: u16 = 0x5654;

/// ABI version returned by [`cmd::VERSION`]; bumped on incompatible changes.
pub const ABI_VERSION: u32 = 1;

/// Magic in the upper half of the [`cmd::VERSION`] answer, so that a guest
/// can tell vtrace from a machine where the port floats (reads all ones).
pub const VERSION_MAGIC: u32 = 0x5654_0000;

/// Longest text a single [`cmd::LOG`] may carry.
pub const LOG_MAX_LEN: u32 = 4096;

/// Hypercall commands, passed in `EAX`.
pub mod cmd {
    /// Returns `VERSION_MAGIC | ABI_VERSION`. No arguments.
    pub const VERSION: u32 = 0x00;
    /// Ends the VM; `vtrace run` exits with arg0 (0..=255) as its status.
    pub const EXIT: u32 = 0x01;
    /// Prints arg1 bytes of text at guest-virtual arg0 on the host log.
    pub const LOG: u32 = 0x02;
    /// Records a mark: arg0 is an identifier, arg1 a value.
    pub const MARK: u32 = 0x03;
    /// Starts tracing on the arg0-th call (0 and 1 both mean "now").
    pub const TRACE_START: u32 = 0x10;
    /// Stops tracing on the arg0-th call after tracing started.
    pub const TRACE_STOP: u32 = 0x11;
    /// The combined form, for one call site in a loop: tracing starts on
    /// the arg0-th call and stops on the (arg0 + arg1)-th, so it covers
    /// arg1 passes of the loop.
    pub const TRACE_REGION: u32 = 0x12;
    /// A static probe fires (`include/vtrace-sdt.h`): the host knows the
    /// probe by the address of this `IN`, which the site's `stapsdt` ELF
    /// note gives; `RBX`, `RCX`, `RSI`, `RDI`, `R8`, `R9` hold its
    /// arguments 0 to 5. Sites fire only while the host has set their
    /// semaphores.
    pub const PROBE: u32 = 0x20;

    /// A command's name as the ABI spells it (`TRACE_START`), for
    /// listings; `None` for a number the ABI does not define.
    pub fn name(command: u32) -> Option<&'static str> {
        Some(match command {
            VERSION => "VERSION",
            EXIT => "EXIT",
            LOG => "LOG",
            MARK => "MARK",
            TRACE_START => "TRACE_START",
            TRACE_STOP => "TRACE_STOP",
            TRACE_REGION => "TRACE_REGION",
            PROBE => "PROBE",
            _ => return None,
        })
    }
}

/// Results, returned in `EAX`. Errors are small negative numbers.
pub mod status {
    /// The call did what it says.
    pub const OK: i32 = 0;
    /// `EAX` named no command this host knows.
    pub const UNKNOWN_COMMAND: i32 = -1;
    /// A pointer did not translate to guest RAM.
    pub const BAD_ADDRESS: i32 = -2;
    /// A length was zero where text is needed, or above its limit.
    pub const BAD_LENGTH: i32 = -3;
    /// The command exists but this host cannot do it now (for example,
    /// tracing commands on a VMM built without a tracer).
    pub const UNAVAILABLE: i32 = -4;
}

/// Issues a hypercall. Only meaningful inside a vtrace guest at CPL 0.
///
/// # Safety
/// Port I/O is privileged; the caller must run where `IN` is allowed.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn hypercall(command: u32, a0: u64, a1: u64, a2: u64, a3: u64) -> i32 {
    let result: u32;
    // RBX is reserved by LLVM, so it is swapped in and out around the IN.
    core::arch::asm!(
        "xchg {a0}, rbx",
        "in eax, dx",
        "xchg {a0}, rbx",
        a0 = inout(reg) a0 => _,
        inout("eax") command => result,
        in("dx") PORT,
        in("rcx") a1,
        in("rsi") a2,
        in("rdi") a3,
        options(nostack, preserves_flags),
    );
    result as i32
}
