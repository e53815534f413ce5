//! What can go wrong in an export.

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Reading the trace, or its analysis, failed.
    #[error(transparent)]
    Analyze(#[from] vtrace_analyzer::AnalyzeError),
    /// Writing an output file, or standard output.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Arrow refused the columns (a bug: the schema is fixed).
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// The Parquet encoder failed.
    #[error("parquet: {0}")]
    Parquet(::parquet::errors::ParquetError),
    /// Standard output takes one stream of JSON lines only.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The caller asked the export to stop before it was complete; the
    /// file being written was removed.
    #[error("stopped before the export was complete")]
    Stopped,
}

impl ExportError {
    /// The status a command that fails with this error exits with: the
    /// analysis's own, where that failed; an output that cannot be
    /// written is sysexits.h's `EX_CANTCREAT`; the rest are vtrace's
    /// faults (`EX_SOFTWARE`).
    pub fn exit_status(&self) -> i32 {
        match self {
            ExportError::Analyze(e) => e.exit_status(),
            ExportError::Io(_) => exitcode::CANTCREAT,
            ExportError::Arrow(_)
            | ExportError::Parquet(_)
            | ExportError::Unsupported(_)
            | ExportError::Stopped => exitcode::SOFTWARE,
        }
    }
}

/// A result of an export.
pub type Result<T, E = ExportError> = std::result::Result<T, E>;

/// The encoder's errors, but its writes' failures as what they are: an
/// output that cannot be written (a full disk), not an encoder's fault.
impl From<::parquet::errors::ParquetError> for ExportError {
    fn from(e: ::parquet::errors::ParquetError) -> Self {
        match e {
            ::parquet::errors::ParquetError::External(inner) => match inner.downcast() {
                Ok(io) => ExportError::Io(*io),
                Err(other) => {
                    ExportError::Parquet(::parquet::errors::ParquetError::External(other))
                }
            },
            e => ExportError::Parquet(e),
        }
    }
}
