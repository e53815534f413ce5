//! gdb over a recorded trace: stepping and continuing both ways, with
//! breakpoints, registers and memory as the trace knows them at each step.

use gdbstub::common::Signal;
use gdbstub::outputln;
use gdbstub::stub::SingleThreadStopReason;
use gdbstub::target::ext::base::reverse_exec::{
    ReplayLogPosition, ReverseCont, ReverseContOps, ReverseStep, ReverseStepOps,
};
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
use gdbstub::target::ext::monitor_cmd::{ConsoleOutput, MonitorCmd, MonitorCmdOps};
use gdbstub::target::{Target, TargetError, TargetResult};
use vtrace_analyzer::{AnalyzeError, Direction, Position, Replay, Watch};

use crate::arch::{Reg, RegisterFile, X86_64Machine};

/// Why a motion stopped.
#[derive(Clone, Copy, Debug)]
enum Stopped {
    Step,
    Breakpoint,
    /// A watched access: the watch's address and kind.
    Watch(u64, WatchKind),
}

/// What gdb asked for last, done when the stub waits for a stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Motion {
    Continue,
    Step,
    ReverseContinue,
    ReverseStep,
}

/// A trace as a gdb target: one thread, the CPU followed, standing at one
/// of its steps.
#[derive(Debug)]
pub struct TraceTarget {
    replay: Replay,
    at: Position,
    breakpoints: Vec<u64>,
    /// gdb's watchpoints, each with the kind gdb asked for.
    watches: Vec<(Watch, WatchKind)>,
    motion: Option<Motion>,
    /// The file gdb loads symbols from when it has none (its exec-file).
    symbols: Option<std::path::PathBuf>,
}

impl TraceTarget {
    /// A target standing at `at`.
    pub fn new(replay: Replay, at: Position) -> TraceTarget {
        TraceTarget {
            replay,
            at,
            breakpoints: Vec::new(),
            watches: Vec::new(),
            motion: None,
            symbols: None,
        }
    }

    /// Offers gdb `file` to load its symbols from, where it was given
    /// none (gdb asks for the program it debugs as it connects).
    pub fn offer_symbols(&mut self, file: std::path::PathBuf) {
        self.symbols = Some(file);
    }

    /// The step it stands at.
    pub fn step(&mut self) -> Result<u64, AnalyzeError> {
        self.replay.step_of(self.at)
    }

    /// Does what gdb asked for last: where it stops, and why.
    pub fn run(&mut self) -> Result<SingleThreadStopReason<u64>, AnalyzeError> {
        let Some(motion) = self.motion.take() else {
            return Ok(SingleThreadStopReason::DoneStep);
        };
        let (found, direction) = match motion {
            Motion::Step => (
                self.replay.next(self.at).map(|p| (p, Stopped::Step)),
                Direction::Forward,
            ),
            Motion::ReverseStep => (
                self.replay.prev(self.at).map(|p| (p, Stopped::Step)),
                Direction::Backward,
            ),
            Motion::Continue => (self.run_to(Direction::Forward)?, Direction::Forward),
            Motion::ReverseContinue => (self.run_to(Direction::Backward)?, Direction::Backward),
        };
        match (found, direction) {
            (Some((at, why)), _) => {
                self.at = at;
                Ok(match why {
                    Stopped::Step => SingleThreadStopReason::DoneStep,
                    Stopped::Breakpoint => SingleThreadStopReason::SwBreak(()),
                    Stopped::Watch(addr, kind) => SingleThreadStopReason::Watch {
                        tid: (),
                        kind,
                        addr,
                    },
                })
            }
            // The end of the trace: where gdb stands is its last step
            // (or first), and gdb says there is no more history.
            (None, Direction::Forward) => {
                if let Some(last) = self.replay.last() {
                    self.at = last;
                }
                Ok(SingleThreadStopReason::ReplayLog {
                    tid: None,
                    pos: ReplayLogPosition::End,
                })
            }
            (None, Direction::Backward) => {
                if let Some(first) = self.replay.first() {
                    self.at = first;
                }
                Ok(SingleThreadStopReason::ReplayLog {
                    tid: None,
                    pos: ReplayLogPosition::Begin,
                })
            }
        }
    }

    /// The nearest stop in `direction`: a breakpoint's step, or where a
    /// watched access leaves the guest (going back: the accessing step).
    fn run_to(
        &mut self,
        direction: Direction,
    ) -> Result<Option<(Position, Stopped)>, AnalyzeError> {
        let breakpoint = self.replay.find(self.at, direction, &self.breakpoints)?;
        let watched = match self.watches.is_empty() {
            true => None,
            false => {
                let watches: Vec<Watch> = self.watches.iter().map(|w| w.0).collect();
                self.replay.find_access(self.at, direction, &watches)?
            }
        };
        let Some((at, addr)) = watched else {
            return Ok(breakpoint.map(|p| (p, Stopped::Breakpoint)));
        };
        let kind = self
            .watches
            .iter()
            .find(|w| w.0.addr == addr)
            .map_or(WatchKind::Write, |w| w.1);
        let watch = (at, Stopped::Watch(addr, kind));
        Ok(Some(match breakpoint {
            Some(b) if (direction == Direction::Forward) == (b < at) => (b, Stopped::Breakpoint),
            _ => watch,
        }))
    }

