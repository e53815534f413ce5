//! The captures of a trace (`vtrace run --capture`): guest memory copied
//! when execution reached a place, each with the step it came before and
//! its bytes as hex and as text.

use serde::Serialize;
use vtrace_storage::{Event, RecordRef};

use crate::error::Result;
use crate::input::{Progress, Trace};

/// One capture.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Capture {
    /// The step it was taken before: the number of steps recorded before
    /// it (while tracing was off, the next traced step's).
    pub step: u64,
    /// Taken while tracing (else at a breakpoint, untraced).
    pub traced: bool,
    /// The capture's name.
    pub name: String,
    /// The linear address read, in hex (`0x...`): JSON readers that hold
    /// numbers as doubles would round a kernel address.
    pub address: String,
    /// Bytes asked for.
    pub length: u32,
    /// The bytes read, in hex; fewer than `length` where a page was not
    /// present.
    pub hex: String,
    /// The bytes up to the first NUL as text (UTF-8, a byte that is not
    /// replaced by U+FFFD): JSON escapes it once, as any string.
    pub text: String,
    /// The bytes read, for the table's C escapes.
    #[serde(skip)]
    pub bytes: Vec<u8>,
}

/// A capture, or tracing starting or stopping, in trace order.
enum Found {
    Capture(Box<Capture>),
    Traced(bool),
}

/// Every capture of the trace, in order.
pub fn captures(trace: &Trace, progress: Progress<'_>) -> Result<Vec<Capture>> {
    let mut out = Vec::new();
    let mut traced = false;
    trace.for_each_ordered(
        &trace.segments,
        |info, records| {
            let mut step = info.first_step;
            let mut found = Vec::new();
            while let Some(r) = records.next_record() {
                match r {
                    RecordRef::Step(_) => step = step.saturating_add(1),
                    RecordRef::Event(Event::TraceStart(_)) => found.push(Found::Traced(true)),
                    RecordRef::Event(Event::TraceStop(_)) => found.push(Found::Traced(false)),
                    RecordRef::Event(Event::Capture {
                        name,
                        addr,
                        length,
                        bytes,
                    }) => found.push(Found::Capture(Box::new(Capture {
                        step,
                        traced: false,
                        name: name.clone(),
                        address: format!("{addr:#x}"),
                        length: *length,
                        hex: bytes.iter().map(|b| format!("{b:02x}")).collect(),
                        text: {
                            let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                            String::from_utf8_lossy(&bytes[..end]).into_owned()
                        },
                        bytes: bytes.to_vec(),
                    }))),
                    RecordRef::Event(_) => {}
                }
            }
            found
        },
        |chunk| {
            // A damaged segment's captures are lost with it; the trace's
            // problems say which.
            for f in chunk.result.into_iter().flatten() {
                match f {
                    Found::Traced(on) => traced = on,
                    Found::Capture(mut c) => {
                        c.traced = traced;
                        out.push(*c);
                    }
                }
            }
            Ok::<(), crate::error::AnalyzeError>(())
        },
        progress,
    )?;
    Ok(out)
}

/// The captures as a table.
pub fn format_table(captures: &[Capture]) -> String {
    use std::fmt::Write as _;
    let width = captures
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = format!(
        "{:>12}  {:width$}  {:>18}  {:>9}  text\n",
        "step", "name", "address", "bytes"
    );
    for c in captures {
        let got = c.hex.len() / 2;
        let bytes = if got == c.length as usize {
            got.to_string()
        } else {
            format!("{got}/{}", c.length)
        };
        let text = match got {
            0 => "(not present, skipped)".to_string(),
            _ => format!("\"{}\"", crate::event_text::text_of(&c.bytes)),
        };
        let _ = writeln!(
            out,
            "{:>12}{} {:width$}  {:>18}  {bytes:>9}  {text}",
            c.step,
            if c.traced { " " } else { "*" },
            c.name,
            c.address
        );
    }
    if captures.iter().any(|c| !c.traced) {
        out.push_str("* taken while tracing was off (at a breakpoint)\n");
    }
    out
}
