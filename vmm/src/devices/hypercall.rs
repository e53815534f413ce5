//! The vtrace hypercall port (ABI in `vtrace-guest`): EXIT, LOG and MARK are
//! served here; tracing commands are handed to the [`Monitor`].
//!
//! Every pointer and length the guest passes is checked: a bad one is an
//! error code for the guest and a line in the host log, never a VMM failure.

use std::collections::BTreeMap;

use vtrace_guest::{cmd, status, ABI_VERSION, LOG_MAX_LEN, VERSION_MAGIC};

use crate::guest_text::GuestLines;
use crate::monitor::Monitor;

/// A hypercall as the guest issued it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hypercall {
    /// `EAX`: the command.
    pub command: u32,
    /// `RBX`, `RCX`, `RSI`, `RDI`: arguments 0 to 3.
    pub args: [u64; 4],
    /// `R8`, `R9`: arguments 4 and 5, which only [`cmd::PROBE`] takes.
    pub more_args: [u64; 2],
    /// The linear address of the `IN` (a static probe's site).
    pub rip: u64,
}

/// Reads guest memory by guest-virtual address, through the guest's current
/// page tables. Implemented over KVM for the VM and by tests directly.
pub trait GuestVirtualMemory {
    /// Fills `buf` from `gva`; fails if any byte is not mapped to RAM.
    fn read_virtual(&self, gva: u64, buf: &mut [u8]) -> Result<(), BadAddress>;
}

/// A guest-virtual address that does not translate to guest RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadAddress(pub u64);

/// What the run loop must do after a hypercall.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HypercallOutcome {
    /// Return this status to the guest in EAX.
    Reply(i32),
    /// The guest asked to end the VM with this status.
    Exit(u8),
}

/// Counters for one mark identifier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MarkStats {
    pub count: u64,
    pub last_value: u64,
}

/// Distinct MARK ids counted: beyond this, a guest could grow the VMM
/// without bound (the trace records every MARK regardless).
pub const MAX_MARK_IDS: usize = 4096;

/// State of the hypercall port.
#[derive(Debug, Default)]
pub struct HypercallPort {
    marks: BTreeMap<u64, MarkStats>,
    /// MARK calls with a new id after [`MAX_MARK_IDS`] were counted.
    marks_uncounted: u64,
    logs: u64,
    rejected: u64,
    last_log: Option<String>,
    lines: GuestLines,
}

impl HypercallPort {
    /// A port that has seen no call.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves one call. `log` receives lines to print for the user: LOG
    /// text and the reason for rejected calls, escaped and rate-limited
    /// (see `guest_text`).
    pub fn handle(
        &mut self,
        call: Hypercall,
        mem: &dyn GuestVirtualMemory,
        monitor: &mut dyn Monitor,
        log: &mut dyn FnMut(&str),
    ) -> HypercallOutcome {
        let [a0, a1, ..] = call.args;
        let reply = match call.command {
            cmd::VERSION => (VERSION_MAGIC | ABI_VERSION) as i32,
            cmd::EXIT => return HypercallOutcome::Exit(a0 as u8),
            cmd::LOG => match self.read_log(a0, a1, mem) {
                Ok(text) => {
                    self.logs += 1;
                    self.say(&text, log);
                    self.last_log = Some(text);
                    status::OK
                }
                Err(code) => {
                    self.rejected += 1;
                    let why = format!(
                        "LOG rejected ({}): address {a0:#x}, length {a1}",
                        describe(code)
                    );
                    self.say(&why, log);
                    code
                }
            },
            cmd::MARK => {
                if self.marks.len() < MAX_MARK_IDS || self.marks.contains_key(&a0) {
                    let m = self.marks.entry(a0).or_default();
                    m.count += 1;
                    m.last_value = a1;
                } else {
                    self.marks_uncounted += 1;
                }
                status::OK
            }
            other => match monitor.hypercall(&call) {
                Some(code) => code,
                None if matches!(
                    other,
                    cmd::TRACE_START | cmd::TRACE_STOP | cmd::TRACE_REGION | cmd::PROBE
                ) =>
                {
                    status::UNAVAILABLE
                }
                None => {
                    self.rejected += 1;
                    self.say(
                        &format!("hypercall {other:#x} is not a vtrace command"),
                        log,
                    );
                    status::UNKNOWN_COMMAND
                }
            },
        };
        HypercallOutcome::Reply(reply)
    }

    fn say(&mut self, text: &str, log: &mut dyn FnMut(&str)) {
        if let Some(line) = self.lines.admit(text, std::time::Instant::now()) {
            log(&line);
        }
    }

    /// Guest lines not printed (over the rate limit).
    pub fn lines_not_shown(&self) -> u64 {
        self.lines.dropped()
    }

    /// MARK calls not counted by id (more than [`MAX_MARK_IDS`] ids).
    pub fn marks_uncounted(&self) -> u64 {
        self.marks_uncounted
    }

