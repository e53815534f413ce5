//! gdb on a running guest (`vtrace run --gdb`): a thread speaks the
//! protocol with gdb; the vCPU thread stops the guest where gdb asked
//! ([`GdbMonitor`], around the run's own monitor) and answers from the
//! stopped vCPU. A step gdb takes while the run traces is a step of the
//! trace: the tracer sees every exit as before.

mod link;
mod monitor;
mod target;
mod watch;

use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use gdbstub::stub::{DisconnectReason, GdbStub};

use link::{GdbEnd, VcpuEnd};
pub use monitor::GdbMonitor;
use target::LiveTarget;

use crate::serve::{Listen, Listener};
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
    /// Told when the gdb thread is done.
    done: Receiver<()>,
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
        let (vcpu, gdb) = link::link();
        let (done_tx, done) = channel();
        std::thread::Builder::new()
            .name("gdb".into())
            .spawn(move || {
                if let Err(e) = serve(&listener, gdb, wait, offered) {
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

    /// After the run: waits a little for gdb to hear how it ended.
    pub fn finish(self) {
        let _ = self.done.recv_timeout(LAST_WORDS);
    }
}

/// The gdb thread: one connection, served until gdb leaves or the guest
/// ends.
fn serve(
    listener: &Listener,
    end: GdbEnd,
    wait: bool,
    symbols: Option<std::path::PathBuf>,
) -> Result<(), GdbError> {
    let conn = listener.accept()?;
    let mut target = LiveTarget::new(end, symbols);
    target
        .first_stop(!wait)
        .map_err(|e| GdbError::Protocol(e.to_string()))?;
    match GdbStub::new(conn).run_blocking::<target::LiveLoop>(&mut target) {
        Ok(DisconnectReason::Disconnect) => target.leave(false),
        Ok(DisconnectReason::Kill) => target.leave(true),
        Ok(DisconnectReason::TargetExited(_) | DisconnectReason::TargetTerminated(_)) => {}
        Err(e) => {
            target.leave(false);
            return Err(GdbError::Protocol(e.to_string()));
        }
    }
    Ok(())
}
