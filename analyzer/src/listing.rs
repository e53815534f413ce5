//! The listing: one line per step (number, address space, symbolised
//! address, bytes, disassembly, registers changed, source line) and a line
//! per event between steps. Segments are formatted in parallel; only the
//! first step of each, whose register changes depend on the segment before,
//! is finished in order.

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

use iced_x86::{Formatter, FormatterOutput, FormatterTextKind, GasFormatter};
use rustc_hash::FxHashMap;
use vtrace_storage::{Event, RecordRef, Regs, Step, REG_NAMES};

use crate::error::{AnalyzeError, Result};
use crate::input::{Progress, Records, SegmentInfo, Trace};
use crate::insn::InsnCache;
use crate::symbols::{cr3_root, Symbolizer};
use crate::syscalls;
use crate::tasks::{Selection, TaskFilter, TaskId};

/// Steps per file with `--out` (as the old analyzer cut its listings).
pub const STEPS_PER_FILE: u64 = 500_000;

/// What `vtrace analyze listing` prints.
#[derive(Clone, Debug, Default)]
pub struct ListingOptions {
    /// The first step to list; `None`: the trace's first.
    pub from: Option<u64>,
    /// How many steps; `None`: to the end.
    pub count: Option<u64>,
    /// AT&T syntax instead of Intel.
    pub att: bool,
    /// Add `file:line` where DWARF knows it.
    pub lines: bool,
    /// Only the steps of these tasks (and the events between them).
    pub tasks: TaskFilter,
    /// Pid and comm columns (for traces that name tasks).
    pub task_columns: bool,
}

/// `rax=0x1 rsp=0x7ff0` for the registers that differ; everything after a
/// break in the trace, when there is nothing to compare with.
fn changed(prev: Option<&Regs>, now: &Regs) -> String {
    let mut out = String::new();
    for (i, name) in REG_NAMES.iter().enumerate() {
        if prev.is_none_or(|p| p.get(i) != now.get(i)) {
            let _ = write!(
                out,
                "{}{name}={:#x}",
                if out.is_empty() { "" } else { " " },
                now.get(i)
            );
        }
    }
    out
}

/// Collects formatter output as plain text.
struct Text(String);

impl FormatterOutput for Text {
    fn write(&mut self, text: &str, _kind: FormatterTextKind) {
        self.0.push_str(text);
    }
}

/// Per-worker formatting state: decoded instructions and their text, by
/// address and address space.
struct LineFormatter<'a> {
    symbols: &'a Symbolizer,
    options: &'a ListingOptions,
    insns: InsnCache,
    text: FxHashMap<(u64, u64), String>,
}

impl<'a> LineFormatter<'a> {
    fn new(symbols: &'a Symbolizer, options: &'a ListingOptions) -> Self {
        LineFormatter {
            symbols,
            options,
            insns: InsnCache::default(),
            text: FxHashMap::default(),
        }
    }

    /// A step's line between its number and its register changes: the
    /// same for every execution of the instruction, so made once.
    fn describe(&mut self, s: &Step) -> &str {
        let key = (s.pc, cr3_root(s.cr3));
        if !self.text.contains_key(&key) {
            let text = self.format(s);
            self.text.insert(key, text);
        }
        &self.text[&key]
    }

    fn format(&mut self, s: &Step) -> String {
        let info = self.insns.get(s);
        let mut asm = Text(String::new());
        if self.options.att {
            GasFormatter::new().format(&info.instruction, &mut asm);
        } else {
            crate::insn::intel_formatter().format(&info.instruction, &mut asm);
        }
        // Direct branch targets get their symbol, as objdump shows them
        // (iced's own symbol resolver must be 'static; the symbols are not).
        let target = info.instruction.near_branch_target();
        if target != 0 {
            let _ = write!(asm.0, " <{}>", self.symbols.format(target, s.cr3));
        }
        let bytes: String = s
            .bytes
            .as_slice()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let place = self.symbols.format(s.pc, s.cr3);
        let line = if self.options.lines {
            self.symbols
                .line(s.pc, s.cr3)
                .map(|l| format!(" {l}"))
                .unwrap_or_default()
        } else {
            String::new()
        };
        format!(
            "{:>12} {:>18} {place:<32} {bytes:<30} {:<44}{line} |",
            format!("{:#x}", cr3_root(s.cr3)),
            format!("{:#x}", s.pc),
            asm.0
        )
    }
}