    fn read_log(&self, gva: u64, len: u64, mem: &dyn GuestVirtualMemory) -> Result<String, i32> {
        if len == 0 || len > u64::from(LOG_MAX_LEN) {
            return Err(status::BAD_LENGTH);
        }
        let mut buf = vec![0u8; len as usize];
        mem.read_virtual(gva, &mut buf)
            .map_err(|_| status::BAD_ADDRESS)?;
        Ok(String::from_utf8_lossy(&buf).trim_end().to_string())
    }

    /// Marks seen so far, by identifier.
    pub fn marks(&self) -> &BTreeMap<u64, MarkStats> {
        &self.marks
    }

    /// The text of the LOG call just served, once.
    pub fn take_log(&mut self) -> Option<String> {
        self.last_log.take()
    }

    /// Calls rejected for bad arguments or unknown commands.
    pub fn rejected(&self) -> u64 {
        self.rejected
    }
}

fn describe(code: i32) -> &'static str {
    match code {
        status::BAD_ADDRESS => "the text is not mapped in guest memory",
        status::BAD_LENGTH => "length must be 1 to 4096",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::NoMonitor;

    /// Guest memory with one mapped page at 0x1000.
    struct OnePage(Vec<u8>);
    impl GuestVirtualMemory for OnePage {
        fn read_virtual(&self, gva: u64, buf: &mut [u8]) -> Result<(), BadAddress> {
            let start = gva.checked_sub(0x1000).ok_or(BadAddress(gva))? as usize;
            let src = self
                .0
                .get(start..start + buf.len())
                .ok_or(BadAddress(gva))?;
            buf.copy_from_slice(src);
            Ok(())
        }
    }

    fn call(
        port: &mut HypercallPort,
        command: u32,
        a0: u64,
        a1: u64,
    ) -> (HypercallOutcome, Vec<String>) {
        let mut page = vec![0u8; 4096];
        page[..5].copy_from_slice(b"hello");
        let mut lines = Vec::new();
        let out = port.handle(
            Hypercall {
                command,
                args: [a0, a1, 0, 0],
                ..Hypercall::default()
            },
            &OnePage(page),
            &mut NoMonitor,
            &mut |l| lines.push(l.to_string()),
        );
        (out, lines)
    }

    #[test]
    fn log_reads_guest_text() {
        let mut port = HypercallPort::new();
        let (out, lines) = call(&mut port, cmd::LOG, 0x1000, 5);
        assert_eq!(out, HypercallOutcome::Reply(status::OK));
        assert_eq!(lines, vec!["vtrace: guest: hello"]);
    }

    #[test]
    fn bad_pointers_and_lengths_are_refused() {
        let mut port = HypercallPort::new();
        assert_eq!(
            call(&mut port, cmd::LOG, 0x1ffe, 5).0,
            HypercallOutcome::Reply(status::BAD_ADDRESS)
        );
        assert_eq!(
            call(&mut port, cmd::LOG, u64::MAX, 5).0,
            HypercallOutcome::Reply(status::BAD_ADDRESS)
        );
        assert_eq!(
            call(&mut port, cmd::LOG, 0x1000, 0).0,
            HypercallOutcome::Reply(status::BAD_LENGTH)
        );
        assert_eq!(
            call(&mut port, cmd::LOG, 0x1000, 1 << 40).0,
            HypercallOutcome::Reply(status::BAD_LENGTH)
        );
        assert_eq!(port.rejected(), 4);
    }

    #[test]
    fn mark_ids_are_counted_up_to_a_bound() {
        let mut port = HypercallPort::new();
        for id in 0..(MAX_MARK_IDS as u64 + 1000) {
            call(&mut port, cmd::MARK, id, 1);
        }
        call(&mut port, cmd::MARK, 5, 2);
        assert_eq!(port.marks().len(), MAX_MARK_IDS);
        assert_eq!(port.marks_uncounted(), 1000);
        assert_eq!(port.marks()[&5].count, 2, "known ids still count");
    }

    #[test]
    fn exit_mark_version_and_unknown() {
        let mut port = HypercallPort::new();
        assert_eq!(
            call(&mut port, cmd::EXIT, 0x1_07, 0).0,
            HypercallOutcome::Exit(7)
        );
        call(&mut port, cmd::MARK, 9, 1);
        call(&mut port, cmd::MARK, 9, 2);
        assert_eq!(
            port.marks()[&9],
            MarkStats {
                count: 2,
                last_value: 2
            }
        );
        assert_eq!(
            call(&mut port, cmd::VERSION, 0, 0).0,
            HypercallOutcome::Reply((VERSION_MAGIC | ABI_VERSION) as i32)
        );
        assert_eq!(
            call(&mut port, cmd::TRACE_START, 1, 0).0,
            HypercallOutcome::Reply(status::UNAVAILABLE)
        );
        assert_eq!(
            call(&mut port, 0x777, 0, 0).0,
            HypercallOutcome::Reply(status::UNKNOWN_COMMAND)
        );
    }
}
