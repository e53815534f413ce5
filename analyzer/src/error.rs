//! What can go wrong in an analysis.

use std::path::PathBuf;

use vtrace_storage::disk::DiskError;

use crate::symbols::SymbolError;

#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error(transparent)]
    Trace(#[from] DiskError),
    #[error(transparent)]
    Symbols(#[from] SymbolError),
    #[error("{path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
    #[error("the trace has no readable steps{0}")]
    NoSteps(String),
    #[error("step {from} is past the trace's last step ({last})")]
    WindowOutside { from: u64, last: u64 },
    #[error("export: {0}")]
    Export(#[from] crate::export::ExportError),
    #[error("HTML report: {0}")]
    Report(String),
    #[error("flame graph: {0}")]
    Flame(String),
}

pub type Result<T, E = AnalyzeError> = std::result::Result<T, E>;
