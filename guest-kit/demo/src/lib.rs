//! Guests built into vtrace: the demo OS and small test guests, compiled from
//! C and assembly by this crate's build script.

/// The demo OS: a PVH ELF (loads at 1 MiB, 32-bit PVH entry point), with
/// symbols and DWARF line tables left in for the analyzer.
pub const DEMO_OS_ELF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/demo-os.elf"));

/// The demo OS in its SMP mode (`vtrace run --cpus N`): the same kernel,
/// and CPU 0 also finds the other CPUs in the ACPI MADT, starts them with
/// INIT and STARTUP IPIs, and shares a queue of work items with them
/// under a spinlock; they report each item done with an IPI.
pub const DEMO_OS_SMP_ELF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/demo-os-smp.elf"));

/// The most CPUs [`DEMO_OS_SMP_ELF`] starts (`MAX_CPUS` in `os/smp.c`):
/// it leaves any others waiting for their STARTUP IPI.
pub const DEMO_OS_MAX_CPUS: u8 = 16;

/// A 16-bit real-mode guest: prints `hello from real mode`, then exits with
/// status 186 (the sum 1..=100 modulo 256). Load it at 0x7c00.
pub const REAL_MODE_HELLO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/realmode-hello.bin"));

/// Where [`REAL_MODE_HELLO`] expects to be loaded.
pub const REAL_MODE_HELLO_LOAD_ADDR: u64 = 0x7c00;

/// The exit status [`REAL_MODE_HELLO`] reports: (1 + 2 + ... + 100) mod 256.
pub const REAL_MODE_HELLO_STATUS: i32 = 5050 % 256;

/// Test guests: small images that each exercise one way a guest can fail.
pub mod test_guests {
    /// PVH ELF: empty IDT, then UD2, so the CPU shuts down with a triple
    /// fault.
    pub const TRIPLE_FAULT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/triple-fault.elf"));

    /// PVH ELF: runs POPCNT at CPL 0 in protected mode, which KVM's
    /// instruction emulator cannot do; where it runs natively the guest exits
    /// with [`UNEMULATED_NATIVE_STATUS`].
    pub const UNEMULATED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/unemulated.elf"));

    /// Real mode (load at 0x7c00): `xor eax,eax; mov ecx,3; 1: add eax,ecx;
    /// loop 1b; mov ebx,eax; mov eax,EXIT; mov dx,PORT; in eax,dx`. Exits
    /// with status 6; its trace is known instruction by instruction.
    pub const COUNT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/count.bin"));

    /// Real mode (load at 0x7c00): writes DR7 and DR0 for itself (a
    /// breakpoint on its own first byte), then runs [`COUNT`]'s loop and
    /// exits with status 6.
    pub const DEBUG_REGS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/debugregs.bin"));

    /// PVH ELF: installs a #UD handler, executes UD2; the handler exits
    /// with [`EXCEPTION_STATUS`].
    pub const EXCEPTION: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/exception.elf"));

    /// Exit status of [`EXCEPTION`].
    pub const EXCEPTION_STATUS: i32 = 7;

    /// PVH ELF: SYSENTER at CPL 0 to its label `entered`, which exits with
    /// [`SYSENTER_STATUS`].
    pub const SYSENTER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sysenter.elf"));

    /// Exit status of [`SYSENTER`].
    pub const SYSENTER_STATUS: i32 = 2;

    /// PVH ELF: loads an IDT with a #GP handler (`gp_handler`) and reads
    /// an MSR that does not exist; the handler exits with
    /// [`MSR_FAULT_STATUS`].
    pub const MSR_FAULT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/msr-fault.elf"));

    /// PVH ELF: 100 single-byte MOV stores to MMIO, each followed by an
    /// `inc eax`, then a REP STOSB of 100 bytes there; exits 0.
    pub const MMIO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mmio.elf"));

    /// PVH ELF: one REP STOSB of [`MMIO_FLOOD_BYTES`] bytes to MMIO;
    /// exits 0.
    pub const MMIO_FLOOD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/mmio-flood.elf"));

    /// Iterations of [`MMIO_FLOOD`]'s REP STOSB.
    pub const MMIO_FLOOD_BYTES: u64 = 500_000;

    /// Exit status of [`MSR_FAULT`].
    pub const MSR_FAULT_STATUS: i32 = 13;

    /// Real mode (load at 0x7c00): five passes of a loop, each starting
    /// with TRACE_REGION(2, 2) and setting ESI to the pass number; exits 0.
    pub const REGION: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/region.bin"));

    /// Real mode (load at 0x7c00): 20,000 LOG calls with terminal escapes,
    /// a NUL and a forged vtrace line in their text, 100,000 MARK calls
    /// with distinct ids, 20,000 unknown hypercalls; exits 0.
    pub const FLOOD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/flood.bin"));

    /// Real mode (load at 0x7c00): `sti; 1: hlt; jmp 1b` with no timer:
    /// idles until the run is ended from outside.
    pub const IDLE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/idle.bin"));

    /// Real mode (load at 0x7c00): LFENCE, MFENCE, SFENCE, CPUID, WBINVD,
    /// INVLPG, MOV CR0 and MOV CR3 (and two LFENCEs in a row), each
    /// followed by `inc esi`, which counts them (ESI ends at 9); exits 0.
    pub const FENCES: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fences.bin"));

    /// How many `inc esi` [`FENCES`] runs.
    pub const FENCES_MARKS: u64 = 9;

    /// Exit status of [`UNEMULATED`] on hosts that run it natively.
    pub const UNEMULATED_NATIVE_STATUS: i32 = 42;
}

#[cfg(test)]
mod tests {
    /// Traces name the demo OS by a hash of its bytes; a checkout path in
    /// its debug info would give every checkout a different image.
    #[test]
    fn the_demo_os_holds_no_checkout_path() {
        let dir = env!("CARGO_MANIFEST_DIR").as_bytes();
        let found = super::DEMO_OS_ELF.windows(dir.len()).any(|w| w == dir);
        assert!(!found, "the demo OS embeds {}", env!("CARGO_MANIFEST_DIR"));
    }

    #[test]
    fn the_smp_demo_starts_as_many_cpus_as_the_constant_says() {
        let source = include_str!("../os/smp.c");
        let define = format!("#define MAX_CPUS {}\n", super::DEMO_OS_MAX_CPUS);
        assert!(source.contains(&define), "os/smp.c: {define}");
    }
}