    fn registers(&mut self) -> Result<RegisterFile, AnalyzeError> {
        let state = self.replay.state(self.at)?;
        let mut file = RegisterFile::default();
        for (n, value) in state.gpr.iter().enumerate() {
            file.set(Reg::Gpr(n), *value);
        }
        file.set(Reg::Rip, Some(state.pc));
        file.set(Reg::Eflags, state.rflags);
        file.set(Reg::Cr0, state.cr0);
        file.set(Reg::Cr3, Some(state.cr3));
        file.set(Reg::Cr4, state.cr4);
        file.set(Reg::Efer, state.efer);
        Ok(file)
    }

    /// `monitor` commands: where in the trace gdb stands, and going to a
    /// step.
    fn monitor(&mut self, command: &str, out: &mut ConsoleOutput<'_>) -> Result<(), AnalyzeError> {
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.as_slice() {
            ["when"] => {
                let step = self.step()?;
                outputln!(out, "step {step}");
            }
            ["goto", n] => match n.parse::<u64>() {
                Ok(n) => match self.replay.at_step(n)? {
                    Some(at) => {
                        self.at = at;
                        let step = self.step()?;
                        outputln!(
                            out,
                            "at step {step}; run `maintenance flush register-cache` so gdb \
                             reads the registers again"
                        );
                    }
                    None => outputln!(out, "step {n} is past the trace's last step"),
                },
                Err(_) => outputln!(out, "`{n}` is not a step number"),
            },
            ["info"] => {
                let (first, end) = self.replay.step_range();
                let step = self.step()?;
                outputln!(
                    out,
                    "trace {}: steps {first} to {}; at step {step}; {} memory accesses indexed",
                    self.replay.trace().path().display(),
                    end.saturating_sub(1),
                    self.replay.accesses()
                );
            }
            _ => outputln!(
                out,
                "vtrace monitor commands: `when` (the step gdb stands at), `goto N` (stand at \
                 step N), `info` (the trace)"
            ),
        }
        Ok(())
    }
}

impl Target for TraceTarget {
    type Arch = X86_64Machine;
    type Error = AnalyzeError;

    fn base_ops(&mut self) -> BaseOps<'_, Self::Arch, Self::Error> {
        BaseOps::SingleThread(self)
    }

    fn support_breakpoints(&mut self) -> Option<BreakpointsOps<'_, Self>> {
        Some(self)
    }

    fn support_monitor_cmd(&mut self) -> Option<MonitorCmdOps<'_, Self>> {
        Some(self)
    }

    fn support_exec_file(&mut self) -> Option<ExecFileOps<'_, Self>> {
        self.symbols.is_some().then_some(self)
    }
}

impl ExecFile for TraceTarget {
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

impl SingleThreadBase for TraceTarget {
    fn read_registers(&mut self, regs: &mut RegisterFile) -> TargetResult<(), Self> {
        *regs = self.registers().map_err(TargetError::Fatal)?;
        Ok(())
    }

    fn write_registers(&mut self, _regs: &RegisterFile) -> TargetResult<(), Self> {
        // A recorded trace cannot be changed.
        Err(TargetError::NonFatal)
    }

    fn read_addrs(&mut self, start: u64, data: &mut [u8]) -> TargetResult<usize, Self> {
        let known = self
            .replay
            .read_memory(self.at, start, data)
            .map_err(TargetError::Fatal)?;
        if known == 0 && !data.is_empty() {
            // gdb: "Cannot access memory at address ...".
            return Err(TargetError::NonFatal);
        }
        Ok(known)
    }

    fn write_addrs(&mut self, _start: u64, _data: &[u8]) -> TargetResult<(), Self> {
        Err(TargetError::NonFatal)
    }

    fn support_resume(&mut self) -> Option<SingleThreadResumeOps<'_, Self>> {
        Some(self)
    }
}

impl SingleThreadResume for TraceTarget {
    fn resume(&mut self, _signal: Option<Signal>) -> Result<(), Self::Error> {
        self.motion = Some(Motion::Continue);
        Ok(())
    }

    fn support_single_step(&mut self) -> Option<SingleThreadSingleStepOps<'_, Self>> {
        Some(self)
    }

    fn support_reverse_step(&mut self) -> Option<ReverseStepOps<'_, (), Self>> {
        Some(self)
    }

    fn support_reverse_cont(&mut self) -> Option<ReverseContOps<'_, (), Self>> {
        Some(self)
    }
}

