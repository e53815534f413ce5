//! Per-step export for data tools: a row per step, as Parquet (for DuckDB,
//! Polars, Spark, pandas) or JSON lines.
//!
//! | column        | type                  | what                                           |
//! |---------------|-----------------------|------------------------------------------------|
//! | `step`        | u64                   | step number, as the listing numbers it         |
//! | `virtual_ns`  | u64, null             | step × the clock's ns per step; null when the trace's clock was not per step |
//! | `cr3`         | u64                   | page-table root of the address space (PCID bits cleared) |
//! | `cpl`         | u8                    | privilege level (0 kernel, 3 user)             |
//! | `bitness`     | u8                    | 16, 32 or 64                                   |
//! | `pc`          | u64                   | linear address of the instruction              |
//! | `routine`     | text                  | routine it ran in, as `analyze stats` names it (the level engine's, so a return thunk's steps count as their caller's) |
//! | `pid`, `tid`, `comm` | u32, u32, text, null | the Linux task, where the trace names tasks |
//! | `bytes`       | binary                | the instruction's bytes (JSON: hex)            |
//! | `mnemonic`    | text                  | lower case, as `analyze stats` names it        |
//! | `instruction` | text                  | Intel syntax, numbers as `0x…`                 |
//! | `rax` … `r15`, `rflags` | u64, null   | the value after the step, where the step changed it (every register after a break) |
//! | `reads`, `writes` | list of u64, null | linear addresses of memory operands, from the registers before the step (segment bases count as 0); null where those are not known |
//! | `read_sizes`, `write_sizes` | list of u16, null | each access's width in bytes, in the same order |
//! | `read_values`, `write_values` | list of u64 (items null), null | each access's value where the recorded registers make it exact (`mov`/`movzx`/`movsx` loads and stores, `push`, `pop`, `call`'s return address, `ret`'s and `jmp [m]`'s target, `leave`, `xchg`; see `memory_values.rs`); null where they do not (read-modify-write, compares, string and vector instructions) |
//! | `syscall`     | u64, null             | the number of the system call a user-mode `syscall`, `sysenter` or `int 0x80` makes |
//! | `syscall_name` | text, null           | its name; ` (ia32)` after it where the number indexes the i386 table (see `syscalls.rs`) |
//! | `interrupt`   | u8, null              | vector of an interrupt delivered before the step; not an `int 0x80`'s, which is the `syscall` of the step before (some hosts record its delivery; `events` shows it) |
//! | `events`      | list of text          | events recorded before the step, as the listing words them |
//!
//! Segments are decoded into rows in parallel, completed in trace order
//! (the registers before a segment, each step's routine from the level
//! engine), and written by a thread per output file: a Parquet file has a
//! row group per segment; a directory holds files of about
//! `steps_per_file` steps each, named `step_range=FIRST-END.parquet`
//! (END exclusive), written in parallel.

mod access_lists;
mod chunks;
mod error;
mod event_lists;
mod jsonl;
mod keys;
mod numbers;
mod parquet;
mod registers;
mod rows;

use std::collections::VecDeque;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::thread::{Scope, ScopedJoinHandle};

use vtrace_storage::Regs;

use rows::{RowBuilder, SegmentRows};
use vtrace_analyzer::{pass_progress, AnalyzeError, LevelPass, LevelSink, Progress, Trace};
use vtrace_image::symbols::Symbolizer;

pub use error::{ExportError, Result};

/// The file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    /// Apache Parquet: columns, zstd-compressed, a row group per segment.
    Parquet,
    /// One JSON object per line.
    Jsonl,
}

impl ExportFormat {
    /// The file name extension.
    pub fn extension(self) -> &'static str {
        match self {
            ExportFormat::Parquet => "parquet",
            ExportFormat::Jsonl => "jsonl",
        }
    }
}

/// Where the rows go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    /// One file, written under a temporary name beside it and renamed
    /// when complete, so an interrupted export leaves no partial file
    /// under the name.
    File(PathBuf),
    /// Standard output (JSON lines only).
    Stdout,
    /// Files of about `steps_per_file` steps each (whole segments), named
    /// `step_range=FIRST-END.EXT`. Files of an earlier export there are
    /// removed first.
    Directory {
        /// The directory (made if missing).
        dir: PathBuf,
        /// Steps a file holds at least before the next begins.
        steps_per_file: u64,
    },
}

/// A file written.
#[derive(Clone, Debug)]
pub struct ExportedFile {
    /// Where it is (`-` for standard output).
    pub path: PathBuf,
    /// Rows (steps) in it.
    pub steps: u64,
    /// Its size (0 for standard output).
    pub bytes: u64,
}

