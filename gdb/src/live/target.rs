//! The gdb thread's target: each of gdb's questions passed to the vCPU
//! thread, which holds the stopped guest.

use std::sync::atomic::Ordering;
use std::time::Duration;

use gdbstub::common::Signal;
use gdbstub::conn::{Connection, ConnectionExt};
use gdbstub::stub::run_blocking::{BlockingEventLoop, Event, WaitForStopReasonError};
use gdbstub::stub::SingleThreadStopReason;
use gdbstub::target::ext::base::singlethread::{
    SingleThreadBase, SingleThreadResume, SingleThreadResumeOps, SingleThreadSingleStep,
    SingleThreadSingleStepOps,
};
use gdbstub::target::ext::base::BaseOps;
use gdbstub::target::ext::breakpoints::{
    Breakpoints, BreakpointsOps, HwBreakpoint, HwBreakpointOps, HwWatchpoint, HwWatchpointOps,
    SwBreakpoint, SwBreakpointOps, WatchKind,
};
use gdbstub::target::ext::exec_file::{ExecFile, ExecFileOps};
use gdbstub::target::{Target, TargetError, TargetResult};

use super::link::{GdbEnd, Reply, Request, Stop};
use super::watch::LiveWatch;
use crate::arch::{RegisterFile, X86_64Machine};
use crate::serve::Conn;

/// Why the session with the guest ended on the vCPU's side.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The run ended (or failed) while gdb waited for it.
    #[error("the run ended")]
    RunEnded,
    /// The vCPU thread answered something gdb did not ask for.
    #[error("unexpected answer from the vCPU: {0}")]
    Unexpected(String),
}

/// A running guest as gdb's target.
#[derive(Debug)]
pub struct LiveTarget {
    end: GdbEnd,
    breakpoints: Vec<u64>,
    watches: Vec<LiveWatch>,
    /// The file gdb loads symbols from when it has none.
    symbols: Option<std::path::PathBuf>,
}

impl LiveTarget {
    /// A target whose guest the vCPU thread holds at the other end.
    pub fn new(end: GdbEnd, symbols: Option<std::path::PathBuf>) -> LiveTarget {
        LiveTarget {
            end,
            breakpoints: Vec::new(),
            watches: Vec::new(),
            symbols,
        }
    }

    fn ask(&self, request: Request) -> Result<Reply, LiveError> {
        self.end
            .requests
            .send(request)
            .map_err(|_| LiveError::RunEnded)?;
        self.end.replies.recv().map_err(|_| LiveError::RunEnded)
    }

    /// Tells the vCPU thread to go on without gdb, or to end the run.
    pub fn leave(&self, kill: bool) {
        let _ = self
            .end
            .requests
            .send(if kill { Request::Kill } else { Request::Detach });
    }

    /// Waits for the guest's first stop (gdb talks to a stopped guest);
    /// `interrupt`: asks it to stop where it runs (else it waits already).
    pub fn first_stop(&self, interrupt: bool) -> Result<(), LiveError> {
        if interrupt {
            self.end.interrupt.store(true, Ordering::Relaxed);
        }
        match self.end.replies.recv() {
            Ok(Reply::Stopped(_)) => Ok(()),
            Ok(other) => Err(LiveError::Unexpected(format!("{other:?}"))),
            Err(_) => Err(LiveError::RunEnded),
        }
    }

    /// Asks the vCPU thread to take gdb's breakpoints or watchpoints:
    /// false (gdb says so) where it cannot.
    fn update(&mut self, request: Request) -> TargetResult<bool, Self> {
        match self.ask(request) {
            Ok(Reply::Set(Ok(()))) => Ok(true),
            Ok(Reply::Set(Err(why))) => {
                vtrace_vmm::user_message(&format!("vtrace: gdb: {why}"));
                Ok(false)
            }
            Ok(other) => Err(TargetError::Fatal(LiveError::Unexpected(format!(
                "{other:?}"
            )))),
            Err(e) => Err(TargetError::Fatal(e)),
        }
    }

