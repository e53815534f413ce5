//! What the gdb thread and the vCPU thread say to each other while gdb
//! debugs a running guest. The vCPU thread holds the guest; the gdb thread
//! speaks the protocol and asks it.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use gdbstub::target::ext::breakpoints::WatchKind;

use super::watch::LiveWatch;
use crate::arch::RegisterFile;

/// Why the guest stopped for gdb.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Before its first instruction (`--gdb-wait`), or where gdb attached.
    Attached,
    /// gdb's single step is done.
    Step,
    /// It reached one of gdb's breakpoints.
    Breakpoint,
    /// The instruction just run touched one of gdb's watchpoints.
    Watch {
        /// The watchpoint's address.
        addr: u64,
        /// Its kind.
        kind: WatchKind,
    },
    /// gdb interrupted it (Ctrl-C).
    Interrupted,
}

/// What gdb asks of the stopped guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Its registers.
    Registers,
    /// `len` bytes of memory at linear address `addr`, through its page
    /// tables.
    Memory {
        /// The first byte's address.
        addr: u64,
        /// How many.
        len: usize,
    },
    /// The addresses to break at from now on.
    Breakpoints(Vec<u64>),
    /// The memory to watch from now on.
    Watchpoints(Vec<LiveWatch>),
    /// Run on until the next stop.
    Continue,
    /// Run one instruction.
    Step,
    /// gdb is gone: run on, without its breakpoints.
    Detach,
    /// gdb killed the session: end the run.
    Kill,
}

/// What the vCPU thread answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The guest stopped.
    Stopped(Stop),
    /// Its registers.
    Registers(Box<RegisterFile>),
    /// The bytes of memory that could be read (fewer than asked where a
    /// page is not mapped).
    Memory(Vec<u8>),
    /// The breakpoints or watchpoints are set; or why not.
    Set(Result<(), String>),
    /// The guest ended with this status.
    Exited(u8),
    /// The run was ended by this stop signal (SIGINT, SIGTERM, SIGHUP).
    Terminated(i32),
}

/// The vCPU thread's end.
#[derive(Debug)]
pub struct VcpuEnd {
    /// gdb's requests.
    pub requests: Receiver<Request>,
    /// The answers.
    pub replies: Sender<Reply>,
    /// Set by the gdb thread to have the guest stop at its next exit.
    pub interrupt: Arc<AtomicBool>,
    /// Set while gdb waits for the guest to stop (it runs on gdb's
    /// `continue` or `stepi`): only then can gdb be told how the run ended.
    pub awaited: Arc<AtomicBool>,
}

/// The gdb thread's end.
#[derive(Debug)]
pub struct GdbEnd {
    /// To the vCPU thread.
    pub requests: Sender<Request>,
    /// From it.
    pub replies: Receiver<Reply>,
    /// See [`VcpuEnd::interrupt`].
    pub interrupt: Arc<AtomicBool>,
}

/// A connected pair.
pub fn link() -> (VcpuEnd, GdbEnd) {
    let (requests_tx, requests_rx) = std::sync::mpsc::channel();
    let (replies_tx, replies_rx) = std::sync::mpsc::channel();
    let interrupt = Arc::new(AtomicBool::new(false));
    (
        VcpuEnd {
            requests: requests_rx,
            replies: replies_tx,
            interrupt: Arc::clone(&interrupt),
            awaited: Arc::new(AtomicBool::new(false)),
        },
        GdbEnd {
            requests: requests_tx,
            replies: replies_rx,
            interrupt,
        },
    )
}
