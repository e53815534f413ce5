//! The AMD-V test machine (`scripts/amdv.sh`): QEMU emulating an AMD CPU
//! with SVM, running the installed Debian kernel with its own kvm-amd, so
//! that `vtrace` inside meets KVM's real SVM code. See docs/amdv.md.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What a command inside the machine left.
pub struct AmdvRun {
    /// The command's exit status (None: the machine failed or timed out).
    pub status: Option<i32>,
    /// The command's output (serial console: stdout and stderr together).
    pub output: String,
    /// What the machine itself said (QEMU, the script).
    pub stderr: String,
    /// What the command left in /out.
    pub out: tempfile::TempDir,
}

impl AmdvRun {
    /// A file the command left in /out.
    pub fn file(&self, name: &str) -> PathBuf {
        self.out.path().join(name)
    }
}

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
/// in.
pub fn amdv(files: &[(&Path, &str)], command: &str) -> AmdvRun {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/amdv.sh");
    let out = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new("bash");
    cmd.arg(script)
        .args(["--vtrace", env!("CARGO_BIN_EXE_vtrace")])
        .arg("--out")
        .arg(out.path());
    for (host, name) in files {
        cmd.arg("--file").arg(format!("{}:{name}", host.display()));
    }
    let o = cmd
        .args(["--", "sh", "-c", command])
        .output()
        .expect("run scripts/amdv.sh");
    AmdvRun {
        status: o.status.code().filter(|c| *c != 124 && *c != 125),
        output: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        out,
    }
}