    fn change(&mut self, addr: u64, add: bool) -> TargetResult<bool, Self> {
        let before = self.breakpoints.clone();
        if add && !self.breakpoints.contains(&addr) {
            self.breakpoints.push(addr);
        } else if !add {
            self.breakpoints.retain(|&a| a != addr);
        }
        let done = self.update(Request::Breakpoints(self.breakpoints.clone()))?;
        if !done {
            self.breakpoints = before;
        }
        Ok(done)
    }

    fn change_watch(&mut self, watch: LiveWatch, add: bool) -> TargetResult<bool, Self> {
        let before = self.watches.clone();
        if add && !self.watches.contains(&watch) {
            self.watches.push(watch);
        } else if !add {
            self.watches.retain(|w| *w != watch);
        }
        let done = self.update(Request::Watchpoints(self.watches.clone()))?;
        if !done {
            self.watches = before;
        }
        Ok(done)
    }
}

impl Target for LiveTarget {
    type Arch = X86_64Machine;
    type Error = LiveError;

    fn base_ops(&mut self) -> BaseOps<'_, Self::Arch, Self::Error> {
        BaseOps::SingleThread(self)
    }

    fn support_breakpoints(&mut self) -> Option<BreakpointsOps<'_, Self>> {
        Some(self)
    }

    fn support_exec_file(&mut self) -> Option<ExecFileOps<'_, Self>> {
        self.symbols.is_some().then_some(self)
    }
}

impl ExecFile for LiveTarget {
    fn get_exec_file(
        &self,
        _pid: Option<gdbstub::common::Pid>,
        offset: u64,
        length: usize,
        buf: &mut [u8],
    ) -> TargetResult<usize, Self> {
        let path = self.symbols.as_ref().ok_or(TargetError::NonFatal)?;
        Ok(crate::symbol_file::read_name(path, offset, length, buf))
    }
}

impl SingleThreadBase for LiveTarget {
    fn read_registers(&mut self, regs: &mut RegisterFile) -> TargetResult<(), Self> {
        match self.ask(Request::Registers).map_err(TargetError::Fatal)? {
            Reply::Registers(file) => {
                *regs = *file;
                Ok(())
            }
            other => Err(TargetError::Fatal(LiveError::Unexpected(format!(
                "{other:?}"
            )))),
        }
    }

    fn write_registers(&mut self, _regs: &RegisterFile) -> TargetResult<(), Self> {
        // Changing the guest's state would make its trace a lie.
        Err(TargetError::NonFatal)
    }

    fn read_addrs(&mut self, start: u64, data: &mut [u8]) -> TargetResult<usize, Self> {
        let request = Request::Memory {
            addr: start,
            len: data.len(),
        };
        match self.ask(request).map_err(TargetError::Fatal)? {
            Reply::Memory(bytes) if bytes.is_empty() && !data.is_empty() => {
                Err(TargetError::NonFatal)
            }
            Reply::Memory(bytes) => {
                let n = bytes.len().min(data.len());
                data[..n].copy_from_slice(&bytes[..n]);
                Ok(n)
            }
            other => Err(TargetError::Fatal(LiveError::Unexpected(format!(
                "{other:?}"
            )))),
        }
    }

    fn write_addrs(&mut self, _start: u64, _data: &[u8]) -> TargetResult<(), Self> {
        Err(TargetError::NonFatal)
    }

    fn support_resume(&mut self) -> Option<SingleThreadResumeOps<'_, Self>> {
        Some(self)
    }
}

impl SingleThreadResume for LiveTarget {
    fn resume(&mut self, _signal: Option<Signal>) -> Result<(), Self::Error> {
        self.end
            .requests
            .send(Request::Continue)
            .map_err(|_| LiveError::RunEnded)
    }

    fn support_single_step(&mut self) -> Option<SingleThreadSingleStepOps<'_, Self>> {
        Some(self)
    }
}

impl SingleThreadSingleStep for LiveTarget {
    fn step(&mut self, _signal: Option<Signal>) -> Result<(), Self::Error> {
        self.end
            .requests
            .send(Request::Step)
            .map_err(|_| LiveError::RunEnded)
    }
}