/// The column legend, the first line of a listing (and of each file).
pub fn header(options: &ListingOptions) -> String {
    let task = if options.task_columns {
        format!("{:>7} {:<15} ", "pid", "comm")
    } else {
        String::new()
    };
    format!(
        "# {:>8} {task}{:>12} {:>18} {:<32} {:<30} {:<44}{} | registers changed (events between steps: --)\n",
        "step",
        "cr3",
        "pc",
        "routine+offset",
        "bytes",
        "instruction",
        if options.lines { " file:line" } else { "" }
    )
}

/// A segment formatted, but for its first step's register changes.
struct SegmentText {
    /// The first shown step: its line up to the registers, and its
    /// registers, to finish once the registers before it are known.
    first: Option<(String, Regs)>,
    /// Lines after the first step's; each line's step number and byte
    /// offset in `rest` (`u64::MAX` for event lines).
    rest: String,
    index: Vec<(u64, usize)>,
    last_regs: Option<Regs>,
    /// Steps it shows.
    shown: u64,
}

/// The pid and comm columns of the running task.
fn task_columns(task: Option<&TaskId>) -> String {
    match task {
        Some(t) => format!("{:>7} {:<15} ", t.pid, t.comm.as_str()),
        None => format!("{:>7} {:<15} ", "-", "-"),
    }
}

fn in_window(options: &ListingOptions, step: u64) -> bool {
    let from = options.from.unwrap_or(0);
    step >= from && options.count.is_none_or(|c| step < from.saturating_add(c))
}

fn format_segment(
    info: &SegmentInfo,
    records: &mut Records<'_>,
    symbols: &Symbolizer,
    options: &ListingOptions,
) -> SegmentText {
    let mut f = LineFormatter::new(symbols, options);
    let mut out = SegmentText {
        first: None,
        rest: String::new(),
        index: Vec::new(),
        last_regs: None,
        shown: 0,
    };
    let mut prev: Option<Regs> = None;
    let mut number = info.first_step;
    let mut pending_events = String::new();
    let mut tasks = Selection::new(&options.tasks);
    let mut columns = if options.task_columns {
        task_columns(None)
    } else {
        String::new()
    };
    while let Some(r) = records.next_record() {
        match r {
            RecordRef::Event(e) => {
                if tasks.follow(e) && options.task_columns {
                    columns = task_columns(tasks.current());
                }
                // Where the recorder cut segments, not what ran.
                if tasks.selected() && !matches!(e, Event::Running { .. }) {
                    let _ = writeln!(
                        pending_events,
                        "{:>10} -- {}",
                        "",
                        crate::event_text::describe_event(e)
                    );
                }
                if matches!(e, Event::Gap { .. } | Event::TraceStop(_)) {
                    prev = None;
                }
            }
            RecordRef::Step(_) if !tasks.selected() => {
                // Another task's: the next shown step lists every register.
                prev = None;
                pending_events.clear();
                number = number.saturating_add(1);
            }
            RecordRef::Step(s) => {
                if in_window(options, number) {
                    out.shown += 1;
                    let text = f.describe(s);
                    if number == info.first_step {
                        out.first = Some((format!("{number:>10} {columns}{text}"), s.regs));
                        if !pending_events.is_empty() {
                            out.index.push((u64::MAX, 0));
                            out.rest.push_str(&pending_events);
                        }
                    } else {
                        if !pending_events.is_empty() {
                            out.index.push((u64::MAX, out.rest.len()));
                            out.rest.push_str(&pending_events);
                        }
                        out.index.push((number, out.rest.len()));
                        let _ = writeln!(
                            out.rest,
                            "{number:>10} {columns}{text} {}",
                            changed(prev.as_ref(), &s.regs)
                        );
                    }
                }
                pending_events.clear();
                if let Some(n) = syscalls::number_of(s) {
                    let _ = writeln!(
                        pending_events,
                        "{:>10} -- system call {} ({n})",
                        "",
                        syscalls::name(n)
                    );
                }
                prev = Some(s.regs);
                number = number.saturating_add(1);
            }
        }
    }
    if !pending_events.is_empty() && in_window(options, number.saturating_sub(1)) {
        out.index.push((u64::MAX, out.rest.len()));
        out.rest.push_str(&pending_events);
    }
    out.last_regs = prev;
    out
}

/// Segments that hold steps of the window, and the window's first step
/// (without `--from`, the trace's: a wrapped trace starts past step 0).
fn window_segments(trace: &Trace, options: &ListingOptions) -> Result<(Vec<SegmentInfo>, u64)> {
    let (first, end) = trace.step_range().ok_or_else(|| AnalyzeError::NoSteps)?;
    let from = options.from.unwrap_or(first);
    if from >= end {
        return Err(AnalyzeError::WindowOutside {
            from,
            last: end - 1,
        });
    }
    let to = options.count.map_or(u64::MAX, |c| from.saturating_add(c));
    let segments = trace
        .segments
        .iter()
        .filter(|s| s.first_step < to && s.first_step.saturating_add(s.steps) > from)
        .copied()
        .collect();
    Ok((segments, from))
}

