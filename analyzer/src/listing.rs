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
use vtrace_storage::{Event, MemoryValue, RecordRef, Regs, Step, REG_NAMES};

use crate::error::{AnalyzeError, Result};
use crate::input::{Progress, Records, SegmentInfo, Trace};
use crate::insn::{InsnCache, InsnInfo};
use crate::memory_values::{self, Access};
use crate::syscalls;
use crate::tasks::{Selection, TaskFilter, TaskId};
use vtrace_image::symbols::{cr3_root, Symbolizer};

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
    /// A CPU column (for traces of several CPUs); set from the trace.
    pub cpu_column: bool,
    /// Only this CPU's steps (and the events between them); set from the
    /// trace's [`Trace::select_cpu`].
    pub cpu: Option<u32>,
    /// Each step's memory accesses and their values where exact
    /// (`| mem w 0x7ff0:8=0x1005 r 0x7ff8:8=?`).
    pub values: bool,
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
    let mut task = if options.cpu_column {
        format!("{:>3} ", "cpu")
    } else {
        String::new()
    };
    if options.task_columns {
        task.push_str(&format!("{:>7} {:<15} ", "pid", "comm"));
    }
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
#[derive(Default)]
struct SegmentText {
    /// The first shown step: its line up to the registers, its registers
    /// and its CPU, to finish once the registers before it are known.
    first: Option<(String, Regs, u32)>,
    /// Lines after the first step's; each line's step number and byte
    /// offset in `rest` (`u64::MAX` for event lines).
    rest: String,
    index: Vec<(u64, usize)>,
    /// Each CPU's registers after its last step here.
    last_regs: FxHashMap<u32, Regs>,
    /// Steps it shows.
    shown: u64,
    /// With `--values`, the first step's instruction (its accesses are
    /// known with the registers before it) and, where it branches through
    /// memory, the next step's pc.
    first_memory: Option<InsnInfo>,
    /// The memory values recorded for the first step.
    first_recorded: Vec<MemoryValue>,
    first_target: Option<u64>,
    /// A shown step's branch target read waiting for the next step.
    waiting: Option<Awaiting>,
}

/// A shown step's branch target read, whose value is the next step's pc:
/// `?` until it comes.
struct Awaiting {
    cpu: u32,
    /// Where the `?` is in `rest` (none: the segment's first step).
    at: Option<usize>,
    size: u16,
}

/// The registers changed, then the memory text (` | mem ...`; `mem ...`
/// alone where no register changed, after the line's own `|`).
fn with_memory(registers: String, memory: &str) -> String {
    match (registers.is_empty(), memory.strip_prefix(" | ")) {
        (true, Some(memory)) => memory.to_string(),
        _ => registers + memory,
    }
}

/// `--values`: a step's accesses, writes first (a branch target's read
/// comes last, to be filled in once the next step is known).
fn memory_text(reads: &[Access], writes: &[Access]) -> String {
    let mut out = String::new();
    for (kind, list) in [("w", writes), ("r", reads)] {
        for a in list {
            let value = a.value.map_or("?".to_string(), |v| format!("{v:#x}"));
            let _ = write!(out, " {kind} {:#x}:{}={value}", a.addr, a.size);
        }
    }
    match out.is_empty() {
        true => out,
        false => format!(" | mem{out}"),
    }
}

/// A step the listing shows.
struct Shown<'a> {
    number: u64,
    cpu: u32,
    regs: &'a Regs,
    /// The registers of its CPU's step before, where known.
    before: Option<&'a Regs>,
    /// The memory values recorded for it (`run --record-values`).
    recorded: &'a [MemoryValue],
}

impl SegmentText {
    /// Adds a step's line (up to its registers: `line`; its memory text
    /// after them), after the events before it.
    fn push_step(
        &mut self,
        info: &SegmentInfo,
        step: Shown<'_>,
        (line, memory): (String, &str),
        events: &str,
    ) {
        self.shown += 1;
        if step.number == info.first_step {
            // Its registers are finished once the segment before is known.
            self.first = Some((line, *step.regs, step.cpu));
            if !events.is_empty() {
                self.index.push((u64::MAX, 0));
                self.rest.push_str(events);
            }
            return;
        }
        if !events.is_empty() {
            self.index.push((u64::MAX, self.rest.len()));
            self.rest.push_str(events);
        }
        self.index.push((step.number, self.rest.len()));
        let after = with_memory(changed(step.before, step.regs), memory);
        let _ = writeln!(self.rest, "{line} {after}");
    }

