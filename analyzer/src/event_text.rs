//! How the trace's events read in text: one line an event, for the
//! listing, the nest diagram's notes and the export's event column. A leaf
//! of the crate: it names things with `naming` and nothing else, so every
//! analysis can use it without tying itself to another.

use serde::Serialize;
use vtrace_storage::{Event, MemoryValue, ProbeField, ProbeValue, HOST_MARK};

use crate::naming;

/// Recorded memory values as `--values` writes accesses: `r ADDR:SIZE=VALUE`.
fn describe_memory_values(values: &[MemoryValue]) -> String {
    let mut text = String::from("memory values");
    for v in values {
        let value = v.value.map_or("?".into(), |v| format!("{v:#x}"));
        let kind = if v.write { "w" } else { "r" };
        text.push_str(&format!(" {kind} {:#x}:{}={value}", v.addr, v.size));
    }
    text
}

/// One event as a listing line.
pub fn describe_event(e: &Event) -> String {
    match e {
        Event::Interrupt {
            vector,
            error_code,
            source,
        } => format!(
            "interrupt {vector} ({}){} [{source:?}]",
            naming::vector_name(*vector),
            error_code
                .map(|c| format!(" error code {c:#x}"))
                .unwrap_or_default()
        ),
        Event::Io {
            port,
            size,
            write,
            value,
        } => format!(
            "io {} port {port:#x}{} size {size} value {value:#x}",
            if *write { "out" } else { "in" },
            naming::port_name(*port)
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        ),
        Event::Mmio {
            addr,
            size,
            write,
            value,
        } => format!(
            "mmio {} {addr:#x} size {size} value {value:#x}",
            if *write { "write" } else { "read" }
        ),
        Event::Hypercall {
            command,
            args,
            result,
        } => format!(
            "hypercall {} args [{}] result {result}",
            naming::hypercall_name(*command),
            args.iter()
                .map(|a| format!("{a:#x}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Event::Mark {
            id: HOST_MARK,
            value,
        } => format!("host mark {value}"),
        Event::Mark { id, value } => format!("mark {id} value {value:#x}"),
        Event::Log(text) => format!("log {text:?}"),
        Event::Capture {
            name,
            addr,
            length,
            bytes,
        } => describe_capture(name, *addr, *length, bytes),
        Event::Probe { name, pc, args } => describe_probe(name, *pc, args),
        Event::ProbeValues(fields) => describe_probe_values(fields),
        Event::MemoryValues(values) => describe_memory_values(values),
        Event::Sample {
            virtual_ns,
            values,
            pc,
            ..
        } => format!(
            "sample taken at {:.9} s virtual: {values:?}{}",
            *virtual_ns as f64 / 1e9,
            pc.map(|(pc, _)| format!(" pc {pc:#x}")).unwrap_or_default()
        ),
        Event::ControlRegister { reg: 0xef, value } => format!("efer = {value:#x}"),
        Event::ControlRegister { reg, value } => format!("cr{reg} = {value:#x}"),
        Event::Gap { from, to } => {
            format!("GAP: expected {from:#x}, went to {to:#x}; steps between are not in the trace")
        }
        Event::Halt => "halt (waiting for an interrupt)".into(),
        Event::TraceStart(r) => format!("trace started by {r}"),
        Event::TraceStop(r) => format!("trace stopped by {r}"),
        Event::Task { tid, pid, comm } if tid == pid => format!("task {comm:?} pid {pid}"),
        Event::Task { tid, pid, comm } => format!("task {comm:?} pid {pid} tid {tid}"),
        Event::TaskName { tid, comm } => format!("task {tid} is now named {comm:?}"),
        Event::Running { tid, pid, comm } => {
            format!("segment begins in task {comm:?} pid {pid} tid {tid}")
        }
        Event::Runnable { count } => format!("{count} tasks runnable"),
        Event::Cpu(cpu) => format!("on CPU {cpu}"),
        Event::TaskExit { tid, code } => {
            format!("task {tid} {}", Exit::from_code(*code))
        }
        Event::Mappings { pid, maps } => {
            let files: Vec<String> = maps
                .iter()
                .map(|m| format!("{} {:#x}-{:#x}", m.path, m.start, m.end))
                .collect();
            format!("pid {pid} maps {}", files.join(", "))
        }
    }
}

/// The bytes as text: up to the first NUL (captures are mostly strings),
/// with C's escapes for the rest (`\n`, `\"`, `\\`, `\x90`), so a
/// format string reads as in its source.
pub fn text_of(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let mut out = String::with_capacity(end);
    for &b in &bytes[..end] {
        match b {
            b'\n' => out.push_str("\\n"),
            b'\t' => out.push_str("\\t"),
            b'\r' => out.push_str("\\r"),
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b' '..=b'~' => out.push(char::from(b)),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

/// What the bytes are in a line: the text, and how many were missing.
pub fn describe_capture(name: &str, addr: u64, length: u32, bytes: &[u8]) -> String {
    let what = match bytes.len() {
        0 => "not present, skipped".to_string(),
        n if n < length as usize => {
            format!(
                "\"{}\" ({n} of {length} bytes; the rest not present)",
                text_of(bytes)
            )
        }
        _ => format!("\"{}\"", text_of(bytes)),
    };
    format!("capture {name} at {addr:#x}: {what}")
}

/// A fire as a line: "probe sched:switch(0, 1) at 0x100cda"; arguments
/// as signed numbers, as the sites declare them.
pub fn describe_probe(name: &str, pc: u64, args: &[u64]) -> String {
    let args: Vec<String> = args.iter().map(|&a| (a as i64).to_string()).collect();
    format!("probe {name}({}) at {pc:#x}", args.join(", "))
}

/// A typed probe value as text: an integer in decimal (signed where its
/// type is), a pointer in hex, text quoted with C's escapes (`...` where
/// cut), and `<unavailable at 0x...>` where the memory was not there.
pub fn probe_value_text(value: &ProbeValue) -> String {
    match value {
        ProbeValue::Int { signed: true, .. } => probe_number(value)
            .map(|v| v.to_string())
            .unwrap_or_default(),
        ProbeValue::Int { value, .. } => value.to_string(),
        ProbeValue::Pointer(addr) => format!("{addr:#x}"),
        ProbeValue::Text { bytes, complete } => {
            format!(
                "\"{}\"{}",
                text_of(bytes),
                if *complete { "" } else { "..." }
            )
        }
        ProbeValue::Unavailable { addr } => format!("<unavailable at {addr:#x}>"),
    }
}

/// A typed probe value as a number: an integer as its type reads it
/// (sign-extended from its width where signed), a pointer's bits; none
/// for text or what was unavailable.
pub fn probe_number(value: &ProbeValue) -> Option<i64> {
    match value {
        ProbeValue::Int {
            value,
            size,
            signed: true,
        } => {
            let shift = 64 - 8 * u32::from((*size).clamp(1, 8));
            Some(((*value << shift) as i64) >> shift)
        }
        ProbeValue::Int { value, .. } | ProbeValue::Pointer(value) => Some(*value as i64),
        _ => None,
    }
}

/// A probe's typed values as a line: `values: dfd=-100 filename="/init"`.
pub fn describe_probe_values(fields: &[ProbeField]) -> String {
    let parts: Vec<String> = fields
        .iter()
        .map(|f| format!("{}={}", f.name, probe_value_text(&f.value)))
        .collect();
    format!("values: {}", parts.join(" "))
}

/// How a task ended: the kernel's exit code, as `wait` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Exit {
    /// The code `do_exit` was given: `(status << 8) | signal`.
    pub code: u32,
    /// The exit status, where it ended by exiting.
    pub status: Option<u8>,
    /// The signal that ended it, where one did.
    pub signal: Option<u8>,
    /// Whether it dumped core.
    pub core_dumped: bool,
}

impl Exit {
    /// The exit code taken apart as `WIFEXITED`/`WTERMSIG` do.
    pub fn from_code(code: u32) -> Exit {
        let signal = (code & 0x7f) as u8;
        Exit {
            code,
            status: (signal == 0).then_some((code >> 8) as u8),
            signal: (signal != 0).then_some(signal),
            core_dumped: signal != 0 && code & 0x80 != 0,
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.status, self.signal) {
            (Some(status), _) => write!(f, "exited with status {status}"),
            (None, Some(signal)) => {
                write!(f, "killed by signal {signal}")?;
                if self.core_dumped {
                    f.write_str(" (core dumped)")?;
                }
                Ok(())
            }
            (None, None) => write!(f, "exited with code {:#x}", self.code),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_text_is_a_c_string_with_escapes() {
        assert_eq!(text_of(b"ticks: %lu\n\0junk"), "ticks: %lu\\n");
        assert_eq!(text_of(&[0x90, b'a', b'\'', b'"']), "\\x90a'\\\"");
        assert_eq!(text_of(b""), "");
    }

    #[test]
    fn typed_probe_values_read_as_their_types() {
        let f = |name: &str, value| ProbeField {
            name: name.into(),
            value,
        };
        let line = describe_probe_values(&[
            f(
                "dfd",
                ProbeValue::Int {
                    value: 0xffff_ff9c,
                    size: 4,
                    signed: true,
                },
            ),
            f(
                "flags",
                ProbeValue::Int {
                    value: 0x8000,
                    size: 4,
                    signed: false,
                },
            ),
            f(
                "filename",
                ProbeValue::Text {
                    bytes: b"/dev/console".to_vec(),
                    complete: true,
                },
            ),
            f(
                "cut",
                ProbeValue::Text {
                    bytes: b"ab\n".to_vec(),
                    complete: false,
                },
            ),
            f("how", ProbeValue::Pointer(0xffff_c900_0001_3e40)),
            f("p->x", ProbeValue::Unavailable { addr: 0x10 }),
        ]);
        assert_eq!(
            line,
            "values: dfd=-100 flags=32768 filename=\"/dev/console\" cut=\"ab\\n\"... \
             how=0xffffc90000013e40 p->x=<unavailable at 0x10>"
        );
    }

    #[test]
    fn a_capture_line_says_what_was_missing() {
        assert_eq!(
            describe_capture("f", 0x10, 8, b"ab"),
            "capture f at 0x10: \"ab\" (2 of 8 bytes; the rest not present)"
        );
        assert_eq!(
            describe_capture("f", 0x10, 8, b""),
            "capture f at 0x10: not present, skipped"
        );
        assert_eq!(
            describe_capture("f", 0x10, 2, b"ab"),
            "capture f at 0x10: \"ab\""
        );
    }
}
