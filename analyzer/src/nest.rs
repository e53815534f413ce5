//! The nest diagram: routine entries and exits indented by call depth, in
//! the style of ftrace's function_graph, one block per big level.
//!
//! A block is buffered until its big level ends, so its lines can be
//! indented from the block's smallest depth and a routine that returns
//! within the block gets its step counts on its entry line (a leaf prints
//! as one line, `name();`). A routine still open when its block ends gets
//! a closing `}` line with its counts later. Blocks longer than
//! [`BLOCK_LINES`] are written out in parts, which keeps memory bounded.

use std::io::Write;

use rustc_hash::FxHashMap;

use crate::levels::{
    BigLevel, BigLevelCause, EntryKind, ExitKind, FrameView, Irregular, LevelSink,
};
use crate::naming::{routine_name, vector_name};
use crate::routine_filter::RoutineFilter;
use vtrace_image::symbols::{Symbolizer, UNKNOWN_FUNC};

mod diagram;

pub use diagram::{DiagramTotals, NestDiagram};

/// Lines a block holds before it is written out in parts.
pub const BLOCK_LINES: usize = 65_536;

/// Bytes of diagram between two flushes of the output.
const FLUSH_BYTES: usize = 64 << 10;

/// The mark irregular control flow gets.
pub const DIVIDED: &str = "## divided level ##";

#[derive(Debug)]
enum Text {
    Entry {
        name: String,
        tag: String,
        leaf: bool,
    },
    Close {
        name: String,
        how: ExitKind,
    },
    Mark(String),
    /// A comment line, as ftrace's function_graph prints trace_printk.
    Note(String),
}

#[derive(Debug)]
struct Line {
    step: u64,
    depth: usize,
    counts: Option<(u64, u64)>,
    /// What the routine returned, on its leaf or close line (`--retval`).
    returned: Option<u64>,
    text: Text,
}

/// A return value as ftrace's funcgraph-retval prints it: an error number
/// (-1 to -4095, Linux's `IS_ERR_VALUE` range) in signed decimal, anything
/// else in hex.
pub fn format_return_value(value: u64) -> String {
    match value as i64 {
        -4095..=-1 => (value as i64).to_string(),
        _ => format!("{value:#x}"),
    }
}

type FrameKey = (u64, Option<u32>, usize, u64);

fn frame_key(frame: &FrameView) -> FrameKey {
    (
        frame.cr3,
        frame.task.map(|t| t.tid),
        frame.depth,
        frame.entry_step,
    )
}

/// What a nest diagram shows, beyond its defaults (uftrace's filters and
/// ftrace's duration column).
#[derive(Clone, Debug, Default)]
pub struct NestOptions {
    /// Virtual nanoseconds per step: adds a duration column (a routine's
    /// total steps as virtual time), as ftrace's function_graph has.
    pub ns_per_step: Option<u64>,
    /// Call levels shown below each block's outermost routines (1: only
    /// those); a routine at the last level shown prints as `name();`.
    pub depth: Option<usize>,
    /// Only the calls of routines of this name, with everything they
    /// call and every interrupt taken meanwhile.
    pub function: Option<String>,
    /// Only lines of steps from `from` on, before `to`.
    pub from: Option<u64>,
    /// Before this step.
    pub to: Option<u64>,
    /// Only the big levels that run in this address space (its
    /// page-table root).
    pub space: Option<u64>,
    /// Routines left out with all they call and the interrupts taken
    /// meanwhile (their steps still count in their callers' totals).
    pub exclude: RoutineFilter,
    /// Leave out calls of fewer total steps than this, with all they
    /// called (uftrace's `-t`). A routine still open when its block ends
    /// (interrupted, switched away from) is shown whatever it costs.
    pub min_steps: Option<u64>,
    /// Print each routine's return value (RAX after its `ret`) on its leaf
    /// or close line, as ftrace's funcgraph-retval.
    pub retval: bool,
}

