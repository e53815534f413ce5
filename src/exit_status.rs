//! Exit statuses of `vtrace run` and advice for the errors a user can fix.

use vtrace_analyzer::AnalyzeError;
use vtrace_image::symbols::SymbolError;
use vtrace_session::SessionError;
use vtrace_storage::DiskError;
use vtrace_vmm::Error;

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
         or the guest (--cpus above 1 for a Linux or real-mode image)
  65     the kernel is not a format vtrace boots, or its command line is invalid;
         a file given as a trace (or symbols) is not one, or holds nothing to
         analyze
  66     the kernel, initrd, trace or symbol file, or --sysroot (or --disk's
         directory) is missing or unreadable
  69     KVM is missing or unusable on this host (vtrace ctl: no run listening)
  70     an internal or KVM error
  73     the trace disk cannot be made (a file that is not a trace is there,
         no room to reserve it); an earlier trace there is left as it was;
         the control socket cannot be made (--control, or its default
         directory is not this user's own); vtrace analyze: an output file
         cannot be made or written
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

fn session_error(error: &anyhow::Error) -> Option<&SessionError> {
    error.chain().find_map(|e| e.downcast_ref::<SessionError>())
}

fn vmm_error(error: &anyhow::Error) -> Option<&Error> {
    // SessionError::Vm is transparent: its Error is not in the chain.
    error
        .chain()
        .find_map(|e| e.downcast_ref::<Error>())
        .or(match session_error(error) {
            Some(SessionError::Vm(e)) => Some(e),
            _ => None,
        })
}

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

/// The exit status for a failed run.
pub fn for_error(error: &anyhow::Error) -> i32 {
    if let Some(stopped) = error.downcast_ref::<Stopped>() {
        return 128 + stopped.0;
    }
    if error.chain().any(|e| e.is::<BadArgument>())
        || matches!(session_error(error), Some(SessionError::Request(_)))
    {
        return 2;
    }
    if error.chain().any(|e| e.is::<BadData>()) {
        return 65;
    }
    if error.chain().any(|e| e.is::<Unreadable>()) {
        return 66;
    }
    // SessionError::Control may be transparent: look there too.
    let control = error
        .chain()
        .find_map(|e| e.downcast_ref::<vtrace_vmm::ControlError>())
        .or(match session_error(error) {
            Some(SessionError::Control(c)) => Some(c),
            _ => None,
        });
    match control {
        Some(vtrace_vmm::ControlError::Connect { .. }) => return 69,
        Some(vtrace_vmm::ControlError::Bind { .. }) => return 73,
        _ => {}
    }
    let analysis = error.chain().find_map(|e| e.downcast_ref::<AnalyzeError>());
    // Symbols come from the analyzer or straight from the image crate.
    let symbols = error
        .chain()
        .find_map(|e| e.downcast_ref::<SymbolError>())
        .or(match analysis {
            Some(AnalyzeError::Symbols(symbols)) => Some(symbols),
            _ => None,
        });
    if let Some(symbols) = symbols {
        return match symbols {
            SymbolError::Read { .. } | SymbolError::NotAFile { .. } => 66,
            SymbolError::BadScope(_) => 2,
            _ => 65,
        };
    }
    match analysis {
        Some(AnalyzeError::WindowOutside { .. }) => return 2,
        // An output file that cannot be made or written.
        Some(
            AnalyzeError::Write { .. } | AnalyzeError::Export(vtrace_analyzer::ExportError::Io(_)),
        ) => return 73,
        _ => {}
    }
    // AnalyzeError::Trace and SessionError::Disk are transparent: their
    // DiskError is not in the chain.
    let disk = error
        .chain()
        .find_map(|e| e.downcast_ref::<DiskError>())
        .or(match analysis {
            Some(AnalyzeError::Trace(disk)) => Some(disk),
            _ => None,
        })
        .or(match session_error(error) {
            Some(SessionError::Disk(disk)) => Some(disk),
            _ => None,
        });
    if let Some(disk) = disk {
        return match disk {
            DiskError::Open { .. } | DiskError::DanglingLink { .. } => 66,
            DiskError::NotATrace { .. } | DiskError::NotAFile { .. } => 65,
            DiskError::TooSmall { .. } => 2,
            DiskError::Foreign { .. } | DiskError::Reserve { .. } | DiskError::NoRoom { .. } => 73,
            DiskError::Io { .. } => 74,
            DiskError::Busy { .. } => 75,
        };
    }
    if error.chain().any(|e| e.is::<NoRunListening>()) {
        return 69;
    }
    match vmm_error(error) {
        Some(Error::ImageFormat { .. } | Error::CommandLine { .. }) => 65,
        Some(Error::SeveralCpus { .. }) => 2,
        Some(Error::ImageUnreadable { .. }) => 66,
        Some(Error::KvmUnavailable { source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            77
        }
        Some(Error::KvmUnavailable { .. } | Error::KvmUnsupported(_)) => 69,
        Some(
            Error::MemoryTooSmall { .. } | Error::MemorySize(..) | Error::InitrdTooLarge { .. },
        ) => 78,
        Some(Error::GuestShutdown(_)) => 80,
        Some(Error::EmulationFailure(_)) => 81,
        Some(Error::GuestFailure { .. }) => 82,
        _ => 70,
    }
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
