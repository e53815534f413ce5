//! The VT-x test machine (`scripts/vtx.sh`): Bochs emulating an Intel CPU
//! with VMX, running the installed Debian kernel with its own kvm-intel,
//! so that `vtrace` inside meets KVM's real VMX code. See docs/vtx.md.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What a command inside the machine left.
pub struct VtxRun {
    /// The command's exit status (None: the machine failed or timed out).
    pub status: Option<i32>,
    /// The command's output (serial console: stdout and stderr together).
    pub output: String,
    /// What the machine itself said (Bochs, the script).
    pub stderr: String,
    /// What the command left in /out.
    pub out: tempfile::TempDir,
}

impl VtxRun {
    /// A file the command left in /out.
    pub fn file(&self, name: &str) -> PathBuf {
        self.out.path().join(name)
    }

    /// The text of a file the command left in /out (empty if it left none).
    pub fn text(&self, name: &str) -> String {
        std::fs::read_to_string(self.file(name)).unwrap_or_default()
    }
}

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
pub fn vtx(files: &[(&Path, &str)], command: &str, timeout: u32) -> VtxRun {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/vtx.sh");
    let out = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new("bash");
    cmd.arg(script)
        .args(["--vtrace", env!("CARGO_BIN_EXE_vtrace")])
        .args(["--timeout", &timeout.to_string()])
        .arg("--out")
        .arg(out.path());
    for (host, name) in files {
        cmd.arg("--file").arg(format!("{}:{name}", host.display()));
    }
    let o = cmd
        .args(["--", "sh", "-c", command])
        .output()
        .expect("run scripts/vtx.sh");
    VtxRun {
        status: o.status.code().filter(|c| *c != 124 && *c != 125),
        output: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        out,
    }
}
