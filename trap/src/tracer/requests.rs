//! What the user asks of a running tracer: console hotkeys and `vtrace ctl`
//! requests, the status line and the help that names them.

use vtrace_storage::{Event, TraceReason, HOST_MARK};
use vtrace_vmm::Help;

use super::{SampleCount, Tracer};

impl Tracer {
    /// `Ctrl-A t` and `Ctrl-A m`.
    pub(super) fn answer_hotkey(&mut self, key: u8) -> Option<String> {
        match key {
            b't' if self.active => {
                self.stop(TraceReason::Hotkey);
                Some(format!(
                    "vtrace: tracing stopped ({} steps so far)",
                    self.recorder.steps()
                ))
            }
            b't' => Some(match (self.start(TraceReason::Hotkey), self.spent()) {
                (false, Some(why)) => format!("vtrace: tracing not started: {why}"),
                _ => "vtrace: tracing started".into(),
            }),
            b'm' => Some(format!("vtrace: {}", self.host_mark(None))),
            _ => None,
        }
    }

    /// A `vtrace ctl` request, word for word; `None` for one that is not
    /// the tracer's.
    pub(super) fn answer_control(&mut self, command: &str) -> Option<String> {
        let mut words = command.split_whitespace();
        Some(match (words.next()?, words.next()) {
            ("start", None) => match (self.start(TraceReason::Control), self.spent()) {
                (true, _) => "tracing started".into(),
                (false, Some(why)) if !self.active => format!("tracing not started: {why}"),
                (false, _) => "tracing was already on".into(),
            },
            ("stop", None) => match self.stop(TraceReason::Control) {
                true => format!("tracing stopped after {} steps", self.recorder.steps()),
                false => "tracing was already off".into(),
            },
            ("mark", id) => match id.map(str::parse::<u64>) {
                None => self.host_mark(None),
                Some(Ok(id)) if id != HOST_MARK => self.host_mark(Some(id)),
                Some(_) => {
                    return Some(format!(
                        "error: a mark's id is a number below {HOST_MARK} (that one means \
                         a mark without an id)"
                    ))
                }
            },
            ("probe", Some(action @ ("enable" | "disable"))) => {
                let (Some(pattern), None) = (words.next(), words.next()) else {
                    return Some(format!(
                        "error: probe {action} takes one pattern (sched:*, timer:tick, fn:*)"
                    ));
                };
                let matched = self.probes.set(pattern, action == "enable");
                // Written before the guest runs again; the breakpoints
                // of fn: probes follow.
                self.arm();
                match matched.len() {
                    0 => format!(
                        "error: no probe matches '{pattern}' (`vtrace probes list` lists the \
                         kernel's; fn: probes are given to vtrace run with --probe)"
                    ),
                    _ => format!("{action}d {}", matched.join(", ")),
                }
            }
            _ => return None,
        })
    }

    /// What the tracer answers, for `Ctrl-A h` and `vtrace ctl help`.
    pub(super) fn help_text() -> Help {
        Help {
            hotkeys: vec![
                ('t', "start or stop tracing"),
                ('m', "record a mark in the trace"),
            ],
            commands: vec![
                "start",
                "stop",
                "mark [ID]",
                "probe enable PATTERN",
                "probe disable PATTERN",
            ],
        }
    }

    /// The status line's tracer part (`vtrace ctl status`, `Ctrl-A s`).
    pub(super) fn status_line(&self) -> String {
        let probes = self
            .probes
            .status()
            .map(|p| format!("; {p}"))
            .unwrap_or_default();
        let samples = match self.samples {
            SampleCount {
                recorded: 0,
                lost: 0,
            } => String::new(),
            SampleCount { recorded, lost: 0 } => format!("; {recorded} samples"),
            SampleCount { recorded, lost } => {
                format!("; {recorded} samples ({lost} lost: the disk is full)")
            }
        };
        let (used, size) = self.recorder.disk_fill();
        let state = match (self.active, self.start_armed, self.options.start_at) {
            (true, _, _) => "on".to_string(),
            (false, true, Some(at)) => {
                let task = match &self.options.start_in {
                    Some(comm) => format!(" in a task named {comm}"),
                    None => String::new(),
                };
                match &self.options.start_label {
                    Some(label) if !label.starts_with(|c: char| c.is_ascii_digit()) => {
                        format!("off until --start-at {label} ({at:#x}){task} runs")
                    }
                    _ => format!("off until --start-at {at:#x}{task} runs"),
                }
            }
            (false, _, _) => "off".to_string(),
        };
        format!(
            "tracing {state}, {} steps recorded, disk {:.1} of {:.1} MiB{}{probes}{samples}",
            self.recorder.steps(),
            used as f64 / f64::from(1 << 20),
            size as f64 / f64::from(1 << 20),
            if self.recorder.wraps() {
                " (a ring)"
            } else {
                ""
            }
        )
    }

    /// Records a mark made from the host: with `id` as a guest MARK
    /// would, else as [`HOST_MARK`]; the value counts host marks. Says
    /// what the trace shows.
    pub(super) fn host_mark(&mut self, id: Option<u64>) -> String {
        self.marks += 1;
        self.recorder.event(&Event::Mark {
            id: id.unwrap_or(HOST_MARK),
            value: self.marks,
        });
        match id {
            Some(id) => format!("mark {id} recorded (value {})", self.marks),
            None => format!("host mark {} recorded", self.marks),
        }
    }
}
