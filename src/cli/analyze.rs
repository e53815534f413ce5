//! `vtrace analyze`'s commands and options.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

use vtrace_session::DEFAULT_TRACE;

#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    #[command(subcommand)]
    pub what: AnalyzeCommand,
    /// Take a damaged or unfinished trace as it is: what the damage took is
    /// still said on stderr, but the exit status is 0. Without it, an
    /// analysis of such a trace exits 1
    #[arg(long, global = true)]
    pub allow_damage: bool,
}

/// What every analysis takes: the trace and where symbols come from.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The trace disk (written by `vtrace run`).
    #[arg(default_value = DEFAULT_TRACE)]
    pub trace: PathBuf,
    /// More symbols: an ELF image, System.map, `nm` output or a kallsyms
    /// dump, for every address space or, with @CR3 (hex), for one.
    /// Repeatable; these come before the kernel's own symbols.
    #[arg(long = "symbols", value_name = "FILE[@ASPACE]")]
    pub symbols: Vec<String>,
    /// Do not look for the traced kernel's symbols.
    #[arg(long)]
    pub no_kernel_symbols: bool,
    /// The guest's root file system (or the tree its initramfs was built
    /// from): the programs and libraries a Linux trace's processes mapped
    /// are looked up there, and their routines named where they ran.
    #[arg(long, value_name = "DIR")]
    pub sysroot: Option<PathBuf>,
    /// The initramfs to look the programs up in (plain, gzip or zstd cpio
    /// archives). By default, without --sysroot, the one the traced run
    /// booted, where it is still at the path the trace records.
    #[arg(long, value_name = "FILE", conflicts_with = "sysroot")]
    pub initramfs: Option<PathBuf>,
    /// No progress bar, even on a terminal.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// A trace of several CPUs (`vtrace run --cpus`): `--cpu N` reads only
    /// CPU N's steps and events; `stats --cpu all` shows each CPU's share
    /// of the work and where each spun waiting. The listing has a CPU
    /// column either way; without `--cpu`, the nest diagram gives each
    /// CPU's in turn, statistics, flame graph and report add up every
    /// CPU's, and export writes every CPU's rows (with a `cpu` column), a
    /// CPU after another.
    #[arg(long, value_name = "N|all", value_parser = parse_cpu)]
    pub cpu: Option<CpuChoice>,
}

/// What `--cpu` chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuChoice {
    /// `--cpu all`: every CPU, each on its own.
    Each,
    /// `--cpu N`.
    One(u32),
}

fn parse_cpu(text: &str) -> Result<CpuChoice, String> {
    match text {
        "all" => Ok(CpuChoice::Each),
        n => n
            .parse()
            .map(CpuChoice::One)
            .map_err(|_| format!("{n:?} is neither a CPU number (0, 1, ...) nor `all`")),
    }
}

/// Where a text or JSON output goes.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Write to FILE instead of standard output (`-` is standard output).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Which tasks of a Linux trace an analysis looks at.
#[derive(Debug, Args)]
pub struct TaskArgs {
    /// Only the steps of this process (its threads too; `vtrace analyze
    /// processes` lists the pids). Repeatable.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Only the steps of tasks of this name (as the kernel keeps it: up to
    /// 15 bytes, renamed by exec). Repeatable.
    #[arg(long = "comm", value_name = "NAME")]
    pub comms: Vec<String>,
}

