//! What can go wrong while a session is assembled or run.

/// Errors of [`crate::SessionBuilder::build`] and [`crate::Session::run`].
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The request is well formed but means nothing for this guest: a
    /// routine its kernel does not have, more breakpoints than the CPU
    /// holds, a probe no site matches. The text says what to change.
    #[error("{0}")]
    Request(String),
    /// The trace disk could not be made, written or finished.
    #[error(transparent)]
    Disk(#[from] vtrace_storage::DiskError),
    /// The VM could not be made or failed while it ran.
    #[error(transparent)]
    Vm(#[from] vtrace_vmm::Error),
    /// The control socket for `vtrace ctl` could not be made.
    #[error(transparent)]
    Control(#[from] vtrace_vmm::ControlError),
    /// gdb's address could not be listened on.
    #[error(transparent)]
    Gdb(#[from] vtrace_gdb::GdbError),
    /// The static probes of a kernel image could not be read.
    #[error("cannot read the probes of {what}: {source}")]
    Probes {
        /// The image, as the user named it.
        what: String,
        /// What was wrong with its notes.
        source: vtrace_image::sdt::SdtError,
    },
}

impl SessionError {
    /// The status a command that fails with this error exits with: 2 for
    /// a request that means nothing here (the status of arguments clap
    /// refuses), else what the error it carries says.
    pub fn exit_status(&self) -> i32 {
        match self {
            SessionError::Request(_) => 2,
            SessionError::Disk(e) => e.exit_status(),
            SessionError::Vm(e) => e.exit_status(),
            SessionError::Control(e) => e.exit_status(),
            SessionError::Gdb(e) => e.exit_status(),
            SessionError::Probes { source, .. } => source.exit_status(),
        }
    }

    /// The request that means nothing here, said as `text`.
    pub(crate) fn request(text: impl Into<String>) -> SessionError {
        SessionError::Request(text.into())
    }
}