    /// `--values`: the memory text of shown step `s` (the registers
    /// before it `before`), and whether its last value waits for the next
    /// step's pc.
    fn memory(
        &mut self,
        info: &SegmentInfo,
        (number, cpu): (u64, u32),
        insn: &InsnInfo,
        s: &Step,
        (before, recorded): (Option<&Regs>, &[MemoryValue]),
    ) -> (String, Option<Awaiting>) {
        if number == info.first_step {
            self.first_memory = Some(insn.clone());
            self.first_recorded = recorded.to_vec();
            let awaits = memory_values::accesses(
                insn,
                (&s.regs, &s.regs),
                None,
                &[],
                &mut Vec::new(),
                &mut Vec::new(),
            );
            let waiting = awaits.map(|_| Awaiting {
                cpu,
                at: None,
                size: 8,
            });
            return (String::new(), waiting);
        }
        let Some(before) = before else {
            return (" | mem ? (the registers before are not known)".into(), None);
        };
        let (mut reads, mut writes) = (Vec::new(), Vec::new());
        let around = (before, &s.regs);
        let awaits = memory_values::accesses(insn, around, None, recorded, &mut reads, &mut writes);
        let text = memory_text(&reads, &writes);
        // The `?` at the end of the line: its offset once it is pushed.
        let waiting = awaits.and_then(|i| reads.get(i)).map(|a| Awaiting {
            cpu,
            at: Some(usize::MAX),
            size: a.size,
        });
        (text, waiting)
    }

    /// Adds shown step `s` (`line` up to its registers), with its memory
    /// text under `--values`.
    fn show(
        &mut self,
        info: &SegmentInfo,
        f: &mut LineFormatter<'_>,
        s: &Step,
        step: Shown<'_>,
        line: String,
        events: &str,
    ) {
        let (memory, awaits) = match f.options.values {
            true => {
                if let Some(w) = self.waiting.take_if(|w| w.cpu == step.cpu) {
                    self.fill(w, s.pc);
                }
                let insn = f.insns.get(s);
                let around = (step.before, step.recorded);
                self.memory(info, (step.number, step.cpu), insn, s, around)
            }
            false => (String::new(), None),
        };
        self.push_step(info, step, (line, &memory), events);
        // The `?` the line ends with.
        self.waiting = awaits.map(|w| Awaiting {
            at: w.at.map(|_| self.rest.len() - 2),
            ..w
        });
    }

    /// An interrupt's delivery or a break in the trace: the next step on
    /// `cpu` is not where a branch went.
    fn forget_branch(&mut self, e: &Event, cpu: u32) {
        if matches!(
            e,
            Event::Interrupt { .. } | Event::Gap { .. } | Event::TraceStop(_)
        ) {
            self.waiting = self.waiting.take().filter(|w| w.cpu != cpu);
        }
    }

    /// The step after a branch through memory came to `pc` on the same
    /// CPU with nothing between: its `?` becomes the target.
    fn fill(&mut self, waiting: Awaiting, pc: u64) {
        match waiting.at {
            None => self.first_target = Some(pc),
            Some(at) if self.rest.get(at..) == Some("?\n") => {
                self.rest.truncate(at);
                let target = memory_values::target_value(pc, waiting.size);
                let _ = writeln!(self.rest, "{target:#x}");
            }
            Some(_) => {}
        }
    }
}

/// The pid and comm columns of the running task.
fn task_columns(task: Option<&TaskId>) -> String {
    match task {
        Some(t) => format!("{:>7} {:<15} ", t.pid, t.comm.as_str()),
        None => format!("{:>7} {:<15} ", "-", "-"),
    }
}

