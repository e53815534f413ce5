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
    // A test that failed while holding it does not stop the others.
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    run_in_machine("scripts/amdv.sh", &[], files, command)
}

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// [`amdv`] with a time limit of `seconds`, run once more where the
/// machine ran out of it. The machine stood still during `vtrace ctl`
/// start and stop cycles where QEMU lost its kernel's one-shot timer
/// interrupt (docs/amdv.md): no sleep ended. Its kernel now ticks
/// periodically, so a lost tick comes again, and vtrace arms no interrupt
/// window while stepping; this guards what is left. A run that stands
/// still twice fails, with the machine's heartbeat in its error.
pub fn amdv_retried(files: &[(&Path, &str)], command: &str, seconds: u32) -> MachineRun {
    let seconds = seconds.to_string();
    let mut tries = 0;
    loop {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        let m = run_in_machine("scripts/amdv.sh", &["--timeout", &seconds], files, command);
        tries += 1;
        if m.status.is_some() || !m.stderr.contains("ran out of time") || tries == 2 {
            return m;
        }
        eprintln!(
            "the AMD-V machine stood still for {seconds} s; running it once more. What it \
             printed:\n{}\n{}",
            m.output, m.stderr
        );
    }
}

/// Runs `command` in the AMD-V machine with its second serial port (ttyS1
/// inside) on a TCP port of the host's 127.0.0.1; once the command prints
/// the line `ready`, runs `host` with that port while the machine goes on.
/// Returns the machine's run and what `host` returned.
pub fn amdv_with_serial<T>(
    command: &str,
    ready: &str,
    host: impl FnOnce(u16) -> T,
) -> (MachineRun, T) {
    use std::io::{BufRead, BufReader, Read};
    use std::process::Stdio;
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let out = tempfile::tempdir().expect("temp dir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/amdv.sh");
    let mut child = Command::new("bash")
        .arg(script)
        .args(["--vtrace", env!("CARGO_BIN_EXE_vtrace")])
        .args(["--serial-port", &port.to_string()])
        .arg("--out")
        .arg(out.path())
        .args(["--", "sh", "-c", command])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run scripts/amdv.sh");
    let mut stderr = child.stderr.take().expect("stderr");
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut output = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap_or_default();
        output.push_str(&line);
        output.push('\n');
        if line.trim() == ready {
            break;
        }
    }
    let result = host(port);
    for line in lines {
        output.push_str(&line.unwrap_or_default());
        output.push('\n');
    }
    let status = child.wait().expect("scripts/amdv.sh");
    let run = MachineRun {
        status: status.code().filter(|c| *c != 124 && *c != 125),
        output,
        stderr: errors.join().unwrap_or_default(),
        out,
    };
    (run, result)
}