/// What an export wrote.
#[derive(Clone, Debug, Default)]
pub struct ExportReport {
    /// Rows (steps) written in all.
    pub steps: u64,
    /// The files, by name.
    pub files: Vec<ExportedFile>,
}

impl ExportReport {
    /// Bytes in all the files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

/// What converting rows needs besides them.
struct Context<'a> {
    symbols: &'a Symbolizer,
    ns_per_step: Option<u64>,
    schema: arrow_schema::SchemaRef,
    trace_path: String,
    /// Facts of the trace for the Parquet footer (`vtrace.KEY`).
    about: Vec<(&'static str, String)>,
}

/// Writes one output file.
trait PartWriter: Send {
    /// Writes the rows of each segment `segments` yields, in order, then
    /// completes the file (Parquet's footer) and flushes it to disk.
    fn write_all(
        self: Box<Self>,
        segments: &mut dyn Iterator<Item = SegmentRows>,
    ) -> Result<(), ExportError>;
}

/// The level engine's findings are not wanted here, only its routines.
struct Quiet;
impl LevelSink for Quiet {}

/// What a part's writer is sent.
enum ToWriter {
    /// A segment's rows (boxed: the message is moved, its vectors not).
    Rows(Box<SegmentRows>),
    /// The export failed or was stopped: the part is not to be completed,
    /// and its file goes.
    Abandon,
}

/// A part being written by its thread.
struct OpenPart<'scope> {
    tx: SyncSender<ToWriter>,
    handle: ScopedJoinHandle<'scope, Result<ExportedFile, ExportError>>,
    steps: u64,
}

