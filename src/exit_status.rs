//! Exit statuses of `vtrace run` and advice for the errors a user can fix.

use vtrace_analyzer::AnalyzeError;
use vtrace_export::ExportError;
use vtrace_gdb::GdbError;
use vtrace_image::sdt::SdtError;
use vtrace_image::symbols::SymbolError;
use vtrace_session::SessionError;
use vtrace_storage::DiskError;
use vtrace_vmm::{ControlError, Error};

/// The guest kernel panicked (see [`STATUS_TABLE`]).
pub const KERNEL_PANIC: i32 = 83;

/// `vtrace ctl` found no run to talk to: exit status 69, as when it cannot
/// connect.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NoRunListening(pub String);

/// Shown under `vtrace run --help`.
pub const STATUS_TABLE: &str = "\
Exit status:
  0-255  the status the guest passed to the EXIT hypercall (the demo OS: 0)
  0      also: the guest powered off (ACPI) or rebooted, or quit with Ctrl-A x;
         the last line vtrace prints says which
  1      vtrace info and vtrace analyze: the trace is damaged, or its run did not
         end cleanly; the warnings (and --json's problems) say what was
         passed over (--allow-damage: 0)
  2      bad command-line arguments, or values that mean nothing for the
         trace at hand (a step past its end, --pid on a trace without tasks)
         or the guest (--cpus above 1 for a real-mode image, --peep faster
         than 10us)
  65     the kernel is not a format vtrace boots, or its command line is invalid;
         a file given as a trace (or symbols) is not one, or holds nothing to
         analyze, or a segment it needs does not decode; a kernel's probe
         notes are malformed
  66     the kernel, initrd, trace or symbol file, or --sysroot (or --disk's
         directory) is missing or unreadable
  69     KVM is missing or unusable on this host (vtrace ctl: no run listening)
  70     an internal or KVM error
  73     the trace disk cannot be made (a file that is not a trace is there,
         no room to reserve it); an earlier trace there is left as it was;
         the control socket cannot be made (--control, or its default
         directory is not this user's own), nor gdb's (--gdb, --listen: the
         port is taken, the socket's path exists); vtrace analyze: an output
         file cannot be made or written
  74     reading or writing the trace disk failed
  75     another run is writing the trace disk (its pid is printed)
  77     no permission to open the KVM device
  78     guest memory too small (or too large) for the image
  80     the guest shut down (triple fault); registers and last exits are printed
  81     KVM could not emulate a guest instruction; the instruction is printed
  82     the guest stopped otherwise (halted for good, VM entry failed)
  83     the guest kernel panicked (Linux's \"Kernel panic\" line on its console,
         printed), however the machine stopped after it
  129    SIGHUP, 130 SIGINT (Ctrl-C), 143 SIGTERM: vtrace stopped tracing, wrote
         the trace to its end and removed its control socket first (a second
         signal ends it at once); vtrace analyze export stopped at the next
         segment and removed the file it was writing";

/// A command-line value that parsed but means nothing here (a routine the
/// kernel does not have): exit status 2, as for arguments clap refuses.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadArgument(pub String);

/// An input that is there but holds nothing to work on (a trace without
/// steps or samples): exit status 65, as for a file that is not a trace.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadData(pub String);

/// A file or directory named on the command line that is missing or
/// cannot be read as what it should be: exit status 66.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unreadable(pub String);

/// A stop signal (its number) ended the work before its end: a benchmark
/// run (the figures would be of part of the work, so there are none), an
/// export. Exit status 128 + the signal's number, as the shell shows a
/// death by it.
#[derive(Debug)]
pub struct Stopped(pub i32);

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stopped by {}", vtrace_vmm::stop_signals::name(self.0))
    }
}

impl std::error::Error for Stopped {}

/// An output file that cannot be made: exit status 73.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unwritable(pub String);

/// The exit status for a failed command: what the first error of its
/// chain that says one says, outermost first (a library's error wrapped
/// in the CLI's context gives the library's status); 70, an internal
/// error, where none does.
pub fn for_error(error: &anyhow::Error) -> i32 {
    error
        .chain()
        .find_map(status_of)
        .unwrap_or(exitcode::SOFTWARE)
}

/// The status `error` says, where it is one of the errors that say one:
/// the CLI's own, or a library's `exit_status()`.
fn status_of(error: &(dyn std::error::Error + 'static)) -> Option<i32> {
    [
        said(error, |s: &Stopped| 128 + s.0),
        said(error, |_: &BadArgument| 2),
        said(error, |_: &BadData| exitcode::DATAERR),
        said(error, |_: &Unreadable| exitcode::NOINPUT),
        said(error, |_: &Unwritable| exitcode::CANTCREAT),
        said(error, |_: &NoRunListening| exitcode::UNAVAILABLE),
        said(error, SessionError::exit_status),
        said(error, AnalyzeError::exit_status),
        said(error, ExportError::exit_status),
        said(error, SymbolError::exit_status),
        said(error, SdtError::exit_status),
        said(error, DiskError::exit_status),
        said(error, ControlError::exit_status),
        said(error, GdbError::exit_status),
        said(error, Error::exit_status),
    ]
    .into_iter()
    .flatten()
    .next()
}

/// `status` of `error`, where it is an `E`.
fn said<E: std::error::Error + 'static>(
    error: &(dyn std::error::Error + 'static),
    status: fn(&E) -> i32,
) -> Option<i32> {
    error.downcast_ref::<E>().map(status)
}

/// The VM's error in `error`'s chain, or inside a session's (where it is
/// transparent, so not in the chain itself).
fn vmm_error(error: &anyhow::Error) -> Option<&Error> {
    error.chain().find_map(|e| {
        e.downcast_ref::<Error>()
            .or(match e.downcast_ref::<SessionError>() {
                Some(SessionError::Vm(vm)) => Some(vm),
                _ => None,
            })
    })
}

/// What the user can do about an error, when there is something.
pub fn advice(error: &anyhow::Error) -> Option<String> {
    match vmm_error(error)? {
        Error::KvmUnavailable { path, source } => Some(match source.kind() {
            std::io::ErrorKind::NotFound => format!(
                "{} does not exist: this host has no KVM. Load the module (modprobe kvm_intel \
                 or kvm_amd), enable virtualization in the firmware, or in a cloud VM use an \
                 instance type with nested virtualization.",
                path.display()
            ),
            std::io::ErrorKind::PermissionDenied => format!(
                "you may not open {}: add your user to its group (usually: sudo usermod -aG kvm \
                 $USER, then log in again) or run as root.",
                path.display()
            ),
            _ => format!("check that {} is the KVM device.", path.display()),
        }),
        Error::KvmUnsupported(_) => Some(
            "vtrace needs KVM API 12 with sync registers, guest debug and immediate exit \
             (Linux 4.12 or later)."
                .into(),
        ),
        Error::MemoryTooSmall { need, .. } => Some(format!(
            "give the guest more memory, e.g. --memory {}M.",
            (need >> 20) + 16
        )),
        Error::ImageFormat { .. } => Some(
            "--kernel takes a Linux bzImage, a 64-bit vmlinux or a PVH ELF; a raw 16-bit image \
             goes with --real-mode FILE --load-addr ADDR."
                .into(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn io(kind: std::io::ErrorKind) -> std::io::Error {
        std::io::Error::from(kind)
    }

    fn busy() -> DiskError {
        DiskError::Busy {
            path: PathBuf::from("t.vtd"),
            holder: "pid 1".into(),
        }
    }

    /// Each status the CLI gives is a row of the table `--help` shows.
    fn in_table(status: i32) -> bool {
        STATUS_TABLE
            .lines()
            .any(|line| line.trim_start().starts_with(&status.to_string()))
            || (129..=143).contains(&status) && STATUS_TABLE.contains(&status.to_string())
    }

    #[test]
    fn each_error_says_its_status_through_the_wrappers_it_travels_in() {
        let cases: Vec<(anyhow::Error, i32)> = vec![
            (busy().into(), 75),
            // Transparent wrappers delegate: the inner error is not in the chain.
            (SessionError::Disk(busy()).into(), 75),
            (AnalyzeError::Trace(busy()).into(), 75),
            (AnalyzeError::NoSuchCpu { asked: 3, cpus: 1 }.into(), 2),
            (AnalyzeError::NoSteps.into(), 65),
            (ExportError::Analyze(AnalyzeError::NoSteps).into(), 65),
            (
                ExportError::Io(io(std::io::ErrorKind::StorageFull)).into(),
                73,
            ),
            (SessionError::Request("no routine".into()).into(), 2),
            (
                SessionError::Vm(Error::KvmUnavailable {
                    path: "/dev/kvm".into(),
                    source: io(std::io::ErrorKind::PermissionDenied),
                })
                .into(),
                77,
            ),
            (
                Error::KvmUnavailable {
                    path: "/dev/kvm".into(),
                    source: io(std::io::ErrorKind::NotFound),
                }
                .into(),
                69,
            ),
            (
                SessionError::Control(ControlError::Bind {
                    path: "s".into(),
                    source: io(std::io::ErrorKind::AddrInUse),
                })
                .into(),
                73,
            ),
            (GdbError::BadAddress("nowhere".into()).into(), 2),
            (SymbolError::BadScope("x".into()).into(), 2),
            (
                SymbolError::Read {
                    path: "vmlinux".into(),
                    source: io(std::io::ErrorKind::NotFound),
                }
                .into(),
                66,
            ),
            (
                Unwritable("cannot create /nonexistent/r.html".into()).into(),
                73,
            ),
            (Stopped(15).into(), 143),
            (anyhow::Error::new(io(std::io::ErrorKind::Other)), 70),
        ];
        for (error, status) in cases {
            assert_eq!(for_error(&error), status, "{error:#}");
            assert!(in_table(status), "status {status} is not in the table");
            // A context the CLI adds leaves the status as it was.
            let wrapped = error.context("while doing something");
            assert_eq!(for_error(&wrapped), status, "{wrapped:#}");
        }
    }

    /// The README shows the table `--help` shows, word for word.
    #[test]
    fn the_readme_shows_the_table_help_shows() {
        let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"));
        let rows = STATUS_TABLE
            .strip_prefix("Exit status:\n")
            .expect("the table's heading");
        assert!(
            readme.contains(&format!("```text\n{rows}\n```")),
            "README.md's exit status table differs from STATUS_TABLE"
        );
    }
}