impl NestOptions {
    fn in_window(&self, step: u64) -> bool {
        self.from.is_none_or(|f| step >= f) && self.to.is_none_or(|t| step < t)
    }
}

/// Whose call stack a line is on: what `--function` follows.
type StackId = (u64, Option<u32>);

/// Writes a nest diagram as the level engine runs: the sink a
/// [`NestDiagram`] feeds, for a caller that drives the engine itself.
pub struct NestWriter<'a, W: Write> {
    out: W,
    symbols: &'a Symbolizer,
    options: NestOptions,
    /// The stack of the current big level, and whether its address space
    /// is shown (`--space`).
    stack: StackId,
    space_shown: bool,
    /// Per stack, the depth of the `--function` routine it is inside.
    inside: FxHashMap<StackId, usize>,
    /// Per stack, the depth of the `--exclude`d routine it is inside.
    hidden: FxHashMap<StackId, usize>,
    /// A big level's line (its step, text and nesting), held back while
    /// the routines its boundary ended (at earlier steps) are closed, so
    /// step numbers only grow down the page.
    pending: Option<(u64, String, usize)>,
    block: Vec<Line>,
    /// Entry line of open frames in the current block, by (cr3, task,
    /// depth, entry step).
    open: FxHashMap<FrameKey, usize>,
    nesting: usize,
    /// Bytes written since the output was last flushed.
    unflushed: usize,
    error: Option<std::io::Error>,
    /// Lines written.
    pub lines: u64,
    /// `## divided level ##` markers among them.
    pub divided: u64,
}

impl<'a, W: Write> std::fmt::Debug for NestWriter<'a, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NestWriter").finish_non_exhaustive()
    }
}

impl<'a, W: Write> NestWriter<'a, W> {
    /// A writer of the diagram to `out`, naming routines with `symbols`.
    pub fn new(out: W, symbols: &'a Symbolizer) -> Self {
        NestWriter {
            out,
            symbols,
            options: NestOptions::default(),
            stack: (0, None),
            space_shown: true,
            inside: FxHashMap::default(),
            hidden: FxHashMap::default(),
            pending: None,
            block: Vec::new(),
            open: FxHashMap::default(),
            nesting: 0,
            unflushed: 0,
            error: None,
            lines: 0,
            divided: 0,
        }
    }

    /// A writer that shows what `options` asks for.
    pub fn with_options(out: W, symbols: &'a Symbolizer, options: NestOptions) -> Self {
        NestWriter {
            options,
            ..NestWriter::new(out, symbols)
        }
    }

    /// The column legend.
    pub fn header(&mut self, title: &str) {
        let (duration, about) = match self.options.ns_per_step {
            Some(ns) => (
                format!(" {:>14}", "duration"),
                format!("; duration is total as virtual time, {ns} ns a step"),
            ),
            None => (String::new(), String::new()),
        };
        let text = format!(
            "# {title}\n# {:>10} {:>10} {:>8}{duration}  routine (indented two spaces a call \
             level; counts are steps, total includes callees and interrupts{about})\n",
            "step", "total", "self"
        );
        self.write(&text);
        // The legend at once: `| head -2` needs nothing more.
        self.unflushed = 0;
        if let Err(e) = self.out.flush() {
            self.error.get_or_insert(e);
        }
    }

    /// A comment line, `# text` (a CPU's part of a diagram of several).
    pub fn comment(&mut self, text: &str) {
        self.write(&format!("# {text}\n"));
    }

    /// The count columns of a line: total, self and, with a per-step
    /// clock, the total's virtual duration.
    fn columns(&self, counts: Option<(u64, u64)>) -> String {
        let (total, own) = match counts {
            Some((t, s)) => (t.to_string(), s.to_string()),
            None => ("-".into(), "-".into()),
        };
        let duration = match (self.options.ns_per_step, counts) {
            (None, _) => String::new(),
            (Some(ns), Some((t, _))) => format!(
                " {:>14}",
                format!("{:.3} us", t.saturating_mul(ns) as f64 / 1000.0)
            ),
            (Some(_), None) => format!(" {:>14}", "-"),
        };
        format!("{total:>10} {own:>8}{duration}")
    }

