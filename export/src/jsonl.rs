//! Rows as JSON lines: an object per step with the Parquet columns' names;
//! registers the step did not change, and a task, system call or
//! interrupt it does not have, are left out rather than null.

use std::fmt::Write as _;
use std::io::Write;

use vtrace_storage::REG_COUNT;
use vtrace_storage::REG_NAMES;

use super::rows::SegmentRows;
use super::{Context, ExportError, PartWriter};
use vtrace_analyzer::routine_label;
use vtrace_analyzer::Access;

/// A JSON string literal.
fn quoted(out: &mut String, text: &str) {
    // serde_json escapes exactly as JSON wants; writing into a String
    // cannot fail.
    if let Ok(q) = serde_json::to_string(text) {
        out.push_str(&q);
    }
}

/// `"reads":[...]` and the like: `part` of each access, `null` where
/// the addresses are not known.
fn accesses(out: &mut String, name: &str, known: bool, accesses: &[Access], part: AccessPart) {
    let _ = write!(out, ",\"{name}\":");
    if !known {
        out.push_str("null");
        return;
    }
    out.push('[');
    for (i, a) in accesses.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match part(a) {
            Some(v) => {
                let _ = write!(out, "{v}");
            }
            None => out.push_str("null"),
        }
    }
    out.push(']');
}

/// What of an access a list holds: its address, size or value.
type AccessPart = fn(&Access) -> Option<u64>;

/// Every list of a row's accesses: addresses, sizes and values.
fn access_lists(out: &mut String, known: bool, reads: &[Access], writes: &[Access]) {
    let columns: [(&str, &[Access], AccessPart); 6] = [
        ("reads", reads, |a| Some(a.addr)),
        ("writes", writes, |a| Some(a.addr)),
        ("read_sizes", reads, |a| Some(u64::from(a.size))),
        ("write_sizes", writes, |a| Some(u64::from(a.size))),
        ("read_values", reads, |a| a.value),
        ("write_values", writes, |a| a.value),
    ];
    for (name, list, part) in columns {
        accesses(out, name, known, list, part);
    }
}

/// One segment's rows as JSON lines.
pub(super) fn lines(rows: &SegmentRows, ctx: &Context<'_>) -> String {
    let mut out = String::with_capacity(rows.len() * 200);
    let mut names: rustc_hash::FxHashMap<u32, String> = Default::default();
    let mut cursor = 0usize;
    let (mut reads_at, mut writes_at, mut events_at) = (0usize, 0usize, 0usize);
    let mut syscalls = rows.syscalls.iter().peekable();
    let mut interrupts = rows.interrupts.iter().peekable();
    for row in 0..rows.len() {
        let step = rows.steps[row];
        let _ = write!(out, "{{\"step\":{step},\"cpu\":{}", rows.cpu);
        if let Some(ns) = ctx.ns_per_step.and_then(|ns| step.checked_mul(ns)) {
            let _ = write!(out, ",\"virtual_ns\":{ns}");
        }
        let _ = write!(
            out,
            ",\"cr3\":{},\"cpl\":{},\"bitness\":{},\"pc\":{},\"routine\":",
            rows.cr3[row],
            rows.cpl[row],
            rows.bitness[row],
            rows.pc(row).unwrap_or(0)
        );
        let func = rows.routine[row];
        let name = names
            .entry(func)
            .or_insert_with(|| routine_label(ctx.symbols, func));
        quoted(&mut out, name);
        if let Some(task) = rows.tasks.get(rows.task[row] as usize) {
            let _ = write!(out, ",\"pid\":{},\"tid\":{},\"comm\":", task.pid, task.tid);
            quoted(&mut out, task.comm.as_str());
        }
        out.push_str(",\"bytes\":\"");
        let text = rows.texts.get(rows.insn[row] as usize);
        for b in text.map(|t| t.bytes.as_slice()).unwrap_or_default() {
            let _ = write!(out, "{b:02x}");
        }
        out.push('"');
        if let Some(text) = text {
            let _ = write!(out, ",\"mnemonic\":\"{}\",\"instruction\":", text.mnemonic);
            quoted(&mut out, &text.disassembly);
        }
        for (reg, name) in REG_NAMES.iter().enumerate().take(REG_COUNT) {
            if let Some(v) = rows.register(row, cursor, reg) {
                let _ = write!(out, ",\"{name}\":{v}");
            }
        }
        cursor += rows.stored(row);
        let known = rows.known[row];
        let (r_end, w_end) = (rows.reads_end[row] as usize, rows.writes_end[row] as usize);
        if row == 0 {
            access_lists(&mut out, known, &rows.first_reads, &rows.first_writes);
        } else {
            access_lists(
                &mut out,
                known,
                rows.reads.get(reads_at..r_end).unwrap_or_default(),
                rows.writes.get(writes_at..w_end).unwrap_or_default(),
            );
        }
        (reads_at, writes_at) = (r_end, w_end);
        if let Some((_, call)) = syscalls.next_if(|(r, _)| *r as usize == row) {
            let _ = write!(out, ",\"syscall\":{},\"syscall_name\":", call.number);
            quoted(&mut out, &call.name());
        }
        if let Some((_, v)) = interrupts.next_if(|(r, _)| *r as usize == row) {
            let _ = write!(out, ",\"interrupt\":{v}");
        }
        out.push_str(",\"events\":[");
        let end = rows.events_end[row] as usize;
        let first = if row == 0 {
            &rows.first_events[..]
        } else {
            &[]
        };
        let here = rows.events.get(events_at..end).unwrap_or_default();
        for (i, e) in first.iter().chain(here).enumerate() {
            if i > 0 {
                out.push(',');
            }
            quoted(&mut out, e);
        }
        events_at = end;
        out.push_str("]}\n");
    }
    out
}

/// A JSON-lines file (or standard output) being written.
pub(super) struct JsonlPart<'a, W: Write + Send> {
    out: W,
    ctx: &'a Context<'a>,
}

impl<'a, W: Write + Send> JsonlPart<'a, W> {
    pub fn new(out: W, ctx: &'a Context<'a>) -> Self {
        JsonlPart { out, ctx }
    }
}

impl<W: Write + Send> PartWriter for JsonlPart<'_, W> {
    fn write_all(
        mut self: Box<Self>,
        segments: &mut dyn Iterator<Item = SegmentRows>,
    ) -> Result<(), ExportError> {
        for rows in segments {
            self.out.write_all(lines(&rows, self.ctx).as_bytes())?;
        }
        self.out.flush()?;
        Ok(())
    }
}