impl SingleThreadSingleStep for TraceTarget {
    fn step(&mut self, _signal: Option<Signal>) -> Result<(), Self::Error> {
        self.motion = Some(Motion::Step);
        Ok(())
    }
}

impl ReverseStep<()> for TraceTarget {
    fn reverse_step(&mut self, _tid: ()) -> Result<(), Self::Error> {
        self.motion = Some(Motion::ReverseStep);
        Ok(())
    }
}

impl ReverseCont<()> for TraceTarget {
    fn reverse_cont(&mut self) -> Result<(), Self::Error> {
        self.motion = Some(Motion::ReverseContinue);
        Ok(())
    }
}

impl Breakpoints for TraceTarget {
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

// A watchpoint is found in the trace's index of memory accesses: the
// accesses whose address the registers before the step give (those of a
// handler's first step, whose stack the interrupt moved, are not there).
impl HwWatchpoint for TraceTarget {
    fn add_hw_watchpoint(
        &mut self,
        addr: u64,
        len: u64,
        kind: WatchKind,
    ) -> TargetResult<bool, Self> {
        if let Some(why) = refused_watch(len, kind) {
            vtrace_vmm::user_message(&format!("vtrace: gdb: {why}"));
            return Ok(false);
        }
        let watch = Watch {
            addr,
            len,
            stores: matches!(kind, WatchKind::Write | WatchKind::ReadWrite),
            loads: matches!(kind, WatchKind::Read | WatchKind::ReadWrite),
        };
        if !self.watches.contains(&(watch, kind)) {
            self.watches.push((watch, kind));
        }
        Ok(true)
    }

    fn remove_hw_watchpoint(
        &mut self,
        addr: u64,
        len: u64,
        kind: WatchKind,
    ) -> TargetResult<bool, Self> {
        let had = self.watches.len();
        self.watches
            .retain(|(w, k)| !(w.addr == addr && w.len == len && *k == kind));
        Ok(self.watches.len() != had)
    }
}

/// The longest value gdb reads by default (its `max-value-size`).
const GDB_MAX_VALUE: u64 = 64 * 1024;

/// Why a watchpoint is refused, if it is.
///
/// A write watch tells gdb only that something was stored; gdb then
/// compares the old and the new value, and one longer than its
/// `max-value-size` it cannot read, so it takes every store for "no
/// change" and resumes by itself, once per store in the trace: a
/// `continue` over a gigabyte's watch makes tens of thousands of round
/// trips and seems to hang. Reads and accesses have no value to compare,
/// so they stop at the first hit whatever the length.
fn refused_watch(len: u64, kind: WatchKind) -> Option<String> {
    (kind == WatchKind::Write && len > GDB_MAX_VALUE).then(|| {
        format!(
            "a write watchpoint over {len:#x} bytes is refused: gdb compares \
             the watched value before and after each store and cannot read one \
             over {GDB_MAX_VALUE:#x} bytes; watch a smaller range, or use \
             `awatch` (stops at every access, whatever its length)"
        )
    })
}

impl TraceTarget {
    fn add(&mut self, addr: u64) -> bool {
        if !self.breakpoints.contains(&addr) {
            self.breakpoints.push(addr);
        }
        true
    }

    fn remove(&mut self, addr: u64) -> bool {
        let had = self.breakpoints.len();
        self.breakpoints.retain(|&a| a != addr);
        self.breakpoints.len() != had
    }
}

// In a trace a software and a hardware breakpoint are the same thing: a
// step at the address.
impl SwBreakpoint for TraceTarget {
    fn add_sw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        Ok(self.add(addr))
    }

    fn remove_sw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        Ok(self.remove(addr))
    }
}

impl HwBreakpoint for TraceTarget {
    fn add_hw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        Ok(self.add(addr))
    }

    fn remove_hw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        Ok(self.remove(addr))
    }
}

impl MonitorCmd for TraceTarget {
    fn handle_monitor_cmd(
        &mut self,
        cmd: &[u8],
        mut out: ConsoleOutput<'_>,
    ) -> Result<(), Self::Error> {
        let command = String::from_utf8_lossy(cmd);
        self.monitor(&command, &mut out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_write_watch_past_gdbs_value_size_is_refused() {
        assert!(refused_watch(GDB_MAX_VALUE, WatchKind::Write).is_none());
        assert!(refused_watch(GDB_MAX_VALUE + 1, WatchKind::Write).is_some());
        assert!(refused_watch(u64::MAX, WatchKind::Write).is_some());
        for kind in [WatchKind::Read, WatchKind::ReadWrite] {
            assert!(refused_watch(u64::MAX, kind).is_none(), "{kind:?}");
        }
    }
}
