//! The VT-x test machine (`scripts/vtx.sh`): Bochs emulating an Intel CPU
//! with VMX, running the installed Debian kernel with its own kvm-intel,
//! so that `vtrace` inside meets KVM's real VMX code. See docs/vtx.md.

use std::path::Path;
use std::process::Command;

use super::machine::{run_in_machine, MachineRun};

/// Whether the VT-x machine can run here. Without Bochs the tests fail
/// with the reason, unless VTRACE_SKIP_VTX_TESTS=1 says to skip.
pub fn vtx_available() -> bool {
    let bochs = Command::new("sh")
        .args(["-c", "command -v bochs && command -v xorriso"])
        .output();
    match bochs {
        Ok(o) if o.status.success() => true,
        _ if std::env::var("VTRACE_SKIP_VTX_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping: no bochs or xorriso and VTRACE_SKIP_VTX_TESTS=1");
            false
        }
        _ => panic!(
            "bochs or xorriso is missing; scripts/test.sh installs them (bochs bochsbios \
             vgabios isolinux syslinux-common xorriso lz4). Set VTRACE_SKIP_VTX_TESTS=1 to \
             skip the VT-x machine's tests."
        ),
    }
}

/// Runs `command` (a shell command line) in the VT-x machine with this
/// build's `vtrace` on PATH and `files` (host path, name in /work) copied
/// in, for at most `timeout` seconds.
pub fn vtx(files: &[(&Path, &str)], command: &str, timeout: u32) -> MachineRun {
    run_in_machine(
        "scripts/vtx.sh",
        &["--timeout", &timeout.to_string()],
        files,
        command,
    )
}