    /// The empty count columns of a line without counts.
    fn blank(&self) -> String {
        let width = 10 + 1 + 8 + self.options.ns_per_step.map_or(0, |_| 15);
        format!("{:width$}", "")
    }

    /// Whether lines of the current stack are shown: its address space
    /// is (`--space`) and, with `--function`, it is inside the routine.
    fn showing(&self) -> bool {
        self.space_shown
            && (self.options.function.is_none() || self.inside.contains_key(&self.stack))
            && !self.hidden.contains_key(&self.stack)
    }

    fn write(&mut self, text: &str) {
        if self.error.is_some() {
            return;
        }
        self.unflushed = self.unflushed.saturating_add(text.len());
        // Handed on in parts however the output is buffered: a reader
        // that wants only the first lines (`| head`) gets them at once,
        // and its going away shows at the next part, which stops the pass
        // (see `stopped`).
        let result = match self.unflushed >= FLUSH_BYTES {
            true => {
                self.unflushed = 0;
                self.out
                    .write_all(text.as_bytes())
                    .and_then(|()| self.out.flush())
            }
            false => self.out.write_all(text.as_bytes()),
        };
        if let Err(e) = result {
            self.error = Some(e);
        }
    }

    fn flush_block(&mut self) {
        let Some(min) = self.block.iter().map(|l| l.depth).min() else {
            return;
        };
        let mut text = String::new();
        let blank = self.blank();
        // With --depth: the depth whose close line is left out, after a
        // routine at the last level shown printed as a leaf.
        let mut collapsed: Option<usize> = None;
        for line in std::mem::take(&mut self.block) {
            let level = line.depth - min;
            if self.options.depth.is_some_and(|d| level >= d) {
                continue;
            }
            let last_level = self.options.depth.is_some_and(|d| level + 1 == d);
            if !self.options.in_window(line.step) {
                continue;
            }
            let indent = 2 * (level + self.nesting);
            let body = match &line.text {
                Text::Entry { name, tag, leaf }
                    if *leaf || (last_level && line.counts.is_some()) =>
                {
                    if !*leaf {
                        collapsed = Some(line.depth);
                    }
                    match line.returned {
                        Some(v) => format!("{name}();{tag} /* = {} */", format_return_value(v)),
                        None => format!("{name}();{tag}"),
                    }
                }
                Text::Entry { name, tag, .. } => format!("{name}() {{{tag}"),
                Text::Close { .. } if collapsed == Some(line.depth) => {
                    collapsed = None;
                    continue;
                }
                Text::Close { name, how } => match how {
                    ExitKind::Return => match line.returned {
                        Some(v) => format!("}} /* {name} = {} */", format_return_value(v)),
                        None => format!("}} /* {name} */"),
                    },
                    ExitKind::Unwound => format!("}} /* {name}, unwound */"),
                    ExitKind::JumpedAway => format!("}} /* {name}, jumped away */"),
                    ExitKind::TraceEnd => format!("}} /* {name}, open at trace end */"),
                },
                Text::Note(n) => {
                    text.push_str(&format!(
                        "  {:>10} {blank}  {:indent$}/* {n} */\n",
                        line.step, ""
                    ));
                    self.lines += 1;
                    continue;
                }
                Text::Mark(m) => {
                    text.push_str(&format!(
                        "  {:>10} {blank}  {:indent$}{DIVIDED} {m}\n",
                        line.step, ""
                    ));
                    continue;
                }
            };
            text.push_str(&format!(
                "  {:>10} {}  {:indent$}{body}\n",
                line.step,
                self.columns(line.counts),
                ""
            ));
            self.lines += 1;
        }
        self.open.clear();
        self.write(&text);
    }

    /// Writes the held-back big level line, after what came before it.
    fn write_pending(&mut self) {
        if let Some((_, text, nesting)) = self.pending.take() {
            self.flush_block();
            self.nesting = nesting;
            self.write(&text);
        }
    }