/// Whether the listing shows event `e` of a CPU it shows (`on_cpu`) or
/// another's: tracing starts and stops on every CPU at once; a
/// [`Event::Running`] is where the recorder cut segments, not what ran,
/// and the CPU column says what an [`Event::Cpu`] does.
fn shows_event(e: &Event, on_cpu: bool) -> bool {
    match e {
        // A step's recorded values are shown with it (`--values`).
        Event::Running { .. } | Event::Cpu(_) | Event::MemoryValues(_) => false,
        Event::TraceStart(_) | Event::TraceStop(_) => true,
        _ => on_cpu,
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
    let mut out = SegmentText::default();
    // Registers are compared with the same CPU's step before.
    let mut prev: FxHashMap<u32, Regs> = FxHashMap::default();
    let mut cpu = 0u32;
    let mut number = info.first_step;
    let mut pending_events = String::new();
    let mut recorded = Vec::new();
    let mut tasks = Selection::new(&options.tasks);
    let mut columns = if options.task_columns {
        task_columns(None)
    } else {
        String::new()
    };
    while let Some(r) = records.next_record() {
        let on_cpu = options.cpu.is_none_or(|c| c == cpu);
        match r {
            RecordRef::Event(e) => {
                // The CPU column says a CPU event, the task columns its task.
                match e {
                    Event::Cpu(c) => cpu = *c,
                    Event::MemoryValues(values) => recorded.clone_from(values),
                    _ => {}
                }
                if tasks.follow(e) && options.task_columns {
                    columns = task_columns(tasks.current());
                }
                if tasks.selected() && shows_event(e, on_cpu) {
                    let _ = writeln!(
                        pending_events,
                        "{:>10} -- {}",
                        "",
                        crate::event_text::describe_event(e)
                    );
                }
                match e {
                    Event::TraceStop(_) => prev.clear(),
                    Event::Gap { .. } => {
                        prev.remove(&cpu);
                    }
                    _ => {}
                }
                out.forget_branch(e, cpu);
            }
            RecordRef::Step(_) if !on_cpu => {
                pending_events.clear();
                recorded.clear();
                number = number.saturating_add(1);
            }
            RecordRef::Step(_) if !tasks.selected() => {
                // Another task's: the next shown step lists every register.
                prev.remove(&cpu);
                pending_events.clear();
                recorded.clear();
                number = number.saturating_add(1);
            }
            RecordRef::Step(s) => {
                if in_window(options, number) {
                    let cpu_column = match options.cpu_column {
                        true => format!("{cpu:>3} "),
                        false => String::new(),
                    };
                    let line = format!("{number:>10} {cpu_column}{columns}{}", f.describe(s));
                    let shown = Shown {
                        number,
                        cpu,
                        regs: &s.regs,
                        before: prev.get(&cpu),
                        recorded: &recorded,
                    };
                    out.show(info, &mut f, s, shown, line, &pending_events);
                }
                pending_events.clear();
                recorded.clear();
                if let Some(call) = syscalls::made_by(s) {
                    let _ = writeln!(pending_events, "{:>10} -- system call {call}", "");
                }
                prev.insert(cpu, s.regs);
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
    let mut carried: FxHashMap<u32, Regs> = FxHashMap::default();
    let mut expected: Option<u64> = None;
    trace.for_each_ordered(
        &segments,
        |info, records| format_segment(info, records, symbols, options),
        |chunk| {
            if expected.is_some_and(|e| e != chunk.info.first_step) {
                carried.clear();
            }
            expected = Some(chunk.info.first_step.saturating_add(chunk.info.steps));
            let text = match chunk.result {
                Ok(t) => t,
                Err(why) => {
                    carried.clear();
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
            if let Some((prefix, regs, cpu)) = &text.first {
                let before = carried.get(cpu);
                let memory = match (&text.first_memory, before) {
                    (Some(insn), Some(before)) => {
                        let (mut reads, mut writes) = (Vec::new(), Vec::new());
                        let around = (before, regs);
                        memory_values::accesses(
                            insn,
                            around,
                            text.first_target,
                            &text.first_recorded,
                            &mut reads,
                            &mut writes,
                        );
                        memory_text(&reads, &writes)
                    }
                    (Some(_), None) => " | mem ? (the registers before are not known)".into(),
                    (None, _) => String::new(),
                };
                emit(
                    Some(chunk.info.first_step),
                    &format!("{prefix} {}\n", with_memory(changed(before, regs), &memory)),
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

/// `options` as `trace` settles them: a CPU column where it has several
/// CPUs (or `options` ask for one), and `--cpu N`'s CPU alone.
fn for_trace(options: &ListingOptions, trace: &Trace) -> ListingOptions {
    ListingOptions {
        cpu_column: options.cpu_column || trace.metadata.cpu_count() > 1,
        cpu: trace.selected_cpu(),
        ..options.clone()
    }
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
    let options = &for_trace(options, trace);
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
    let options = &for_trace(options, trace);
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