impl Breakpoints for LiveTarget {
    fn support_sw_breakpoint(&mut self) -> Option<SwBreakpointOps<'_, Self>> {
        Some(self)
    }

    fn support_hw_breakpoint(&mut self) -> Option<HwBreakpointOps<'_, Self>> {
        Some(self)
    }

    fn support_hw_watchpoint(&mut self) -> Option<HwWatchpointOps<'_, Self>> {
        Some(self)
    }
}

impl HwWatchpoint for LiveTarget {
    fn add_hw_watchpoint(
        &mut self,
        addr: u64,
        len: u64,
        kind: WatchKind,
    ) -> TargetResult<bool, Self> {
        self.change_watch(LiveWatch { addr, len, kind }, true)
    }

    fn remove_hw_watchpoint(
        &mut self,
        addr: u64,
        len: u64,
        kind: WatchKind,
    ) -> TargetResult<bool, Self> {
        self.change_watch(LiveWatch { addr, len, kind }, false)
    }
}

// Both kinds are the debug registers (or, while the run steps, a pc
// compared after each step): the guest's memory is never written.
impl SwBreakpoint for LiveTarget {
    fn add_sw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        self.change(addr, true)
    }

    fn remove_sw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        self.change(addr, false)
    }
}

impl HwBreakpoint for LiveTarget {
    fn add_hw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        self.change(addr, true)
    }

    fn remove_hw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        self.change(addr, false)
    }
}

/// How often the gdb thread looks for gdb's Ctrl-C while the guest runs.
const POLL: Duration = Duration::from_millis(20);

pub(crate) enum LiveLoop {}

impl BlockingEventLoop for LiveLoop {
    type Target = LiveTarget;
    type Connection = Conn;
    type StopReason = SingleThreadStopReason<u64>;

    fn wait_for_stop_reason(
        target: &mut LiveTarget,
        conn: &mut Conn,
    ) -> Result<
        Event<Self::StopReason>,
        WaitForStopReasonError<<LiveTarget as Target>::Error, <Conn as Connection>::Error>,
    > {
        loop {
            match target.end.replies.recv_timeout(POLL) {
                Ok(Reply::Stopped(stop)) => {
                    return Ok(Event::TargetStopped(match stop {
                        Stop::Step => SingleThreadStopReason::DoneStep,
                        Stop::Breakpoint => SingleThreadStopReason::HwBreak(()),
                        Stop::Watch { addr, kind } => SingleThreadStopReason::Watch {
                            tid: (),
                            kind,
                            addr,
                        },
                        Stop::Attached | Stop::Interrupted => {
                            SingleThreadStopReason::Signal(Signal::SIGINT)
                        }
                    }))
                }
                Ok(Reply::Exited(status)) => {
                    return Ok(Event::TargetStopped(SingleThreadStopReason::Exited(status)))
                }
                Ok(Reply::Terminated(signal)) => {
                    let signal = Signal(u8::try_from(signal).unwrap_or(Signal::SIGTERM.0));
                    return Ok(Event::TargetStopped(SingleThreadStopReason::Terminated(
                        signal,
                    )));
                }
                Ok(other) => {
                    return Err(WaitForStopReasonError::Target(LiveError::Unexpected(
                        format!("{other:?}"),
                    )))
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(WaitForStopReasonError::Target(LiveError::RunEnded))
                }
            }
            if conn.peek().map(|b| b.is_some()).unwrap_or(true) {
                let byte = conn.read().map_err(WaitForStopReasonError::Connection)?;
                return Ok(Event::IncomingData(byte));
            }
        }
    }

    fn on_interrupt(
        target: &mut LiveTarget,
    ) -> Result<Option<Self::StopReason>, <LiveTarget as Target>::Error> {
        // The guest stops at its next exit; its stop comes through
        // wait_for_stop_reason.
        target.end.interrupt.store(true, Ordering::Relaxed);
        Ok(None)
    }
}
