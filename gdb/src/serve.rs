//! Where gdb connects (a TCP port on this machine or a Unix socket), and
//! the loop that answers it.

use std::fmt;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use gdbstub::conn::{Connection, ConnectionExt};
use gdbstub::stub::run_blocking::{BlockingEventLoop, Event, WaitForStopReasonError};
use gdbstub::stub::{GdbStub, GdbStubError, SingleThreadStopReason};
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

/// The warning for a gdb port others can reach: it reads and stops the
/// guest (and, live, all of its memory) with no password. QEMU's `-s`
/// listens on every interface silently; vtrace's default is loopback, so
/// one who names another address chose it, and is told what it gives.
fn exposure(ip: std::net::IpAddr) -> Option<String> {
    (!ip.is_loopback()).then(|| {
        format!(
            "vtrace: warning: gdb's port is open to other machines ({ip}): anyone who can \
             reach it reads guest memory and controls the guest, with no password; \
             listen on 127.0.0.1 (a bare port) or a Unix socket unless that is meant"
        )
    })
}

/// A connection to gdb.
pub(crate) type Conn = Box<dyn ConnectionExt<Error = std::io::Error>>;

/// A bound address, waiting for gdb.
#[derive(Debug)]
pub struct Listener {
    socket: Socket,
    /// The address, as gdb names it in `target remote`.
    address: String,
}

#[derive(Debug)]
enum Socket {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Binds `listen` (a TCP port 0 becomes the port the system chose).
    pub fn bind(listen: &Listen) -> Result<Listener, GdbError> {
        let io = |e| GdbError::Listen {
            at: listen.to_string(),
            source: e,
        };
        match listen {
            Listen::Tcp(addr) => {
                let listener = TcpListener::bind(addr).map_err(io)?;
                let local = listener.local_addr().map_err(io)?;
                if let Some(warning) = exposure(local.ip()) {
                    vtrace_vmm::user_message(&warning);
                }
                let address = local.to_string();
                Ok(Listener {
                    socket: Socket::Tcp(listener),
                    address,
                })
            }
            Listen::Unix(path) => {
                if path.exists() {
                    return Err(GdbError::SocketExists(path.clone()));
                }
                let listener = UnixListener::bind(path).map_err(io)?;
                Ok(Listener {
                    socket: Socket::Unix(listener, path.clone()),
                    address: path.display().to_string(),
                })
            }
        }
    }

    /// The address gdb connects to.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Waits for gdb to connect: the connection, and what shuts it down
    /// from another thread.
    pub(crate) fn accept(&self) -> Result<(Conn, Closer), GdbError> {
        let io = |e| GdbError::Listen {
            at: self.address.clone(),
            source: e,
        };
        match &self.socket {
            Socket::Tcp(listener) => {
                let (stream, _) = listener.accept().map_err(io)?;
                // gdb's packets are small and each waits for its answer.
                stream.set_nodelay(true).map_err(io)?;
                let closer = Closer::Tcp(stream.try_clone().map_err(io)?);
                Ok((Box::new(stream), closer))
            }
            Socket::Unix(listener, _) => {
                let (stream, _) = listener.accept().map_err(io)?;
                let closer = Closer::Unix(stream.try_clone().map_err(io)?);
                Ok((Box::new(stream), closer))
            }
        }
    }

    /// The Unix socket's path, where it listens on one.
    pub(crate) fn socket_path(&self) -> Option<&std::path::Path> {
        match &self.socket {
            Socket::Tcp(_) => None,
            Socket::Unix(_, path) => Some(path),
        }
    }
}

/// Shuts a connection to gdb down from another thread: a read blocked on
/// it returns.
#[derive(Debug)]
pub(crate) enum Closer {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Closer {
    /// Shuts the connection down (both ways).
    pub(crate) fn close(&self) {
        let _ = match self {
            Closer::Tcp(s) => s.shutdown(Shutdown::Both),
            Closer::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Socket::Unix(_, path) = &self.socket {
            let _ = std::fs::remove_file(path);
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

/// The longest packet taken from gdb, and the size gdb is told
/// (`PacketSize` in `qSupported`). gdbstub's own buffer grows with the
/// packet: a `$` with no `#` after it, from anyone who can reach the port,
/// would grow it without end.
pub(crate) const PACKET_SIZE: usize = 4096;

/// A stub on `conn` whose packets fit in `buffer` ([`PACKET_SIZE`]): a
/// longer one ends the session with an error.
pub(crate) fn bounded_stub<'a, T: Target>(
    conn: Conn,
    buffer: &'a mut [u8; PACKET_SIZE],
) -> Result<GdbStub<'a, T, Conn>, GdbError> {
    GdbStub::builder(conn)
        .with_packet_buffer(buffer)
        .build()
        .map_err(|e| GdbError::Protocol(e.to_string()))
}

/// Waits for gdb on `listener` and answers it until it detaches or kills
/// the session.
pub fn serve_trace(target: &mut TraceTarget, listener: &Listener) -> Result<(), GdbError> {
    let (conn, _) = listener.accept()?;
    serve_trace_on(target, conn)
}

/// Answers gdb on `conn` until it detaches or kills the session.
pub(crate) fn serve_trace_on(target: &mut TraceTarget, conn: Conn) -> Result<(), GdbError> {
    let mut buffer = [0; PACKET_SIZE];
    match bounded_stub(conn, &mut buffer)?.run_blocking::<TraceLoop>(target) {
        Ok(_) => Ok(()),
        Err(e) => session_failure(e).map_or(Ok(()), Err),
    }
}

/// What a session that ended in `error` failed of, or None where gdb hung
/// up (its `disconnect`, or its process gone): that ends a session as a
/// detach does, said on stderr.
pub(crate) fn session_failure<T: fmt::Display>(
    error: GdbStubError<T, std::io::Error>,
) -> Option<GdbError> {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
    let text = error.to_string();
    match error.into_connection_error() {
        Some((e, _)) if matches!(e.kind(), UnexpectedEof | ConnectionReset | BrokenPipe) => {
            vtrace_vmm::user_message("vtrace: gdb disconnected");
            None
        }
        _ => Some(GdbError::Protocol(text)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_port_off_loopback_is_warned_of() {
        assert!(exposure("127.0.0.1".parse().unwrap()).is_none());
        assert!(exposure("::1".parse().unwrap()).is_none());
        assert!(exposure("0.0.0.0".parse().unwrap()).is_some());
        assert!(exposure("192.168.1.5".parse().unwrap()).is_some());
    }
}
