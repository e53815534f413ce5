//! Facts about the host that change how guests can be stepped.

/// Whether this host runs guests with hardware virtualization (VT-x or
/// AMD-V, the `vmx`/`svm` CPU flags). There, `KVM_GUESTDBG_SINGLESTEP`
/// rides on RFLAGS.TF, which the CPU clears when it delivers an exception,
/// so a tracer must catch exception handlers itself. Hosts without those
/// flags (KVM emulating kernel code) step into handlers on their own.
pub fn steps_with_trap_flag() -> bool {
    virtualization().is_some()
}

/// The hardware virtualization the CPU advertises to this kernel: "AMD-V"
/// (`svm`), "VT-x" (`vmx`), or none.
pub fn virtualization() -> Option<&'static str> {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has = |flag: &str| {
        info.lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|f| f == flag))
    };
    if has("svm") {
        Some("AMD-V")
    } else if has("vmx") {
        Some("VT-x")
    } else {
        None
    }
}