    fn push(&mut self, line: Line) {
        if let Some((step, _, _)) = &self.pending {
            let earlier = matches!(line.text, Text::Close { .. }) && line.step < *step;
            if !earlier {
                self.write_pending();
            }
        }
        if self.block.len() >= BLOCK_LINES {
            self.flush_block();
        }
        // A return that skips frames is marked before the frames it
        // skipped are closed; their closes (at earlier steps) go first,
        // so step numbers only grow down the page.
        if matches!(line.text, Text::Close { .. }) {
            let marks = self
                .block
                .iter()
                .rev()
                .take_while(|l| matches!(l.text, Text::Mark(_)) && l.step > line.step)
                .count();
            if marks > 0 {
                let at = self.block.len() - marks;
                self.block.insert(at, line);
                return;
            }
        }
        self.block.push(line);
    }

    /// Writes what is buffered; returns the first write error.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.flush_block();
        self.write_pending();
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

impl<W: Write> LevelSink for NestWriter<'_, W> {
    /// A write failed (the reader closed the pipe): nothing more will be
    /// written, so the rest of the trace need not be read.
    fn stopped(&self) -> bool {
        self.error.is_some()
    }
    fn big_level(&mut self, level: &BigLevel) {
        // Marks at the block's end stay with the next lines: routines the
        // irregular flow ended close before them (see `push`).
        let marks = self
            .block
            .iter()
            .rev()
            .take_while(|l| matches!(l.text, Text::Mark(_)))
            .count();
        let kept = self.block.split_off(self.block.len() - marks);
        self.flush_block();
        self.block = kept;
        self.write_pending();
        self.nesting = level.nesting;
        self.stack = (level.cr3, level.task.map(|t| t.tid));
        self.space_shown = self.options.space.is_none_or(|s| s == level.cr3);
        if !self.showing() || !self.options.in_window(level.step) {
            return;
        }
        let during = match level.interrupted {
            Some((func, pc)) if func == UNKNOWN_FUNC => format!(" in {pc:#x}"),
            Some((func, _)) => format!(" in {}", self.symbols.name(func)),
            None => String::new(),
        };
        let what = match level.cause {
            BigLevelCause::TraceStart => "trace start".to_string(),
            BigLevelCause::Interrupt { vector } => {
                format!("interrupt: {}{during}", vector_name(vector))
            }
            BigLevelCause::SystemCall { call: Some(call) } => {
                format!("system call {call}{during}")
            }
            BigLevelCause::SystemCall { call: None } => format!("system call{during}"),
            BigLevelCause::Resume { system_call: false } => "return from interrupt".into(),
            BigLevelCause::Resume { system_call: true } => "return from system call".into(),
            BigLevelCause::Switch { from } => {
                format!("address space switch from {from:#x}")
            }
            BigLevelCause::TaskSwitch { from } => {
                let to = level
                    .task
                    .map_or_else(|| "?".to_string(), |t| t.to_string());
                match from {
                    Some(from) => format!("switch to {to} from {from}"),
                    None => format!("switch to {to}"),
                }
            }
            BigLevelCause::Break => "steps missing before here (gap or tracing paused)".into(),
        };
        let text = format!(
            "  {:>10} {}  {:indent$}==> {what} (address space {:#x}{})\n",
            level.step,
            self.blank(),
            "",
            level.cr3,
            if level.first_run {
                ", its first run"
            } else {
                ""
            },
            indent = 2 * level.nesting
        );
        self.pending = Some((level.step, text, level.nesting));
    }

