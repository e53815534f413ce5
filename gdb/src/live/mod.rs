//! gdb on a running guest (`vtrace run --gdb`): a thread speaks the
//! protocol with gdb; the vCPU thread stops the guest where gdb asked
//! ([`GdbMonitor`], around the run's own monitor) and answers from the
//! stopped vCPU. A step gdb takes while the run traces is a step of the
//! trace: the tracer sees every exit as before.

mod link;
mod monitor;
mod target;
mod watch;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gdbstub::stub::DisconnectReason;

use link::{GdbEnd, VcpuEnd};
pub use monitor::GdbMonitor;
use target::LiveTarget;

use crate::serve::{bounded_stub, session_failure, Closer, Listen, Listener, PACKET_SIZE};
use crate::symbol_file::SymbolFile;
use crate::GdbError;

/// gdb's side of a run: the thread that waits for gdb and talks to it.
#[derive(Debug)]
pub struct LiveGdb {
    end: Option<VcpuEnd>,
    /// Kept while gdb may read it.
    symbols: Option<SymbolFile>,
    wait: bool,
    address: String,
    /// The Unix socket gdb connects to, removed when the run ends: here,
    /// since a gdb thread still waiting in accept never drops its Listener.
    socket: Option<PathBuf>,
    /// Whether gdb waits for the guest to stop ([`VcpuEnd::awaited`]).
    awaited: Arc<AtomicBool>,
    /// The connection, once gdb has made it.
    line: Arc<Line>,
    /// Told when the gdb thread is done.
    done: Receiver<()>,
}

/// The connection to gdb as the run's end sees it.
#[derive(Debug, Default)]
struct Line {
    /// Shuts it down; set once gdb connected.
    closer: Mutex<Option<Closer>>,
    /// The run's end closed it: the session's end is no failure to report.
    closed: AtomicBool,
}

/// How long the end of a run waits for gdb to hear of it.
const LAST_WORDS: Duration = Duration::from_secs(5);

impl LiveGdb {
    /// Listens at `listen` (binding now, so a taken address fails before
    /// the guest boots) and serves gdb from a thread once it connects;
    /// `wait`: the guest waits for gdb before its first instruction;
    /// `symbols`: what gdb loads as it connects.
    pub fn start(
        listen: &Listen,
        wait: bool,
        symbols: Option<SymbolFile>,
    ) -> Result<LiveGdb, GdbError> {
        let listener = Listener::bind(listen)?;
        let offered = symbols.as_ref().map(|s| s.path().to_path_buf());
        let address = listener.address().to_string();
        let socket = listener.socket_path().map(PathBuf::from);
        let (vcpu, gdb) = link::link();
        let awaited = Arc::clone(&vcpu.awaited);
        let line = Arc::new(Line::default());
        let (done_tx, done) = channel();
        let thread_line = Arc::clone(&line);
        std::thread::Builder::new()
            .name("gdb".into())
            .spawn(move || {
                let served = serve(&listener, gdb, wait, offered, &thread_line);
                if let (Err(e), false) = (served, thread_line.closed.load(Ordering::Acquire)) {
                    vtrace_vmm::user_message(&format!("vtrace: gdb: {e}"));
                }
                let _ = done_tx.send(());
            })
            .map_err(|e| GdbError::Listen {
                at: address.clone(),
                source: e,
            })?;
        Ok(LiveGdb {
            end: Some(vcpu),
            symbols,
            wait,
            address,
            socket,
            awaited,
            line,
            done,
        })
    }

    /// The address gdb connects to.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The symbol file gdb is offered, where there is one.
    pub fn symbols(&self) -> Option<&SymbolFile> {
        self.symbols.as_ref()
    }

    /// The run's monitor with gdb in charge of stopping it (once).
    pub fn monitor<'a>(
        &mut self,
        inner: &'a mut dyn vtrace_vmm::Monitor,
    ) -> Option<GdbMonitor<'a>> {
        let end = self.end.take()?;
        Some(GdbMonitor::new(inner, end, self.wait))
    }

    /// After the run: where gdb waits for the guest to stop, waits a
    /// little for it to hear how the run ended ([`GdbMonitor::ended`]);
    /// then closes the connection, and the Unix socket goes. A gdb that
    /// never connected, or that holds the guest, is not waited for.
    pub fn finish(self) {
        if self.awaited.load(Ordering::Acquire) {
            let _ = self.done.recv_timeout(LAST_WORDS);
        }
        self.line.closed.store(true, Ordering::Release);
        if let Some(closer) = self
            .line
            .closer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            closer.close();
        }
        if let Some(path) = &self.socket {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The gdb thread: one connection, served until gdb leaves or the guest
/// ends.
fn serve(
    listener: &Listener,
    end: GdbEnd,
    wait: bool,
    symbols: Option<PathBuf>,
    line: &Line,
) -> Result<(), GdbError> {
    let (conn, closer) = listener.accept()?;
    *line.closer.lock().unwrap_or_else(|e| e.into_inner()) = Some(closer);
    let mut target = LiveTarget::new(end, symbols);
    target
        .first_stop(!wait)
        .map_err(|e| GdbError::Protocol(e.to_string()))?;
    let mut buffer = [0; PACKET_SIZE];
    match bounded_stub(conn, &mut buffer)?.run_blocking::<target::LiveLoop>(&mut target) {
        Ok(DisconnectReason::Disconnect) => target.leave(false),
        Ok(DisconnectReason::Kill) => target.leave(true),
        Ok(DisconnectReason::TargetExited(_) | DisconnectReason::TargetTerminated(_)) => {}
        Err(e) => {
            target.leave(false);
            if let Some(failure) = session_failure(e) {
                return Err(failure);
            }
        }
    }
    Ok(())
}
