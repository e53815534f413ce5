//! What the test machines share: a script that boots one (`scripts/amdv.sh`,
//! `scripts/vtx.sh`) runs a command in it with this build's `vtrace` and
//! brings back its output, its exit status and what it left in /out.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What a command inside a test machine left.
pub struct MachineRun {
    /// The command's exit status (None: the machine failed or timed out).
    pub status: Option<i32>,
    /// The command's output (serial console: stdout and stderr together).
    pub output: String,
    /// What the machine itself said (the emulator, the script).
    pub stderr: String,
    /// What the command left in /out.
    pub out: tempfile::TempDir,
}

impl MachineRun {
    /// A file the command left in /out.
    pub fn file(&self, name: &str) -> PathBuf {
        self.out.path().join(name)
    }

    /// The text of a file the command left in /out (empty if it left none).
    pub fn text(&self, name: &str) -> String {
        std::fs::read_to_string(self.file(name)).unwrap_or_default()
    }
}

/// Runs `command` (a shell command line) through `script` (relative to the
/// checkout) with `options`, this build's `vtrace` on PATH and `files`
/// (host path, name in /work) copied in.
pub fn run_in_machine(
    script: &str,
    options: &[&str],
    files: &[(&Path, &str)],
    command: &str,
) -> MachineRun {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let out = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new("bash");
    cmd.arg(script)
        .args(["--vtrace", env!("CARGO_BIN_EXE_vtrace")])
        .args(options)
        .arg("--out")
        .arg(out.path());
    for (host, name) in files {
        cmd.arg("--file").arg(format!("{}:{name}", host.display()));
    }
    let o = cmd
        .args(["--", "sh", "-c", command])
        .output()
        .expect("run the test machine's script");
    MachineRun {
        // 124: out of time; 125: the machine did not come up.
        status: o.status.code().filter(|c| *c != 124 && *c != 125),
        output: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        out,
    }
}