    fn enter(&mut self, frame: &FrameView) {
        let tag = match frame.kind {
            EntryKind::Root | EntryKind::Call => String::new(),
            EntryKind::Jump { .. } => "  [jmp]".into(),
            EntryKind::Interrupt { vector } => format!("  [{}]", vector_name(vector)),
            EntryKind::SystemCall => "  [system call]".into(),
        };
        if !self.hidden.contains_key(&self.stack)
            && self
                .options
                .exclude
                .excludes(self.symbols, frame.func, frame.entry_pc)
        {
            self.hidden.insert(self.stack, frame.depth);
        }
        let name = routine_name(self.symbols, frame.func, frame.entry_pc);
        if self.options.function.as_deref() == Some(name.as_str())
            && self.space_shown
            && !self.inside.contains_key(&self.stack)
        {
            self.inside.insert(self.stack, frame.depth);
        }
        if !self.showing() {
            return;
        }
        self.open.insert(frame_key(frame), self.block.len());
        self.push(Line {
            step: frame.entry_step,
            depth: frame.depth,
            counts: None,
            returned: None,
            text: Text::Entry {
                name,
                tag,
                leaf: false,
            },
        });
    }

    fn exit(&mut self, frame: &FrameView, how: ExitKind) {
        // Leaving the excluded routine: lines go on after it.
        if self.hidden.get(&self.stack) == Some(&frame.depth) {
            self.hidden.remove(&self.stack);
            return;
        }
        if !self.showing() {
            return;
        }
        // Leaving the --function routine: lines stop after its close.
        if self.inside.get(&self.stack) == Some(&frame.depth) {
            self.inside.remove(&self.stack);
        }
        self.push_exit(frame, how);
    }

    fn note(&mut self, step: u64, depth: usize, text: &str) {
        if !self.showing() {
            return;
        }
        self.push(Line {
            step,
            depth,
            counts: None,
            returned: None,
            text: Text::Note(text.to_string()),
        });
    }

    fn irregular(&mut self, step: u64, depth: usize, what: Irregular) {
        self.divided += 1;
        if !self.showing() {
            return;
        }
        self.push(Line {
            step,
            depth,
            counts: None,
            returned: None,
            text: Text::Mark(what.describe()),
        });
    }
}

impl<W: Write> NestWriter<'_, W> {
    /// A routine's exit: its counts on its entry line where that is in
    /// the block, else a close line.
    fn push_exit(&mut self, frame: &FrameView, how: ExitKind) {
        let counts = Some((frame.total_steps, frame.self_steps));
        let returned = frame.return_value.filter(|_| self.options.retval);
        let short = self
            .options
            .min_steps
            .is_some_and(|m| frame.total_steps < m);
        if let Some(i) = self.open.remove(&frame_key(frame)) {
            if short {
                self.drop_call(i, frame.last_step);
                return;
            }
            let last = i + 1 == self.block.len();
            if let Some(line) = self.block.get_mut(i) {
                line.counts = counts;
                line.returned = returned;
                if let Text::Entry { leaf, .. } = &mut line.text {
                    *leaf = last;
                }
                if last && how == ExitKind::Return {
                    return;
                }
                if last {
                    // A leaf left other than by return: say how.
                    if let Text::Entry { tag, .. } = &mut line.text {
                        tag.push_str(match how {
                            ExitKind::Unwound => "  (unwound)",
                            ExitKind::JumpedAway => "  (jumped away)",
                            ExitKind::TraceEnd => "  (open at trace end)",
                            ExitKind::Return => "",
                        });
                    }
                    return;
                }
            }
        }
        let name = routine_name(self.symbols, frame.func, frame.entry_pc);
        self.push(Line {
            step: frame.last_step,
            depth: frame.depth,
            counts,
            returned,
            text: Text::Close { name, how },
        });
    }

    /// Leaves out a call too short to show (`--min-steps`): its entry line
    /// at `entry` and everything after it, which all ran inside it, but
    /// the marks of the irregular flow that is ending it (after its
    /// `last_step`), which belong to what comes next.
    fn drop_call(&mut self, entry: usize, last_step: u64) {
        let tail = self.block.split_off(entry.min(self.block.len()));
        self.block.extend(
            tail.into_iter()
                .filter(|l| matches!(l.text, Text::Mark(_)) && l.step > last_step),
        );
    }
}
