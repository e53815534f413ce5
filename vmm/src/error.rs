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
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// KVM answered, but not with the API or capabilities vtrace needs.
    #[error("KVM is not usable: {0}")]
    KvmUnsupported(String),
    /// A KVM ioctl failed where it should not.
    #[error("KVM call {call} failed: {source}")]
    Kvm {
        call: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    /// The kernel, initrd or image file does not exist or cannot be read.
    #[error("cannot read {what} {path}: {source}")]
    ImageUnreadable {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The kernel file is neither a PVH/64-bit ELF nor a bzImage.
    #[error("{path} is not a kernel vtrace can boot: {reason}")]
    ImageFormat { path: PathBuf, reason: String },
    /// The image does not fit into the guest memory asked for.
    #[error("guest memory of {have} bytes is too small: {what} needs at least {need} bytes")]
    MemoryTooSmall { what: String, need: u64, have: u64 },
    /// The memory size asked for cannot be used.
    #[error("invalid guest memory size {0} bytes: {1}")]
    MemorySize(u64, &'static str),
    /// Reserving or writing guest memory failed.
    #[error("guest memory: {0}")]
    Memory(String),
    /// The kernel command line is too long or has characters the protocol forbids.
    #[error("kernel command line rejected: {0}")]
    CommandLine(String),
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
        reason: String,
        report: Box<CrashReport>,
    },
    /// The terminal could not be put into raw mode or restored.
    #[error("console: {0}")]
    Console(#[source] std::io::Error),
    /// A peeping plan the guest's memory cannot serve (an address outside
    /// RAM, a read too wide).
    #[error("peeping: {0}")]
    Peep(String),
    /// A host thread or signal could not be set up.
    #[error("host setup: {0}")]
    Host(String),
}

impl Error {
    pub(crate) fn kvm(call: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
        move |source| Error::Kvm { call, source }
    }
}
