//! The vtrace hypercall port (ABI in `vtrace-guest`): EXIT, LOG and MARK are
//! served here; the others are handed back to the run loop, which asks the
//! monitor (the tracing commands) and then [`HypercallPort::unanswered`].
//!
//! Every pointer and length the guest passes is checked: a bad one is an
//! error code for the guest and a line in the host log, never a VMM failure.

use vtrace_guest::{cmd, status, ABI_VERSION, LOG_MAX_LEN, VERSION_MAGIC};

use crate::guest_text::GuestLines;
use crate::memory::GuestVirtualMemory;

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

/// What the run loop must do after a hypercall.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HypercallOutcome {
    /// Return `status` to the guest in EAX.
    Reply {
        /// The status.
        status: i32,
        /// The text the guest logged (LOG), for the monitor.
        log: Option<String>,
    },
    /// The guest asked to end the VM with this status.
    Exit(u8),
    /// Not the port's: ask the monitor, then
    /// [`HypercallPort::unanswered`].
    ForMonitor,
}

/// State of the hypercall port.
#[derive(Debug, Default)]
pub struct HypercallPort {
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
        log: &mut dyn FnMut(&str),
    ) -> HypercallOutcome {
        let [a0, a1, ..] = call.args;
        let reply = |status| HypercallOutcome::Reply { status, log: None };
        match call.command {
            cmd::VERSION => reply((VERSION_MAGIC | ABI_VERSION) as i32),
            cmd::EXIT => HypercallOutcome::Exit(a0 as u8),
            cmd::LOG => match self.read_log(a0, a1, mem) {
                Ok(text) => {
                    self.say(&text, log);
                    HypercallOutcome::Reply {
                        status: status::OK,
                        log: Some(text),
                    }
                }
                Err(code) => {
                    let why = format!(
                        "LOG rejected ({}): address {a0:#x}, length {a1}",
                        describe(code)
                    );
                    self.say(&why, log);
                    reply(code)
                }
            },
            // The monitor records it (the exit tells it every call).
            cmd::MARK => reply(status::OK),
            _ => HypercallOutcome::ForMonitor,
        }
    }

    /// The status for a call handed to the monitor, which answered
    /// `answer`: a tracing command without a tracer is unavailable; a
    /// command nobody knows is rejected, and said.
    pub fn unanswered(
        &mut self,
        call: Hypercall,
        answer: Option<i32>,
        log: &mut dyn FnMut(&str),
    ) -> i32 {
        match answer {
            Some(status) => status,
            None if matches!(
                call.command,
                cmd::TRACE_START | cmd::TRACE_STOP | cmd::TRACE_REGION | cmd::PROBE
            ) =>
            {
                status::UNAVAILABLE
            }
            None => {
                self.say(
                    &format!("hypercall {:#x} is not a vtrace command", call.command),
                    log,
                );
                status::UNKNOWN_COMMAND
            }
        }
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

    fn read_log(&self, gva: u64, len: u64, mem: &dyn GuestVirtualMemory) -> Result<String, i32> {
        if len == 0 || len > u64::from(LOG_MAX_LEN) {
            return Err(status::BAD_LENGTH);
        }
        let mut buf = vec![0u8; len as usize];
        mem.read_virtual(gva, &mut buf)
            .map_err(|_| status::BAD_ADDRESS)?;
        Ok(String::from_utf8_lossy(&buf).trim_end().to_string())
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
    use crate::memory::BadAddress;

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
        let hypercall = Hypercall {
            command,
            args: [a0, a1, 0, 0],
            ..Hypercall::default()
        };
        let mut log = |l: &str| lines.push(l.to_string());
        let out = match port.handle(hypercall, &OnePage(page), &mut log) {
            // What the run loop does without a monitor.
            HypercallOutcome::ForMonitor => HypercallOutcome::Reply {
                status: port.unanswered(hypercall, None, &mut log),
                log: None,
            },
            out => out,
        };
        (out, lines)
    }

    fn reply(status: i32) -> HypercallOutcome {
        HypercallOutcome::Reply { status, log: None }
    }

    #[test]
    fn a_monitor_answers_what_the_port_hands_it() {
        let mut port = HypercallPort::new();
        let call = Hypercall {
            command: cmd::TRACE_START,
            ..Hypercall::default()
        };
        assert_eq!(
            port.handle(call, &OnePage(vec![0; 4096]), &mut |_| {}),
            HypercallOutcome::ForMonitor
        );
        assert_eq!(port.unanswered(call, Some(-7), &mut |_| {}), -7);
    }

    #[test]
    fn log_reads_guest_text() {
        let mut port = HypercallPort::new();
        let (out, lines) = call(&mut port, cmd::LOG, 0x1000, 5);
        assert_eq!(
            out,
            HypercallOutcome::Reply {
                status: status::OK,
                log: Some("hello".into())
            }
        );
        assert_eq!(lines, vec!["vtrace: guest: hello"]);
    }

    #[test]
    fn bad_pointers_and_lengths_are_refused() {
        let mut port = HypercallPort::new();
        assert_eq!(
            call(&mut port, cmd::LOG, 0x1ffe, 5).0,
            reply(status::BAD_ADDRESS)
        );
        assert_eq!(
            call(&mut port, cmd::LOG, u64::MAX, 5).0,
            reply(status::BAD_ADDRESS)
        );
        assert_eq!(
            call(&mut port, cmd::LOG, 0x1000, 0).0,
            reply(status::BAD_LENGTH)
        );
        assert_eq!(
            call(&mut port, cmd::LOG, 0x1000, 1 << 40).0,
            reply(status::BAD_LENGTH)
        );
    }

    #[test]
    fn exit_mark_version_and_unknown() {
        let mut port = HypercallPort::new();
        assert_eq!(
            call(&mut port, cmd::EXIT, 0x1_07, 0).0,
            HypercallOutcome::Exit(7)
        );
        assert_eq!(call(&mut port, cmd::MARK, 9, 1).0, reply(status::OK));
        assert_eq!(
            call(&mut port, cmd::VERSION, 0, 0).0,
            reply((VERSION_MAGIC | ABI_VERSION) as i32)
        );
        assert_eq!(
            call(&mut port, cmd::TRACE_START, 1, 0).0,
            reply(status::UNAVAILABLE)
        );
        assert_eq!(
            call(&mut port, 0x777, 0, 0).0,
            reply(status::UNKNOWN_COMMAND)
        );
    }
}
