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
use crate::symbols::{Symbolizer, UNKNOWN_FUNC};
use crate::syscalls;

/// Lines a block holds before it is written out in parts.
pub const BLOCK_LINES: usize = 65_536;

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
    text: Text,
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

/// Writes a nest diagram as the level engine runs.
pub struct NestWriter<'a, W: Write> {
    out: W,
    symbols: &'a Symbolizer,
    block: Vec<Line>,
    /// Entry line of open frames in the current block, by (cr3, task,
    /// depth, entry step).
    open: FxHashMap<FrameKey, usize>,
    nesting: usize,
    error: Option<std::io::Error>,
    pub lines: u64,
    pub divided: u64,
}

impl<'a, W: Write> NestWriter<'a, W> {
    pub fn new(out: W, symbols: &'a Symbolizer) -> Self {
        NestWriter {
            out,
            symbols,
            block: Vec::new(),
            open: FxHashMap::default(),
            nesting: 0,
            error: None,
            lines: 0,
            divided: 0,
        }
    }

    /// The column legend.
    pub fn header(&mut self, title: &str) {
        let text = format!(
            "# {title}\n# {:>10} {:>10} {:>8}  routine (indented two spaces a call level; \
             counts are steps, total includes callees and interrupts)\n",
            "step", "total", "self"
        );
        self.write(&text);
    }

    fn write(&mut self, text: &str) {
        if self.error.is_none() {
            if let Err(e) = self.out.write_all(text.as_bytes()) {
                self.error = Some(e);
            }
        }
    }

    fn flush_block(&mut self) {
        let Some(min) = self.block.iter().map(|l| l.depth).min() else {
            return;
        };
        let mut text = String::new();
        for line in std::mem::take(&mut self.block) {
            let indent = 2 * (line.depth - min + self.nesting);
            let (total, own) = match line.counts {
                Some((t, s)) => (t.to_string(), s.to_string()),
                None => ("-".into(), "-".into()),
            };
            let body = match &line.text {
                Text::Entry {
                    name,
                    tag,
                    leaf: true,
                } => format!("{name}();{tag}"),
                Text::Entry {
                    name,
                    tag,
                    leaf: false,
                } => format!("{name}() {{{tag}"),
                Text::Close { name, how } => match how {
                    ExitKind::Return => format!("}} /* {name} */"),
                    ExitKind::Unwound => format!("}} /* {name}, unwound */"),
                    ExitKind::JumpedAway => format!("}} /* {name}, jumped away */"),
                    ExitKind::TraceEnd => format!("}} /* {name}, open at trace end */"),
                },
                Text::Note(n) => {
                    text.push_str(&format!(
                        "  {:>10} {:>10} {:>8}  {:indent$}/* {n} */\n",
                        line.step, "", "", ""
                    ));
                    self.lines += 1;
                    continue;
                }
                Text::Mark(m) => {
                    text.push_str(&format!(
                        "  {:>10} {:>10} {:>8}  {:indent$}{DIVIDED} {m}\n",
                        line.step, "", "", ""
                    ));
                    continue;
                }
            };
            text.push_str(&format!(
                "  {:>10} {total:>10} {own:>8}  {:indent$}{body}\n",
                line.step, ""
            ));
            self.lines += 1;
        }
        self.open.clear();
        self.write(&text);
    }

    fn push(&mut self, line: Line) {
        if self.block.len() >= BLOCK_LINES {
            self.flush_block();
        }
        self.block.push(line);
    }

    /// Writes what is buffered; returns the first write error.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.flush_block();
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

impl<W: Write> LevelSink for NestWriter<'_, W> {
    fn big_level(&mut self, level: &BigLevel) {
        self.flush_block();
        self.nesting = level.nesting;
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
            BigLevelCause::SystemCall { number: Some(n) } => {
                format!("system call {} ({n}){during}", syscalls::name(n))
            }
            BigLevelCause::SystemCall { number: None } => format!("system call{during}"),
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
            "  {:>10} {:>10} {:>8}  {:indent$}==> {what} (address space {:#x})\n",
            level.step,
            "",
            "",
            "",
            level.cr3,
            indent = 2 * level.nesting
        );
        self.write(&text);
    }

    fn enter(&mut self, frame: &FrameView) {
        let tag = match frame.kind {
            EntryKind::Root | EntryKind::Call => String::new(),
            EntryKind::Jump { .. } => "  [jmp]".into(),
            EntryKind::Interrupt { vector } => format!("  [{}]", vector_name(vector)),
            EntryKind::SystemCall => "  [system call]".into(),
        };
        let name = routine_name(self.symbols, frame);
        self.open.insert(frame_key(frame), self.block.len());
        self.push(Line {
            step: frame.entry_step,
            depth: frame.depth,
            counts: None,
            text: Text::Entry {
                name,
                tag,
                leaf: false,
            },
        });
    }

    fn exit(&mut self, frame: &FrameView, how: ExitKind) {
        let counts = Some((frame.total_steps, frame.self_steps));
        if let Some(i) = self.open.remove(&frame_key(frame)) {
            let last = i + 1 == self.block.len();
            if let Some(line) = self.block.get_mut(i) {
                line.counts = counts;
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
        let name = routine_name(self.symbols, frame);
        self.push(Line {
            step: frame.last_step,
            depth: frame.depth,
            counts,
            text: Text::Close { name, how },
        });
    }

    fn note(&mut self, step: u64, depth: usize, text: &str) {
        self.push(Line {
            step,
            depth,
            counts: None,
            text: Text::Note(text.to_string()),
        });
    }

    fn irregular(&mut self, step: u64, depth: usize, what: Irregular) {
        self.divided += 1;
        self.push(Line {
            step,
            depth,
            counts: None,
            text: Text::Mark(what.describe()),
        });
    }
}
