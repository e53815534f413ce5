//! The AMD-V test machine (`scripts/amdv.sh`): QEMU emulating an AMD CPU
//! with SVM, running the installed Debian kernel with its own kvm-amd, so
//! that `vtrace` inside meets KVM's real SVM code. See docs/amdv.md.

use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, PoisonError};

use super::machine::{run_in_machine, MachineRun};

/// Whether the AMD-V machine can run here. Without QEMU the tests fail
/// with the reason, unless VTRACE_SKIP_AMDV_TESTS=1 says to skip.
pub fn amdv_available() -> bool {
    let qemu = Command::new("qemu-system-x86_64").arg("--version").output();
    match qemu {
        Ok(o) if o.status.success() => true,
        _ if std::env::var("VTRACE_SKIP_AMDV_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping: no qemu-system-x86_64 and VTRACE_SKIP_AMDV_TESTS=1");
            false
        }
        _ => panic!(
            "qemu-system-x86_64 is missing; scripts/test.sh installs it (with busybox-static \
             and cpio). Set VTRACE_SKIP_AMDV_TESTS=1 to skip the AMD-V machine's tests."
        ),
    }
}

/// Runs `command` (a shell command line) in the AMD-V machine with this
/// build's `vtrace` on PATH and `files` (host path, name in /work) copied
/// in. One machine at a time: two QEMUs on a 2-core host starve each
/// other's nested guests, whose timers follow host time (a Linux boot
/// hung once that way, a `vtrace ctl start` went unanswered once).
pub fn amdv(files: &[(&Path, &str)], command: &str) -> MachineRun {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    // A test that failed while holding it does not stop the others.
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    run_in_machine("scripts/amdv.sh", &[], files, command)
}