impl TaskArgs {
    pub fn filter(&self) -> vtrace_analyzer::TaskFilter {
        vtrace_analyzer::TaskFilter {
            pids: self.pids.clone(),
            comms: self.comms.clone(),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum AnalyzeCommand {
    /// One line per step: number, address space, symbolised address,
    /// bytes, disassembly, registers changed, and the events between steps.
    Listing(ListingArgs),
    /// The nest diagram: routine entries and exits indented by call depth,
    /// with step counts (total and self), one block per big level
    /// (interrupt, system call, task or address-space switch).
    Nest(NestArgs),
    /// The address spaces (CR3) seen: steps, switches, code ranges, and
    /// the routines that ran in each.
    Spaces(SpacesArgs),
    /// The tasks of a Linux trace: per thread its process id, name, user
    /// and kernel steps, system calls, interrupts, switches in and
    /// address spaces.
    Processes(SpacesArgs),
    /// Instruction mix, steps per routine (self and total), addressing
    /// modes, memory locality, interrupts and interrupt-disabled stretches.
    Stats(StatsArgs),
    /// A flame graph (SVG, or folded stacks with --folded) of steps by
    /// call stack, rooted at the task's name where the trace names Linux
    /// tasks, else at the address space.
    Flame(FlameArgs),
    /// A timeline for the Perfetto UI, as Perfetto's protobuf trace or
    /// Chrome's trace-event JSON (--format): a process per guest process
    /// and a track per thread (per address space where the trace names no
    /// tasks), an event per routine call, instants for interrupts and
    /// system calls, and a counter of runnable tasks.
    Timeline(TimelineArgs),
    /// One self-contained HTML page (no network): a summary of what ran
    /// and where the steps went, bar charts, the flame graph, routine,
    /// interrupt and system-call tables, the instruction mix, a nest
    /// diagram to search and expand, and a listing window of each
    /// busiest routine's first call.
    Report(ReportArgs),
    /// The memory `vtrace run --capture` copied: per capture the step it
    /// came before, its name, the address, the bytes as hex (with --json)
    /// and as text (up to the first NUL).
    Captures(CapturesArgs),
    /// How often each probe of `vtrace run --probe` fired, and with
    /// --quantize a power-of-two histogram of an argument per probe, as
    /// DTrace's quantize() prints it.
    Probes(ProbesTraceArgs),
    /// The samples of `vtrace run --peep`: a row per sample with the
    /// guest's virtual time, the host's time and each variable; with
    /// --sample-pc also the routine running, a profile by routine, and
    /// with --flame a flame graph of it.
    Samples(SamplesArgs),
    /// A row per step for data tools (DuckDB, Polars, Spark, pandas):
    /// step, virtual time, address space, privilege level, pc, routine,
    /// task, instruction bytes, mnemonic and disassembly, the registers
    /// it changed, the memory it read and wrote, its system call or
    /// interrupt and the events before it, as Parquet or JSON lines.
    #[command(after_help = EXPORT_EXAMPLES)]
    Export(ExportArgs),
    /// Addresses to names, as addr2line: per address its routine and
    /// offset (`routine+0x1f`) and, where the image has line tables, its
    /// source file and line. Addresses come from the command line or, one
    /// or more a line, from standard input; the trace's kernel and
    /// programs name them, with --symbols as elsewhere.
    #[command(after_help = SYMBOLIZE_EXAMPLES)]
    Symbolize(SymbolizeArgs),
    /// Two traces side by side (two kernels, two configurations): steps
    /// per routine in each (self and total) by the size of the change,
    /// routines only one of them ran, the instruction mix and interrupts,
    /// and with --flame a differential flame graph.
    Diff(DiffArgs),
    /// Serve the trace to gdb, which then steps and continues through it
    /// both ways: `stepi`, `reverse-stepi`, `continue`, `reverse-continue`
    /// to breakpoints, `info registers` and memory at any step, as far as
    /// the trace knows them (what it does not know gdb shows as
    /// unavailable). In gdb: `target remote ADDR`; `monitor when` tells the
    /// step, `monitor goto N` goes to one.
    Gdb(GdbArgs),
}

const SYMBOLIZE_EXAMPLES: &str = "Examples:
  vtrace analyze symbolize --trace linux.vtd 0xffffffff81c8a1f0
  vtrace analyze symbolize --symbols demo.elf 0x1008a3 0x100f00
  vtrace analyze symbolize --trace linux.vtd 0x401136@0x7b1c000  (a user program's address, in
                                                                  the address space the listing names)
  grep -o 'rip [0-9a-f]*' crash.txt | cut -d' ' -f2 | vtrace analyze symbolize --trace t.vtd";

#[derive(Debug, Args)]
pub struct SymbolizeArgs {
    /// Addresses, hex (`0xffffffff81000000` or `401136`), each optionally
    /// `@CR3` for a user program's, in the address space the listing's
    /// cr3 column names. None: read them from standard input.
    #[arg(value_name = "ADDR[@CR3]", value_parser = parse_address)]
    pub addresses: Vec<vtrace_analyzer::AddressQuery>,
    /// The trace whose kernel and programs name the addresses (default:
    /// ./vtrace.vtd where it exists; none is needed with --symbols).
    #[arg(long, value_name = "TRACE")]
    pub trace: Option<PathBuf>,
    /// Symbols: an ELF image (with its line tables), System.map, `nm`
    /// output or a kallsyms dump, for every address space or, with @CR3
    /// (hex), for one. Repeatable; these come before the kernel's own.
    #[arg(long = "symbols", value_name = "FILE[@ASPACE]")]
    pub symbols: Vec<String>,
    /// Do not look for the traced kernel's symbols.
    #[arg(long)]
    pub no_kernel_symbols: bool,
    /// The guest's root file system, where the trace's programs are looked
    /// up (as the other analyses' --sysroot).
    #[arg(long, value_name = "DIR")]
    pub sysroot: Option<PathBuf>,
    /// The initramfs to look the trace's programs up in.
    #[arg(long, value_name = "FILE", conflicts_with = "sysroot")]
    pub initramfs: Option<PathBuf>,
    /// Print JSON lines: address, space, routine, offset, file, line,
    /// source (null where unknown).
    #[arg(long)]
    pub json: bool,
    /// Write to FILE instead of standard output (`-` is standard output).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

fn parse_quantize(text: &str) -> Result<vtrace_analyzer::QuantizeOn, String> {
    match text.parse::<usize>() {
        Ok(n) if n < 6 => Ok(vtrace_analyzer::QuantizeOn::Arg(n)),
        Ok(n) => Err(format!("argument {n}: a probe passes arguments 0 to 5")),
        Err(_) if !text.is_empty() => Ok(vtrace_analyzer::QuantizeOn::Field(text.to_string())),
        Err(_) => Err("give an argument's number or a typed value's name".into()),
    }
}

fn parse_address(text: &str) -> Result<vtrace_analyzer::AddressQuery, String> {
    vtrace_analyzer::AddressQuery::parse(text)
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The first trace (A: the baseline, "before").
    #[arg(value_name = "A")]
    pub a: PathBuf,
    /// The second trace (B: "after").
    #[arg(value_name = "B")]
    pub b: PathBuf,
    /// More symbols, for both traces (as the other analyses' --symbols).
    #[arg(long = "symbols", value_name = "FILE[@ASPACE]")]
    pub symbols: Vec<String>,
    /// Do not look for the traced kernels' symbols.
    #[arg(long)]
    pub no_kernel_symbols: bool,
    /// Print JSON: a and b (trace, steps), routines (name, self_a, self_b,
    /// self_delta, total_a, total_b, total_delta, calls_a, calls_b), new,
    /// vanished, and classes, mnemonics and interrupts (name, count_a,
    /// count_b, percent_a, percent_b, points).
    #[arg(long)]
    pub json: bool,
    /// Rows in each table of the text output.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// Also write a differential flame graph as SVG to FILE: B's call
    /// stacks, red where B spent more steps than A, blue where fewer.
    #[arg(long, value_name = "FILE")]
    pub flame: Option<PathBuf>,
    /// With --flame: scale A to B's step count first, to compare where
    /// the time went rather than how much there was.
    #[arg(long, requires = "flame")]
    pub normalize: bool,
    /// No progress bar, even on a terminal.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    #[command(flatten)]
    pub to: OutputArgs,
}

const EXPORT_EXAMPLES: &str = "\
Examples:
  vtrace analyze export -o steps.parquet
  duckdb -c \"SELECT routine, count(*) FROM 'steps.parquet' GROUP BY routine ORDER BY 2 DESC\"
  vtrace analyze export big.vtd -o steps/      # files of --steps-per-file steps each
  duckdb -c \"SELECT count(*) FROM 'steps/*.parquet'\"
  vtrace analyze export -o - --format jsonl | head";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ExportFormatArg {
    Parquet,
    Jsonl,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Where to write: FILE.parquet or FILE.jsonl for one file, `-` for
    /// JSON lines on standard output, anything else a directory of files
    /// named step_range=FIRST-END.parquet (END exclusive).
    #[arg(short, long, value_name = "PATH")]
    pub output: PathBuf,
    /// The format [default: from the extension of -o, else parquet].
    #[arg(long, value_enum)]
    pub format: Option<ExportFormatArg>,
    /// Steps per file when writing a directory (whole segments: files
    /// may hold a little more).
    #[arg(long, value_name = "N", default_value_t = 10_000_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub steps_per_file: u64,
}

#[derive(Debug, Args)]
pub struct SamplesArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Comma-separated values: virtual_ns, host_ns, a column per variable
    /// (and pc, cr3, routine with pc samples).
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// JSON: interval, variables (name, type, address), samples
    /// (virtual_ns, host_ns, values by name; pc, cr3, routine), and with
    /// pc samples a profile (routine, samples).
    #[arg(long)]
    pub json: bool,
    /// Also write a flame graph of the pc samples (an address space, then
    /// the routine: a pc sample has no call stack) as SVG to FILE.
    #[arg(long, value_name = "FILE")]
    pub flame: Option<PathBuf>,
    #[command(flatten)]
    pub to: OutputArgs,
}

#[derive(Debug, Args)]
pub struct ProbesTraceArgs {
    /// The trace disk.
    #[arg(default_value = DEFAULT_TRACE)]
    pub trace: PathBuf,
    /// Histogram of this argument of each probe (0 is the first, DTrace's
    /// arg0), as a signed number; or of a typed probe's value by its name
    /// (`--quantize how->flags`).
    #[arg(long, value_name = "ARG|NAME", value_parser = parse_quantize)]
    pub quantize: Option<vtrace_analyzer::QuantizeOn>,
    /// Every fire instead of the counts: its step, probe, arguments and
    /// typed values, one a line.
    #[arg(long)]
    pub fires: bool,
    /// Print JSON: a list of objects with keys probe and count (and
    /// quantize: arg or field, buckets of value and count, without; and a
    /// typed probe's values: field, counts of value and count, others);
    /// with --fires, fires of step, probe, args and values.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub to: OutputArgs,
}

#[derive(Debug, Args)]
pub struct CapturesArgs {
    /// The trace disk.
    #[arg(default_value = DEFAULT_TRACE)]
    pub trace: PathBuf,
    /// Print JSON: a list of objects with keys step, traced, name,
    /// address (hex text), length (bytes asked for), hex (the bytes read)
    /// and text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub to: OutputArgs,
}

#[derive(Debug, Args)]
pub struct ListingArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    #[command(flatten)]
    pub tasks: TaskArgs,
    /// First step to print, as the trace numbers its steps (every CPU's,
    /// whatever --cpu).
    #[arg(long, value_name = "N")]
    pub from: Option<u64>,
    /// Steps of the trace the window covers, from --from (with --cpu, that
    /// CPU's among them are printed).
    #[arg(long, value_name = "M")]
    pub count: Option<u64>,
    /// Write files of 500,000 steps each into DIR instead of printing.
    #[arg(long, value_name = "DIR", conflicts_with = "output")]
    pub out: Option<PathBuf>,
    /// Disassembly syntax.
    #[arg(long, value_enum, default_value = "intel")]
    pub syntax: SyntaxArg,
    /// Leave out file:line (faster on big traces).
    #[arg(long)]
    pub no_lines: bool,
    /// Add each step's memory accesses after its registers, writes then
    /// reads, as `| mem w ADDR:SIZE=VALUE r ADDR:SIZE=VALUE`: the value
    /// where the recorded registers make it exact (moves, push, pop, call,
    /// ret, leave, xchg, stos, lods), `?` where they do not (read-modify-
    /// write, compares, movs, vector instructions).
    #[arg(long)]
    pub values: bool,
    #[command(flatten)]
    pub to: OutputArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SyntaxArg {
    Intel,
    Att,
}

#[derive(Debug, Args)]
pub struct NestArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    #[command(flatten)]
    pub tasks: TaskArgs,
    /// Show this many call levels of each block (1: its outermost
    /// routines only); a routine at the last level shown prints as
    /// `name();` with its counts.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub depth: Option<u64>,
    /// Only the calls of this routine, with all they call and the
    /// interrupts taken meanwhile (uftrace's -F, ftrace's
    /// set_graph_function).
    #[arg(long, visible_alias = "only", value_name = "NAME")]
    pub function: Option<String>,
    #[command(flatten)]
    pub calls: CallFilterArgs,
    /// Leave out calls of fewer steps than this (their total, callees and
    /// interrupts included), with all they called (uftrace's -t).
    #[arg(long, value_name = "STEPS", conflicts_with = "min_time")]
    pub min_steps: Option<u64>,
    /// Leave out calls shorter than this in virtual time (`10us`, `1ms`;
    /// the trace's clock turns steps into time), with all they called.
    #[arg(long, value_name = "TIME", value_parser = crate::units::parse_interval)]
    pub min_time: Option<std::time::Duration>,
    /// Each routine's return value (RAX after its `ret`) on its leaf or
    /// close line, as ftrace's funcgraph-retval: `/* = 0x1 */`, an error
    /// number in decimal (`/* = -22 */`). A routine that returns nothing
    /// shows whatever RAX held.
    #[arg(long)]
    pub retval: bool,
    /// Only lines from this step on.
    #[arg(long, value_name = "STEP")]
    pub from: Option<u64>,
    /// Only lines before this step.
    #[arg(long, value_name = "STEP")]
    pub to: Option<u64>,
    /// Only the blocks that run in this address space (its page-table
    /// root, hex, as the diagram's `address space 0x...` says).
    #[arg(long, value_name = "CR3", value_parser = parse_hex)]
    pub space: Option<u64>,
    /// Write to FILE instead of standard output (`-` is standard output).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Routines a call-graph view leaves out.
#[derive(Debug, Args)]
pub struct CallFilterArgs {
    /// Leave out the routines matching this glob (`rcu_*`, `*spin_lock*`)
    /// with all they call and the interrupts taken meanwhile, as ftrace's
    /// set_graph_notrace and uftrace's -N; their steps still count in
    /// their callers'. Repeatable.
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Show the routines hidden by default: the hooks every traced kernel
    /// function calls first (`__fentry__`, `mcount`) and the return and
    /// indirect-branch thunks.
    #[arg(long)]
    pub show_hooks: bool,
}

impl CallFilterArgs {
    /// The filter these options ask for.
    pub fn filter(&self) -> Result<vtrace_analyzer::RoutineFilter, vtrace_analyzer::BadPattern> {
        vtrace_analyzer::RoutineFilter::new(&self.exclude, !self.show_hooks)
    }
}

#[derive(Debug, Args)]
pub struct SpacesArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub to: OutputArgs,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    #[command(flatten)]
    pub tasks: TaskArgs,
    /// Print JSON (every table in full).
    #[arg(long)]
    pub json: bool,
    /// Rows in each table of the text output.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    #[command(flatten)]
    pub to: OutputArgs,
}

#[derive(Debug, Args)]
pub struct FlameArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    #[command(flatten)]
    pub tasks: TaskArgs,
    /// The file to write (`-`: standard output).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Write folded stacks (`root;caller;callee STEPS` a line, the root
    /// the task's name or the address space) instead of SVG: what
    /// speedscope, inferno and flamegraph.pl's difffolded read.
    #[arg(long)]
    pub folded: bool,
    #[command(flatten)]
    pub calls: CallFilterArgs,
    /// Keep this many routine levels below each stack's root; deeper
    /// steps count in the routine at the last level kept.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub depth: Option<u64>,
    /// Only the stacks through this routine.
    #[arg(long, visible_alias = "only", value_name = "NAME")]
    pub function: Option<String>,
}

