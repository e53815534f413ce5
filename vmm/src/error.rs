//! The errors `vtrace-vmm` returns. Each variant is something a user can meet
//! and act on; the CLI turns them into messages and distinct exit statuses.

use std::path::PathBuf;

use crate::diagnostics::CrashReport;

/// Result alias for the VMM.
pub type Result<T> = std::result::Result<T, Error>;

/// Why a VM could not be built or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `/dev/kvm` does not exist or could not be opened.
    #[error("cannot open {path}: {source}")]
    KvmUnavailable {
        /// The KVM device.
        path: PathBuf,
        /// Why it could not be opened.
        #[source]
        source: std::io::Error,
    },
    /// KVM answered, but not with the API or capabilities vtrace needs.
    #[error("KVM is not usable: {0}")]
    KvmUnsupported(KvmLack),
    /// A KVM ioctl failed where it should not.
    #[error("KVM call {call} failed: {source}")]
    Kvm {
        /// The ioctl.
        call: &'static str,
        /// What KVM answered.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// The kernel, initrd or image file does not exist or cannot be read.
    #[error("cannot read {what} {path}: {source}")]
    ImageUnreadable {
        /// Which image ("kernel", "initrd").
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The kernel file is neither a PVH/64-bit ELF nor a bzImage.
    #[error("{path} is not a kernel vtrace can boot: {reason}")]
    ImageFormat {
        /// The file.
        path: PathBuf,
        /// What vtrace found in it.
        reason: String,
    },
    /// The image does not fit into the guest memory asked for.
    #[error("guest memory of {have} bytes is too small: {what} needs at least {need} bytes")]
    MemoryTooSmall {
        /// What did not fit.
        what: String,
        /// Bytes of guest memory it needs.
        need: u64,
        /// Bytes the guest has.
        have: u64,
    },
    /// The initrd does not fit between the kernel and the highest address
    /// an initrd may have (the kernel's limit, or the start of the MMIO
    /// hole below 4 GiB), whatever the memory.
    #[error(
        "the initrd ({len} bytes) does not fit between the kernel and {ceiling:#x}, the \
         highest address the kernel takes an initrd at: {room} bytes there, whatever --memory \
         is (make the initrd smaller)"
    )]
    InitrdTooLarge {
        /// The initrd's size.
        len: u64,
        /// Bytes between the kernel's end and the ceiling.
        room: u64,
        /// The highest address the initrd may end at.
        ceiling: u64,
    },
    /// The memory size asked for cannot be used.
    #[error("invalid guest memory size {0} bytes: {1}")]
    MemorySize(u64, &'static str),
    /// The image cannot run on a machine of several CPUs.
    #[error(
        "{path}: {what} does not run on a machine of {cpus} CPUs: several CPUs boot kernels \
         only (the built-in demo OS, a PVH kernel or Linux), which learn of the other CPUs \
         from the ACPI tables; run it with --cpus 1"
    )]
    SeveralCpus {
        /// The image.
        path: PathBuf,
        /// What kind of image it is.
        what: &'static str,
        /// The CPUs asked for.
        cpus: u8,
    },
    /// The engine asked for (`--engine bochs`) cannot run this guest: its
    /// library is not built or does not load.
    #[error("{0}")]
    Engine(String),
    /// The engine cannot make a machine of this many CPUs here.
    #[error(
        "the Bochs engine cannot make a machine of {0} CPUs here (at most {most}, and as many \
         as the first machine of the process); trace it with --engine step",
        most = vtrace_bochs::MAX_CPUS
    )]
    EngineCpus(u8),
    /// The CPU count asked for is out of range.
    #[error("a VM has 1 to {most} CPUs, not {asked}")]
    CpuCount {
        /// What was asked.
        asked: u8,
        /// The most there may be.
        most: u8,
    },
    /// Guest RAM could not be reserved on the host.
    #[error("cannot reserve guest memory: {0}")]
    Reserve(#[source] vm_memory::mmap::FromRangesError),
    /// Writing an image or a boot structure into guest RAM failed.
    #[error("cannot write {what} into guest memory at {at:#x}: {source}")]
    GuestWrite {
        /// What was written.
        what: &'static str,
        /// Its guest-physical address.
        at: u64,
        /// Why it failed.
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    /// Reading guest RAM the VMM needs failed.
    #[error("cannot read guest memory at {at:#x}: {source}")]
    GuestRead {
        /// The guest-physical address.
        at: u64,
        /// Why it failed.
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    /// linux-loader could not write a boot protocol's parameters.
    #[error("cannot write the {protocol} boot parameters: {source}")]
    BootParams {
        /// "Linux" or "PVH".
        protocol: &'static str,
        /// Why it failed.
        #[source]
        source: linux_loader::configurator::Error,
    },
    /// vtrace's own boot layout does not fit (a bug in vtrace, not the
    /// guest's fault): what does not fit, said for the report.
    #[error("vtrace's boot layout is wrong: {0} (please report this)")]
    BootLayout(LayoutFault),
    /// The kernel command line is too long or has characters the protocol forbids.
    #[error("kernel command line rejected: {source} (at most {max} bytes)")]
    CommandLine {
        /// What linux-loader refused.
        #[source]
        source: linux_loader::cmdline::Error,
        /// The longest command line this kernel takes.
        max: usize,
    },
    /// The command line could not be copied into guest memory.
    #[error("cannot write the kernel command line: {0}")]
    CommandLineWrite(#[source] linux_loader::loader::Error),
    /// The guest shut down (triple fault) or its vCPU entered a state KVM refuses.
    #[error("the guest shut down (triple fault)\n{0}")]
    GuestShutdown(Box<CrashReport>),
    /// KVM's instruction emulator met an instruction it cannot run.
    #[error("KVM could not emulate a guest instruction\n{0}")]
    EmulationFailure(Box<CrashReport>),
    /// The guest cannot go on: it halted for good, or KVM stopped it
    /// (the reason says which).
    #[error("{reason}\n{report}")]
    GuestFailure {
        /// What happened, for the user.
        reason: String,
        /// The guest's state.
        report: Box<CrashReport>,
    },
    /// The terminal could not be put into raw mode or restored.
    #[error("console: {0}")]
    Console(#[source] std::io::Error),
    /// A peeping plan the guest's memory cannot serve (an address outside
    /// RAM, a read too wide).
    #[error("peeping: {0}")]
    Peep(#[from] PeepError),
    /// A host thread or signal handler could not be set up.
    #[error("host setup: cannot {what}: {source}")]
    Host {
        /// What vtrace tried ("start the console thread").
        what: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

/// What KVM lacks for vtrace.
#[derive(Debug, thiserror::Error)]
pub enum KvmLack {
    /// The device path cannot be handed to the kernel (it holds a NUL).
    #[error("{0} is not a valid path")]
    BadPath(PathBuf),
    /// The KVM API version is not 12.
    #[error("{path} answers KVM API version {version}; vtrace needs 12")]
    ApiVersion {
        /// The KVM device.
        path: PathBuf,
        /// The version it answered.
        version: i32,
    },
    /// A capability vtrace needs is missing.
    #[error("the host lacks {0}")]
    Capability(&'static str),
    /// The CPUID table KVM reported cannot be handed back.
    #[error("CPUID table: {0:?}")]
    CpuidTable(vmm_sys_util::fam::Error),
}

/// What of vtrace's own boot layout does not fit.
#[derive(Debug, thiserror::Error)]
pub enum LayoutFault {
    /// The e820 map has more entries than boot_params holds.
    #[error("{0} memory map entries")]
    MemoryMap(usize),
    /// An ACPI table grew into the next.
    #[error("the ACPI table at {at:#x} ({len} bytes) overlaps the next at {next:#x}")]
    AcpiOverlap {
        /// The table's address.
        at: u64,
        /// Its length.
        len: usize,
        /// The next table's address.
        next: u64,
    },
}

impl Error {
    /// The status a command that fails with this error exits with: as
    /// sysexits.h names them where one fits, 2 for a value that means
    /// nothing for this guest (the status of arguments clap refuses), and
    /// vtrace's own 80 to 82 for the ways a guest dies.
    pub fn exit_status(&self) -> i32 {
        match self {
            Error::ImageFormat { .. } | Error::CommandLine { .. } => exitcode::DATAERR,
            Error::SeveralCpus { .. }
            | Error::CpuCount { .. }
            | Error::Peep(_)
            | Error::EngineCpus(_) => 2,
            Error::Engine(_) => exitcode::UNAVAILABLE,
            Error::ImageUnreadable { .. } => exitcode::NOINPUT,
            Error::KvmUnavailable { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                exitcode::NOPERM
            }
            Error::KvmUnavailable { .. } | Error::KvmUnsupported(_) => exitcode::UNAVAILABLE,
            Error::MemoryTooSmall { .. } | Error::MemorySize(..) | Error::InitrdTooLarge { .. } => {
                exitcode::CONFIG
            }
            Error::GuestShutdown(_) => 80,
            Error::EmulationFailure(_) => 81,
            Error::GuestFailure { .. } => 82,
            Error::Kvm { .. }
            | Error::Reserve(_)
            | Error::GuestWrite { .. }
            | Error::GuestRead { .. }
            | Error::BootParams { .. }
            | Error::BootLayout(_)
            | Error::CommandLineWrite(_)
            | Error::Console(_)
            | Error::Host { .. } => exitcode::SOFTWARE,
        }
    }

    /// The guest's state where the error is a guest's death, for a caller
    /// that knows more of the guest than the VMM (its symbols) to add to.
    pub fn crash_report_mut(&mut self) -> Option<&mut CrashReport> {
        match self {
            Error::GuestShutdown(report)
            | Error::EmulationFailure(report)
            | Error::GuestFailure { report, .. } => Some(report),
            _ => None,
        }
    }

    pub(crate) fn kvm(call: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
        move |source| Error::Kvm { call, source }
    }
}

/// Why a peeping plan cannot be followed.
#[derive(Debug, thiserror::Error)]
pub enum PeepError {
    /// The interval is shorter than the shortest the peeper keeps.
    #[error("a peeping interval of {asked:?} is below the shortest, {shortest:?}")]
    TooOften {
        /// The interval asked for.
        asked: std::time::Duration,
        /// The shortest the peeper keeps (10 µs).
        shortest: std::time::Duration,
    },
    /// More reads than the peeper takes.
    #[error("{asked} variables to sample; at most {most}")]
    TooMany {
        /// Reads asked for.
        asked: usize,
        /// The most it takes.
        most: usize,
    },
    /// A read of a width the peeper does not take.
    #[error("a variable of {0} bytes cannot be sampled (1, 2, 4 or 8)")]
    BadSize(u8),
    /// A read outside guest RAM.
    #[error("guest-physical address {gpa:#x} ({size} bytes) is not in the guest's RAM")]
    NotInRam {
        /// Where the read was asked for.
        gpa: u64,
        /// Its width.
        size: u8,
    },
}
