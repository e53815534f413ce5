//! The GDB remote protocol for vtrace (with the `gdbstub` crate): x86-64
//! as a whole machine (general, segment, control registers, FS and GS
//! bases); a running guest held for gdb (`vtrace run --gdb`); and a
//! recorded trace served as a target that runs both ways: `stepi`,
//! `reverse-stepi`, `continue` and `reverse-continue` to breakpoints,
//! registers and memory as the trace knows them at each step.

mod arch;
mod live;
mod playback;
mod serve;
mod symbol_file;
mod trace_target;

pub use arch::{Reg, RegisterFile, X86_64Machine};
pub use live::{GdbMonitor, LiveGdb};
pub use playback::serve_trace_bytes;
pub use serve::{serve_trace, Listen, Listener};
pub use symbol_file::SymbolFile;
pub use trace_target::TraceTarget;

use std::path::PathBuf;

/// What can go wrong serving gdb.
#[derive(Debug, thiserror::Error)]
pub enum GdbError {
    /// The address to listen on is neither a port, `HOST:PORT` nor a path.
    #[error(
        "`{0}` is not an address to listen on: give a port (1234, on 127.0.0.1), HOST:PORT, \
         or a Unix socket's path (one with a `/`)"
    )]
    BadAddress(String),
    /// Listening or accepting failed.
    #[error("listening for gdb on {at}: {source}")]
    Listen {
        /// Where.
        at: String,
        /// Why.
        source: std::io::Error,
    },
    /// The Unix socket's path is taken.
    #[error("{0} already exists: remove it, or name another socket")]
    SocketExists(PathBuf),
    /// The symbol file for gdb could not be written.
    #[error("writing the kernel's symbol file for gdb: {0}")]
    SymbolFile(std::io::Error),
    /// The session with gdb failed.
    #[error("the session with gdb failed: {0}")]
    Protocol(String),
}

impl GdbError {
    /// The status a command that fails with this error exits with, as
    /// sysexits.h names them (2 for an address that is none, the status of
    /// arguments clap refuses).
    pub fn exit_status(&self) -> i32 {
        match self {
            GdbError::BadAddress(_) => 2,
            GdbError::Listen { .. } | GdbError::SocketExists(_) | GdbError::SymbolFile(_) => {
                exitcode::CANTCREAT
            }
            GdbError::Protocol(_) => exitcode::SOFTWARE,
        }
    }
}
