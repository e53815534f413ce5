//! What can go wrong in an analysis.

use std::path::PathBuf;

use vtrace_storage::DiskError;

use vtrace_image::symbols::SymbolError;

/// Why an analysis failed.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    /// The trace disk cannot be opened or read.
    #[error(transparent)]
    Trace(#[from] DiskError),
    /// The symbols asked for cannot be read.
    #[error(transparent)]
    Symbols(#[from] SymbolError),
    /// An output file cannot be written.
    #[error("{path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Writing the output stream failed.
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
    /// The trace holds no step the analysis could read.
    #[error("the trace has no readable steps")]
    NoSteps,
    /// The analysis follows one CPU's calls and returns, and the trace
    /// holds several CPUs' steps.
    #[error(
        "the trace holds the steps of {cpus} CPUs, and this analysis follows one CPU's calls \
         and returns: name it with --cpu N (0 to {last}); `vtrace analyze stats --cpu all` shows \
         each CPU's share",
        last = cpus - 1
    )]
    ChooseCpu {
        /// The trace's CPUs.
        cpus: u32,
    },
    /// The CPU asked for is not in the trace.
    #[error("the trace holds CPUs 0 to {last}, not CPU {asked}", last = cpus - 1)]
    NoSuchCpu {
        /// The CPU asked for.
        asked: u32,
        /// The trace's CPUs.
        cpus: u32,
    },
    /// A segment a look-up needs does not decode.
    #[error("a segment of the trace does not decode: {0}")]
    Segment(#[from] vtrace_storage::SegmentError),
    /// A listing window starts past the trace's end.
    #[error("step {from} is past the trace's last step ({last})")]
    WindowOutside {
        /// The first step asked for.
        from: u64,
        /// The trace's last step.
        last: u64,
    },
    /// The HTML report's template did not render.
    #[error("HTML report: {0}")]
    Report(#[source] minijinja::Error),
    /// inferno could not draw a flame graph.
    #[error("flame graph: {0}")]
    Flame(#[source] std::io::Error),
}

impl AnalyzeError {
    /// The status a command that fails with this error exits with, as
    /// sysexits.h names them (2 for a value that means nothing for this
    /// trace, the status of arguments clap refuses), or what the error it
    /// carries says.
    pub fn exit_status(&self) -> i32 {
        match self {
            AnalyzeError::Trace(e) => e.exit_status(),
            AnalyzeError::Symbols(e) => e.exit_status(),
            AnalyzeError::Write { .. } | AnalyzeError::Output(_) => exitcode::CANTCREAT,
            AnalyzeError::NoSteps | AnalyzeError::Segment(_) => exitcode::DATAERR,
            AnalyzeError::ChooseCpu { .. }
            | AnalyzeError::NoSuchCpu { .. }
            | AnalyzeError::WindowOutside { .. } => 2,
            AnalyzeError::Report(_) | AnalyzeError::Flame(_) => exitcode::SOFTWARE,
        }
    }
}

/// A result of an analysis.
pub type Result<T, E = AnalyzeError> = std::result::Result<T, E>;
