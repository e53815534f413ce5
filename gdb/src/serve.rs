//! Where gdb connects (a TCP port on this machine or a Unix socket), and
//! the loop that answers it.

use std::fmt;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use gdbstub::conn::{Connection, ConnectionExt};
use gdbstub::stub::run_blocking::{BlockingEventLoop, Event, WaitForStopReasonError};
use gdbstub::stub::{DisconnectReason, GdbStub, SingleThreadStopReason};
use gdbstub::target::Target;

use crate::trace_target::TraceTarget;
use crate::GdbError;

/// Where to wait for gdb.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A TCP address (`127.0.0.1:1234`; a bare port is on 127.0.0.1).
    Tcp(String),
    /// A Unix socket's path.
    Unix(PathBuf),
}

impl Listen {
    /// `PORT`, `HOST:PORT`, or a path (it holds a `/`).
    pub fn parse(text: &str) -> Result<Listen, GdbError> {
        if text.contains('/') {
            return Ok(Listen::Unix(PathBuf::from(text)));
        }
        if text.parse::<u16>().is_ok() {
            return Ok(Listen::Tcp(format!("127.0.0.1:{text}")));
        }
        match text.rsplit_once(':') {
            Some((_, port)) if port.parse::<u16>().is_ok() => Ok(Listen::Tcp(text.to_string())),
            _ => Err(GdbError::BadAddress(text.to_string())),
        }
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Tcp(a) => write!(f, "{a}"),
            Listen::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

type Conn = Box<dyn ConnectionExt<Error = std::io::Error>>;

/// Waits for gdb at `listen`; `bound` is told the address it listens on
/// (a TCP port 0 becomes the port the system chose) before it waits.
pub fn accept(listen: &Listen, bound: impl FnOnce(&str)) -> Result<Conn, GdbError> {
    let io = |e| GdbError::Listen {
        at: listen.to_string(),
        source: e,
    };
    match listen {
        Listen::Tcp(addr) => {
            let listener = TcpListener::bind(addr).map_err(io)?;
            let at = listener.local_addr().map_err(io)?;
            bound(&at.to_string());
            let (stream, _) = listener.accept().map_err(io)?;
            // gdb's packets are small and each waits for its answer.
            stream.set_nodelay(true).map_err(io)?;
            Ok(Box::new(stream))
        }
        Listen::Unix(path) => {
            if path.exists() {
                return Err(GdbError::SocketExists(path.clone()));
            }
            let listener = UnixListener::bind(path).map_err(io)?;
            bound(&path.display().to_string());
            let accepted = listener.accept();
            let _ = std::fs::remove_file(path);
            let (stream, _) = accepted.map_err(io)?;
            Ok(Box::new(stream))
        }
    }
}

enum TraceLoop {}

impl BlockingEventLoop for TraceLoop {
    type Target = TraceTarget;
    type Connection = Conn;
    type StopReason = SingleThreadStopReason<u64>;

    fn wait_for_stop_reason(
        target: &mut TraceTarget,
        _conn: &mut Conn,
    ) -> Result<
        Event<Self::StopReason>,
        WaitForStopReasonError<<TraceTarget as Target>::Error, <Conn as Connection>::Error>,
    > {
        // A search over a trace ends on its own, soon: an interrupt from
        // gdb waits for it.
        target
            .run()
            .map(Event::TargetStopped)
            .map_err(WaitForStopReasonError::Target)
    }

    fn on_interrupt(
        _target: &mut TraceTarget,
    ) -> Result<Option<Self::StopReason>, <TraceTarget as Target>::Error> {
        Ok(Some(SingleThreadStopReason::Signal(
            gdbstub::common::Signal::SIGINT,
        )))
    }
}

/// Answers gdb on `conn` until it detaches or kills the session.
pub fn serve_trace(target: &mut TraceTarget, conn: Conn) -> Result<(), GdbError> {
    match GdbStub::new(conn).run_blocking::<TraceLoop>(target) {
        Ok(DisconnectReason::Disconnect | DisconnectReason::Kill) => Ok(()),
        Ok(DisconnectReason::TargetExited(_) | DisconnectReason::TargetTerminated(_)) => Ok(()),
        Err(e) => Err(GdbError::Protocol(e.to_string())),
    }
}