fn join(handle: ScopedJoinHandle<'_, Result<ExportedFile, ExportError>>) -> Result<ExportedFile> {
    match handle.join() {
        Ok(result) => Ok(result?),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Where a part goes while written, and how its final name is made.
#[derive(Clone)]
enum PartTarget {
    File(PathBuf),
    Stdout,
    /// The `part`-th file in `dir`, of CPU `cpu`'s steps where the trace
    /// has several.
    InDirectory {
        dir: PathBuf,
        part: usize,
        cpu: Option<u32>,
    },
}

fn partial_name(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

/// Writes one part from the rows it is sent.
fn write_part(
    target: PartTarget,
    format: ExportFormat,
    ctx: &Context<'_>,
    rx: std::sync::mpsc::Receiver<ToWriter>,
) -> Result<ExportedFile, ExportError> {
    let temp = match &target {
        PartTarget::File(path) => partial_name(path),
        // Named for its steps once its last is known.
        PartTarget::InDirectory { dir, part, .. } => dir.join(format!(".part-{part}.partial")),
        PartTarget::Stdout => PathBuf::new(),
    };
    let writer: Box<dyn PartWriter + '_> = match (&target, format) {
        (PartTarget::Stdout, ExportFormat::Jsonl) => Box::new(jsonl::JsonlPart::new(
            BufWriter::with_capacity(1 << 20, std::io::stdout()),
            ctx,
        )),
        (PartTarget::Stdout, ExportFormat::Parquet) => {
            return Err(ExportError::Unsupported(
                "Parquet cannot go to standard output: name a file or directory",
            ))
        }
        (_, ExportFormat::Parquet) => {
            Box::new(parquet::ParquetPart::create(File::create(&temp)?, ctx)?)
        }
        (_, ExportFormat::Jsonl) => Box::new(jsonl::JsonlPart::new(
            BufWriter::with_capacity(1 << 20, File::create(&temp)?),
            ctx,
        )),
    };
    let mut range: Option<(u64, u64)> = None;
    let mut steps = 0u64;
    let mut abandoned = false;
    let mut segments = rx.into_iter().map_while(|message| match message {
        ToWriter::Rows(rows) => Some(*rows),
        ToWriter::Abandon => {
            abandoned = true;
            None
        }
    });
    let written = writer.write_all(&mut segments.by_ref().inspect(|rows| {
        if let (Some(first), Some(last)) = (rows.steps.first(), rows.steps.last()) {
            let end = last.saturating_add(1);
            range = Some((range.map_or(*first, |r| r.0), end));
        }
        steps = steps.saturating_add(rows.len() as u64);
    }));
    drop(segments);
    let written = written.and_then(|()| match abandoned {
        true => Err(ExportError::Stopped),
        false => Ok(()),
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    let path = match target {
        PartTarget::Stdout => {
            return Ok(ExportedFile {
                path: PathBuf::from("-"),
                steps,
                bytes: 0,
            })
        }
        PartTarget::File(path) => path,
        PartTarget::InDirectory { dir, cpu, .. } => {
            let (first, end) = range.unwrap_or_default();
            let cpu = cpu.map(|c| format!(".cpu{c}")).unwrap_or_default();
            dir.join(format!(
                "step_range={first:012}-{end:012}{cpu}.{}",
                format.extension()
            ))
        }
    };
    std::fs::rename(&temp, &path)?;
    let bytes = std::fs::metadata(&path)?.len();
    Ok(ExportedFile { path, steps, bytes })
}

/// Removes the files an earlier export left in `dir`.
fn clear_directory(dir: &Path, format: ExportFormat) -> Result<(), ExportError> {
    std::fs::create_dir_all(dir)?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let ours = (name.starts_with("step_range=") && name.ends_with(format.extension()))
            || (name.starts_with(".part-") && name.ends_with(".partial"));
        if ours {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Asked between segments whether an export is to stop (a signal came).
pub type Stop<'a> = &'a (dyn Fn() -> bool + Sync);

/// Exports every readable step of `trace` to `destination`: of the CPU
/// the trace has selected ([`Trace::select_cpu`]), else of every CPU, one
/// after another (each CPU's rows in step order; a directory's files
/// hold one CPU's each, named with it). Where `stop` says so, or the
/// export fails, the file being written is removed (a directory keeps
/// the files completed before it) and the export fails
/// ([`ExportError::Stopped`]).
pub fn export(
    trace: &Trace,
    symbols: &Symbolizer,
    format: ExportFormat,
    destination: &Destination,
    progress: Progress<'_>,
    stop: Stop<'_>,
) -> Result<ExportReport> {
    if trace.steps() == 0 {
        return Err(AnalyzeError::NoSteps.into());
    }
    let (target, steps_per_file) = part_target(destination, format)?;
    let ctx = &context(trace, symbols);
    let cpus = trace.each_cpu();
    std::thread::scope(|scope| {
        let mut parts = Parts {
            scope,
            ctx,
            format,
            target,
            steps_per_file,
            // Parts finishing at once: one per core, and the one being
            // filled.
            parallel: std::thread::available_parallelism().map_or(2, |n| n.get()),
            report: ExportReport::default(),
            open: None,
            closing: VecDeque::new(),
            part: 0,
            cpu: None,
        };
        let passes = cpus.len() as u64;
        let mut outcome = Ok(());
        for (pass, cpu) in (0u64..).zip(cpus.iter().copied()) {
            parts.next_cpu(cpu.filter(|_| passes > 1));
            let progress = pass_progress(progress, pass, passes);
            outcome = export_cpu(trace, symbols, cpu, &mut parts, &progress, stop);
            if outcome.is_err() {
                break;
            }
        }
        parts.finish(outcome.err())
    })
}

/// One CPU's rows (every row where `cpu` is `None`) into `parts`.
fn export_cpu(
    trace: &Trace,
    symbols: &Symbolizer,
    cpu: Option<u32>,
    parts: &mut Parts<'_, '_>,
    progress: Progress<'_>,
    stop: Stop<'_>,
) -> Result<()> {
    // The registers after the last step before, and whether it was a
    // user-mode `int 0x80`.
    let mut carried: Option<(Regs, bool)> = None;
    let mut carried_events: Vec<String> = Vec::new();
    let mut expected: Option<u64> = None;
    LevelPass::new(trace, symbols)
        .cpu(cpu)
        .progress(progress)
        .run_following(
            &mut Quiet,
            |info| RowBuilder::new(cpu.unwrap_or(0), info.first_step, info.steps),
            |mut rows, info, runs| {
                if stop() {
                    return Err(ExportError::Stopped);
                }
                if expected != Some(info.first_step) {
                    carried = None;
                    carried_events.clear();
                }
                expected = Some(info.first_step.saturating_add(info.steps));
                let before = carried.as_ref().map(|(regs, int_80)| (regs, *int_80));
                rows.finish(before, std::mem::take(&mut carried_events), runs);
                carried = rows.last_regs.map(|regs| (regs, rows.last_int_80));
                carried_events = std::mem::take(&mut rows.trailing_events);
                parts.take(rows)
            },
        )
        .map(|_| ())
}

/// Where the parts go, and how many steps each holds.
fn part_target(destination: &Destination, format: ExportFormat) -> Result<(PartTarget, u64)> {
    Ok(match destination {
        Destination::File(path) => (PartTarget::File(path.clone()), u64::MAX),
        Destination::Stdout if format == ExportFormat::Parquet => {
            return Err(ExportError::Unsupported(
                "Parquet cannot go to standard output: name a file or directory",
            ))
        }
        Destination::Stdout => (PartTarget::Stdout, u64::MAX),
        Destination::Directory {
            dir,
            steps_per_file,
        } => {
            clear_directory(dir, format)?;
            (
                PartTarget::InDirectory {
                    dir: dir.clone(),
                    part: 0,
                    cpu: None,
                },
                (*steps_per_file).max(1),
            )
        }
    })
}

/// What every part's writer shares: symbols, the clock, the schema, and
/// what the files say of the trace.
fn context<'a>(trace: &Trace, symbols: &'a Symbolizer) -> Context<'a> {
    let m = &trace.metadata;
    let mut about = vec![("guest", m.guest.clone())];
    about.extend(m.kernel.clone().map(|k| ("kernel", k)));
    about.extend(m.clock.clone().map(|c| ("clock", c)));
    about.extend(m.vtrace_version.clone().map(|v| ("recorded-by", v)));
    Context {
        symbols,
        ns_per_step: m.ns_per_step(),
        schema: parquet::schema(),
        trace_path: trace.path().display().to_string(),
        about,
    }
}

/// The parts of an export: the one being filled, each on a writer thread
/// of its own, and those finishing.
struct Parts<'scope, 'env> {
    scope: &'scope Scope<'scope, 'env>,
    ctx: &'env Context<'env>,
    format: ExportFormat,
    target: PartTarget,
    steps_per_file: u64,
    /// Parts finishing at once, at most.
    parallel: usize,
    report: ExportReport,
    open: Option<OpenPart<'scope>>,
    closing: VecDeque<ScopedJoinHandle<'scope, Result<ExportedFile, ExportError>>>,
    /// Parts begun so far.
    part: usize,
    /// The CPU whose rows come now, where the export holds several.
    cpu: Option<u32>,
}

impl<'scope, 'env> Parts<'scope, 'env> {
    /// Hands a segment's rows to the open part, closing a full one and
    /// beginning a new one as needed.
    fn take(&mut self, rows: SegmentRows) -> Result<()> {
        let count = rows.len() as u64;
        if count == 0 {
            return Ok(());
        }
        if self
            .open
            .as_ref()
            .is_some_and(|p| p.steps >= self.steps_per_file)
        {
            if let Some(p) = self.open.take() {
                drop(p.tx);
                self.closing.push_back(p.handle);
            }
            while self.closing.len() >= self.parallel {
                if let Some(h) = self.closing.pop_front() {
                    self.report.files.push(join(h)?);
                }
            }
        }
        let p = match self.open.take() {
            Some(p) => p,
            None => self.begin(),
        };
        let p = self.open.insert(p);
        p.steps = p.steps.saturating_add(count);
        self.report.steps = self.report.steps.saturating_add(count);
        if p.tx.send(ToWriter::Rows(Box::new(rows))).is_err() {
            // The writer stopped: its error says why.
            if let Some(p) = self.open.take() {
                return Err(match join(p.handle) {
                    Err(e) => e,
                    Ok(_) => {
                        ExportError::Io(std::io::Error::other("the export's writer stopped early"))
                    }
                });
            }
        }
        Ok(())
    }

    /// The rows of CPU `cpu` come next (`None`: the export holds one
    /// CPU's): in a directory, they begin a file of their own.
    fn next_cpu(&mut self, cpu: Option<u32>) {
        self.cpu = cpu;
        if !matches!(self.target, PartTarget::InDirectory { .. }) {
            return;
        }
        if let Some(p) = self.open.take() {
            drop(p.tx);
            self.closing.push_back(p.handle);
        }
    }

    /// A new part, its writer started.
    fn begin(&mut self) -> OpenPart<'scope> {
        // Handed over, not queued: a segment's rows are tens of MB, and a
        // queued one kept peak memory about 30 MB higher for no speed.
        let (tx, rx) = sync_channel::<ToWriter>(0);
        self.part += 1;
        let target = match &self.target {
            PartTarget::InDirectory { dir, .. } => PartTarget::InDirectory {
                dir: dir.clone(),
                part: self.part,
                cpu: self.cpu,
            },
            t => t.clone(),
        };
        let (format, ctx) = (self.format, self.ctx);
        let handle = self
            .scope
            .spawn(move || write_part(target, format, ctx, rx));
        OpenPart {
            tx,
            handle,
            steps: 0,
        }
    }

    /// Joins every writer, even after an error, so none is left writing;
    /// the first error wins (`error` is the pass's own). After an error,
    /// the open part is abandoned (its file removed, not completed as if
    /// its rows were all); those closed before it are whole.
    fn finish(mut self, error: Option<ExportError>) -> Result<ExportReport> {
        if let Some(p) = self.open.take() {
            if error.is_some() {
                // A writer that stopped already has nothing to remove.
                let _ = p.tx.send(ToWriter::Abandon);
            }
            drop(p.tx);
            self.closing.push_back(p.handle);
        }
        let mut first_error = error;
        for h in self.closing {
            match join(h) {
                Ok(f) => self.report.files.push(f),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => {
                self.report.files.sort_by(|a, b| a.path.cmp(&b.path));
                Ok(self.report)
            }
        }
    }
}