/// Runs the listing, handing `emit` each line with its step number
/// (`None` for events) in trace order.
fn run(
    trace: &Trace,
    symbols: &Symbolizer,
    options: &ListingOptions,
    progress: Progress<'_>,
    mut emit: impl FnMut(Option<u64>, &str) -> Result<()>,
) -> Result<u64> {
    let (segments, from) = window_segments(trace, options)?;
    let mut shown = 0u64;
    let options = &ListingOptions {
        from: Some(from),
        ..options.clone()
    };
    let mut carried: Option<Regs> = None;
    let mut expected: Option<u64> = None;
    trace.for_each_ordered(
        &segments,
        |info, records| format_segment(info, records, symbols, options),
        |chunk| {
            if expected.is_some_and(|e| e != chunk.info.first_step) {
                carried = None;
            }
            expected = Some(chunk.info.first_step.saturating_add(chunk.info.steps));
            let text = match chunk.result {
                Ok(t) => t,
                Err(why) => {
                    carried = None;
                    return emit(
                        None,
                        &format!(
                            "{:>10} -- segment with steps {}..{} does not decode: {why}\n",
                            "",
                            chunk.info.first_step,
                            chunk.info.first_step.saturating_add(chunk.info.steps)
                        ),
                    );
                }
            };
            // Events before the first step come first in `rest`.
            let mut index = text.index.iter().peekable();
            if let Some((u64::MAX, 0)) = index.peek() {
                let end = text.index.get(1).map_or(text.rest.len(), |x| x.1);
                emit(None, &text.rest[..end])?;
                index.next();
            }
            if let Some((prefix, regs)) = &text.first {
                emit(
                    Some(chunk.info.first_step),
                    &format!("{prefix} {}\n", changed(carried.as_ref(), regs)),
                )?;
            }
            let offsets: Vec<&(u64, usize)> = index.collect();
            for (i, (step, start)) in offsets.iter().enumerate() {
                let end = offsets.get(i + 1).map_or(text.rest.len(), |n| n.1);
                emit(
                    (*step != u64::MAX).then_some(*step),
                    &text.rest[*start..end],
                )?;
            }
            carried = text.last_regs;
            shown += text.shown;
            Ok(())
        },
        progress,
    )?;
    Ok(shown)
}

/// Writes the listing (or its window) to `out`; returns how many steps it
/// shows.
pub fn write(
    trace: &Trace,
    symbols: &Symbolizer,
    options: &ListingOptions,
    out: &mut impl Write,
    progress: Progress<'_>,
) -> Result<u64> {
    out.write_all(header(options).as_bytes())?;
    run(trace, symbols, options, progress, |_, text| {
        out.write_all(text.as_bytes())?;
        Ok(())
    })
}

/// Writes the listing into `dir` as files of `STEPS_PER_FILE` steps,
/// named by their first step. Returns how many files it wrote and how
/// many steps they show.
pub fn write_files(
    trace: &Trace,
    symbols: &Symbolizer,
    options: &ListingOptions,
    dir: &Path,
    progress: Progress<'_>,
) -> Result<(usize, u64)> {
    std::fs::create_dir_all(dir).map_err(|source| AnalyzeError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut file: Option<(std::io::BufWriter<std::fs::File>, u64)> = None;
    let mut files = 0;
    let shown = run(trace, symbols, options, progress, |step, text| {
        let number = step.unwrap_or(0);
        let full = file
            .as_ref()
            .is_some_and(|(_, first)| step.is_some() && number >= first + STEPS_PER_FILE);
        if file.is_none() || full {
            let first = step.unwrap_or(0) / STEPS_PER_FILE * STEPS_PER_FILE;
            let path = dir.join(format!("listing-{first:012}.txt"));
            let f = std::fs::File::create(&path).map_err(|source| AnalyzeError::Write {
                path: path.clone(),
                source,
            })?;
            if let Some((mut old, _)) = file.take() {
                old.flush()?;
            }
            let mut f = std::io::BufWriter::new(f);
            f.write_all(header(options).as_bytes())?;
            file = Some((f, first));
            files += 1;
        }
        if let Some((f, _)) = file.as_mut() {
            f.write_all(text.as_bytes())?;
        }
        Ok(())
    })?;
    if let Some((mut f, _)) = file {
        f.flush()?;
    }
    Ok((files, shown))
}