#[derive(Debug, Args)]
pub struct TimelineArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    #[command(flatten)]
    pub tasks: TaskArgs,
    /// The file to write (`-`: standard output).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Leave out routine calls shorter than this many steps (keeps the
    /// file small enough for the viewer).
    #[arg(long, default_value_t = 1, value_name = "STEPS")]
    pub min_steps: u64,
    /// The file's format: Perfetto's own protobuf trace (smaller, and what
    /// the Perfetto UI opens fastest: the one for millions of calls) or
    /// Chrome's trace-event JSON. By default the output's name decides:
    /// `.pftrace`, `.perfetto-trace` or `.pb` protobuf, anything else JSON.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<TimelineFormatArg>,
}

/// `analyze timeline --format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TimelineFormatArg {
    /// Chrome's trace-event JSON.
    Json,
    /// Perfetto's protobuf trace.
    Perfetto,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// The file to write (`-`: standard output).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Most nest-diagram lines the page holds (the rest is cut, with a
    /// note); `vtrace analyze nest` has them all.
    #[arg(long, default_value_t = 20_000, value_name = "LINES")]
    pub nest_lines: usize,
    #[command(flatten)]
    pub calls: CallFilterArgs,
    /// Call levels of the nest diagram and the flame graph (as `nest
    /// --depth` and `flame --depth`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub depth: Option<u64>,
    /// Only the calls of this routine in the nest diagram, and the stacks
    /// through it in the flame graph.
    #[arg(long, visible_alias = "only", value_name = "NAME")]
    pub function: Option<String>,
    /// Leave out of the nest diagram calls of fewer steps than this.
    #[arg(long, value_name = "STEPS")]
    pub min_steps: Option<u64>,
    /// Return values on the nest diagram's return lines (as `nest --retval`).
    #[arg(long)]
    pub retval: bool,
}

/// A hex number, with or without `0x`.
fn parse_hex(text: &str) -> Result<u64, String> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    u64::from_str_radix(digits, 16).map_err(|_| format!("{text:?} is not a hex number (0x103000)"))
}

#[derive(Debug, Args)]
pub struct GdbArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Where gdb connects: a port (on 127.0.0.1), HOST:PORT (port 0: one
    /// the system picks, printed), or a Unix socket's path (one with a /).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:1234")]
    pub listen: String,
    /// The step gdb finds the guest at (default: the trace's first).
    #[arg(long, value_name = "STEP")]
    pub at: Option<u64>,
}
