//! Command-line syntax.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use vtrace_vmm::ClockMode;

use crate::exit_status::STATUS_TABLE;
use crate::units::{
    parse_address, parse_capture, parse_location, parse_size, CaptureRequest, Location,
};

pub use vtrace_session::DEFAULT_TRACE;

/// Refuses `trace` when it is the default and there is none, saying so
/// (rather than "cannot open vtrace.vtd").
pub fn check_default_trace(trace: &std::path::Path) -> anyhow::Result<()> {
    if trace == std::path::Path::new(DEFAULT_TRACE) && !trace.exists() {
        return Err(crate::exit_status::BadArgument(format!(
            "no trace named, and there is no {DEFAULT_TRACE} here (`vtrace run` writes one in \
             the directory it runs in); name the trace disk to read"
        ))
        .into());
    }
    Ok(())
}

/// Full-system instruction tracer for x86-64 guests on KVM.
#[derive(Debug, Parser)]
#[command(name = "vtrace", version = env!("VTRACE_LONG_VERSION"), about, long_about = None)]
pub struct Cli {
    /// More log output on stderr (-v info, -vv debug, -vvv trace). The
    /// VTRACE_LOG environment variable takes a full filter instead.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Boot a guest: the built-in demo OS, a Linux kernel, a PVH ELF or a
    /// raw real-mode image. Its serial console is this terminal.
    #[command(after_long_help = STATUS_TABLE)]
    Run(Box<RunArgs>),
    /// Summarize a trace disk: steps, events, gaps, how tracing started and
    /// stopped, disk use, and a digest (equal digests mean equal traces).
    Info(InfoArgs),
    /// Analyze a trace disk offline: listings, nest diagrams of call
    /// levels, address spaces, statistics, flame graphs, timelines, an
    /// HTML report, a per-step export (Parquet, JSON lines) and diffs of
    /// two traces. Symbols of the traced kernel are found from what the
    /// trace records; --symbols adds more.
    Analyze(AnalyzeArgs),
    /// Measure the tracer: full tracing of the demo OS against the bare
    /// single-step loop run before and after it, in one process (build with
    /// --release for real figures).
    Bench(BenchArgs),
    /// Control a running `vtrace run` from another terminal.
    Ctl(CtlArgs),
    /// The static probes compiled into a guest kernel (its `stapsdt` ELF
    /// notes, as `readelf -n` shows them; guest-kit/include/vtrace-sdt.h
    /// makes them).
    Probes(ProbesArgs),
    /// Find out, by running tiny guests, what this host's KVM lets a
    /// tracer see: whether kernel code is emulated, single-stepping at CPL 0
    /// and CPL 3, hardware breakpoints, instructions KVM's emulator lacks,
    /// CPUID bits that leak past the baseline, and the bare step rate; and
    /// what that means for a trace taken here.
    Doctor(DoctorArgs),
    /// Print a shell completion script: `vtrace completions bash >
    /// /etc/bash_completion.d/vtrace`, or source it from your shell's
    /// start-up file (zsh: into a directory on $fpath as _vtrace).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), or with --dir write one page per
    /// command there (vtrace.1, vtrace-run.1, ...): `vtrace man | man -l -`.
    Man {
        /// Write every page into DIR instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub struct ProbesArgs {
    #[command(subcommand)]
    pub what: ProbesCommand,
}

#[derive(Debug, Subcommand)]
pub enum ProbesCommand {
    /// List each probe (provider:name), how many arguments it passes and
    /// the addresses of its sites.
    List {
        /// The kernel: an ELF or a bzImage (default: the built-in demo OS).
        #[arg(long, value_name = "FILE")]
        kernel: Option<PathBuf>,
        /// Print JSON: a list of objects with keys probe, arguments and
        /// sites (addresses as hex text).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CtlArgs {
    #[command(subcommand)]
    pub command: CtlCommand,
    /// The run's control socket (default: the one socket of a live run of
    /// yours in $XDG_RUNTIME_DIR, or else in /tmp/vtrace-UID).
    #[arg(long, value_name = "PATH", global = true)]
    pub control: Option<PathBuf>,
}

/// What to ask the run.
#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Start tracing.
    Start,
    /// Stop tracing; what was traced is written to the disk at once.
    Stop,
    /// Record a mark in the trace: with ID as a guest MARK hypercall would,
    /// without one as a host mark (like Ctrl-A m).
    Mark {
        /// The mark's id (a number below 2^64-1).
        #[arg(value_parser = clap::value_parser!(u64).range(..u64::MAX))]
        id: Option<u64>,
    },
    /// Whether tracing is on, steps recorded, probes and their counts,
    /// virtual time and exits.
    Status,
    /// Enable or disable probes while the guest runs: static probes by
    /// pattern (sched:*, timer:tick), whose semaphores are set before the
    /// guest runs again; fn: probes given to the run with --probe.
    Probe {
        #[arg(value_enum)]
        action: ProbeAction,
        /// A probe name or glob (* and ?).
        pattern: String,
    },
}

/// What `vtrace ctl probe` does.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ProbeAction {
    Enable,
    Disable,
}

impl CtlCommand {
    /// The request line the control socket takes.
    pub fn request(&self) -> String {
        match self {
            CtlCommand::Start => "start".into(),
            CtlCommand::Stop => "stop".into(),
            CtlCommand::Mark { id: Some(id) } => format!("mark {id}"),
            CtlCommand::Mark { id: None } => "mark".into(),
            CtlCommand::Status => "status".into(),
            CtlCommand::Probe { action, pattern } => format!(
                "probe {} {pattern}",
                match action {
                    ProbeAction::Enable => "enable",
                    ProbeAction::Disable => "disable",
                }
            ),
        }
    }
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Measure the analyzer instead: trace the demo OS, repeat its records
    /// into a trace of at least --steps steps, and time the nest diagram
    /// and the statistics on it (goals on 2 cores: 40 and 30 M steps/s).
    #[arg(long)]
    pub analyzer: bool,
    /// Steps in the analyzer benchmark's trace.
    #[arg(long, default_value_t = 10_000_000, value_name = "N")]
    pub steps: u64,
    /// With --analyzer: time the analyzer on this trace instead of the
    /// repeated demo trace (nothing is traced).
    #[arg(
        long,
        value_name = "FILE",
        requires = "analyzer",
        conflicts_with = "keep"
    )]
    pub trace: Option<PathBuf>,
    /// With --analyzer: keep the repeated demo trace in FILE (for
    /// profiling, or to rerun with --trace).
    #[arg(long, value_name = "FILE", requires = "analyzer")]
    pub keep: Option<PathBuf>,
    /// Run the step benchmark N times and give the best and the median
    /// ratio as well (a host's speed swings from run to run; the goal is
    /// the best of three). With --json the top-level keys are the best
    /// run's, and `runs` holds every run.
    #[arg(
        long,
        default_value_t = 1,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=100),
        conflicts_with = "analyzer"
    )]
    pub runs: u32,
    /// Step only the demo OS's first N instructions in each run of the step
    /// benchmark (the bare runs stop after N exits, the traced run after N
    /// steps), for hosts where stepping the whole demo takes too long (the
    /// VT-x test machine steps a few thousand instructions a second).
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u64).range(1000..),
        conflicts_with = "analyzer"
    )]
    pub max_steps: Option<u64>,
    /// Print JSON (keys: bare_exits_per_s, traced_exits_per_s, ratio,
    /// bytes_per_step, peak_rss_bytes; with --runs also ratio_median and
    /// runs).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The trace disk.
    #[arg(default_value = DEFAULT_TRACE)]
    pub trace: PathBuf,
    /// Print JSON (keys: steps, gaps, events, bytes_per_step, digest,
    /// stop_reason, ...).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub to: OutputArgs,
    /// Exit 0 even where the trace is damaged or unfinished (its problems
    /// are still listed); without it, such a trace exits 1
    #[arg(long)]
    pub allow_damage: bool,
}

/// CPUID profile presented to the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CpuArg {
    /// One fixed CPU, the same on every host, so traces match across hosts:
    /// an AMD64 of QEMU's qemu64 signature, SSE2, no APIC, no XSAVE, no
    /// RDRAND (`vtrace doctor` says if this host lacks any of it).
    Baseline,
    /// Pass the host's KVM-supported set through (real VT-x/AMD-V hosts).
    Host,
}

fn parse_segment_size(text: &str) -> Result<u64, String> {
    let size = parse_size(text)?;
    if (64 << 10..=64 << 20).contains(&size) && size % 4096 == 0 {
        Ok(size)
    } else {
        Err(format!(
            "'{text}': a segment is 64K to 64M, a multiple of 4K"
        ))
    }
}

/// Exception vectors that stop tracing (one value, not a repeated flag).
#[derive(Clone, Debug)]
pub struct Autostop(pub Vec<u8>);

fn parse_autostop(text: &str) -> Result<Autostop, String> {
    vtrace_trap::parse_autostop(text).map(Autostop)
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Kernel to boot: a Linux bzImage, a 64-bit vmlinux ELF, or a PVH ELF.
    /// Without it (and without --real-mode) the built-in demo OS boots.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "real_mode",
        help_heading = "Guest"
    )]
    pub kernel: Option<PathBuf>,

    /// Initial ramdisk for the kernel.
    #[arg(long, value_name = "FILE", requires = "kernel", help_heading = "Guest")]
    pub initrd: Option<PathBuf>,

    /// Added to the kernel command line (after the default one, or after
    /// --cmdline's)
    #[arg(
        long,
        value_name = "STRING",
        conflicts_with = "real_mode",
        help_heading = "Guest",
        long_help = append_help()
    )]
    pub append: Option<String>,

    /// The whole kernel command line, in place of the default (which keeps
    /// Linux on what vtrace emulates and the baseline CPU offers: see
    /// --append's help for it)
    #[arg(
        long,
        value_name = "STRING",
        conflicts_with = "real_mode",
        help_heading = "Guest"
    )]
    pub cmdline: Option<String>,

    /// Boot a raw 16-bit image in real mode instead of a kernel.
    #[arg(long, value_name = "FILE", help_heading = "Guest")]
    pub real_mode: Option<PathBuf>,

    /// Where to load the --real-mode image (hex with 0x, or decimal).
    #[arg(long, value_name = "ADDR", default_value = "0x7c00", value_parser = parse_address, requires = "real_mode", help_heading = "Guest")]
    pub load_addr: u64,

    /// Guest RAM, e.g. 256M, 4G (reserved lazily: only touched pages cost).
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_size, help_heading = "Guest")]
    pub memory: u64,

    /// CPUID profile.
    #[arg(long, value_enum, default_value_t = CpuArg::Baseline, help_heading = "Guest")]
    pub cpu: CpuArg,

    /// Do not read stdin or change the terminal; the guest's output is
    /// still shown. For scripts.
    #[arg(long, help_heading = "Console")]
    pub no_input: bool,

    /// Print nothing of vtrace's own (boot line, summary); only the guest.
    #[arg(short, long, help_heading = "Console")]
    pub quiet: bool,

    /// With --no-input (and without --quiet): while tracing, a status line
    /// on stderr every INTERVAL (the steps recorded, the disk's fill,
    /// virtual time, exits per second; what Ctrl-A s shows); 0s for none.
    #[arg(long, value_name = "INTERVAL", default_value = "10s", value_parser = crate::units::parse_interval, help_heading = "Console")]
    pub progress: std::time::Duration,

    /// How the guest's clock (PIT, RTC) follows host time: `wall`,
    /// `prescale:N` (host time divided by N), or `steps[:NS]` (while tracing,
    /// each instruction advances time NS nanoseconds, default 1: traces are
    /// deterministic). Default: `steps:1` with --trace, else `wall`.
    #[arg(long, value_name = "MODE", value_parser = ClockMode::parse, help_heading = "Clock")]
    pub clock: Option<ClockMode>,

    /// Trace from the first instruction (also: Ctrl-A t, hypercalls).
    #[arg(long, help_heading = "Tracing")]
    pub trace: bool,

    /// Trace disk to write (a file, or a block device; default vtrace.vtd
    /// wherever a run traces, captures, probes or peeps). Given alone,
    /// tracing waits for Ctrl-A t or a hypercall. An earlier trace there
    /// is replaced; any other file is not, without --force.
    #[arg(long, value_name = "PATH", help_heading = "Trace disk")]
    pub disk: Option<PathBuf>,

    /// Replace the file at --disk even if it is not a trace.
    #[arg(long, help_heading = "Trace disk")]
    pub force: bool,

    /// Room reserved for the trace disk while tracing (a block device
    /// keeps its own size). A trace that ends cleanly is cut back to what
    /// it holds.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_size, help_heading = "Trace disk")]
    pub disk_size: u64,

    /// Size at which the trace is cut into segments, each compressed and
    /// checked on its own (64K to 64M, a multiple of 4K).
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = parse_segment_size, help_heading = "Trace disk")]
    pub segment_size: u64,

    /// When the disk is full, overwrite the oldest segments (keep the end)
    /// instead of stopping (keep the beginning).
    #[arg(long, help_heading = "Trace disk")]
    pub wrap: bool,

    /// Stop tracing after this many steps.
    #[arg(long, value_name = "N", help_heading = "Tracing")]
    pub max_steps: Option<u64>,

    /// Start tracing when execution reaches this place (a hardware
    /// breakpoint): a linear address (0x100000), a routine of the
    /// kernel's symbols, found as `vtrace analyze` finds them
    /// (start_kernel, schedule+0x10), or PROGRAM:ROUTINE, a routine of a
    /// user program linked at a fixed address (vtprog:main), found by name
    /// or path in the --initrd, else as a file on this host; it fires
    /// only in tasks running that program, where the kernel's tasks can be
    /// read.
    #[arg(long, value_name = "WHERE", value_parser = parse_location, help_heading = "Triggers")]
    pub start_at: Option<Location>,

    /// End the run when tracing stops (by --max-steps, --stop-at, the
    /// guest, the hotkey or vtrace ctl) instead of letting the guest run
    /// on; exit status 0.
    #[arg(long, help_heading = "Tracing")]
    pub exit_after_trace: bool,

    /// Count the guest's own requests to start and stop tracing (its
    /// TRACE_START, TRACE_STOP and TRACE_REGION hypercalls) instead of
    /// obeying them: for probes or peeping without the stretches a guest
    /// asks to trace (the demo OS traces part of one task itself).
    #[arg(long, help_heading = "Tracing")]
    pub ignore_guest_tracing: bool,

    /// Stop tracing when execution reaches this place (as --start-at).
    #[arg(long, value_name = "WHERE", value_parser = parse_location, help_heading = "Triggers")]
    pub stop_at: Option<Location>,

    /// Copy guest memory into the trace each time execution reaches a
    /// place: `WHERE:REGISTER:LENGTH[:NAME]` takes LENGTH bytes (up to 4096)
    /// at the address REGISTER (rax ... r15) holds, before the instruction
    /// at WHERE runs (a place as --start-at takes it), e.g. kprintf:rdi:64.
    /// Bytes on pages that are not present are skipped, and the trace says
    /// so. Repeatable, up to 30. Taken at every step while tracing; while
    /// not, through the CPU's breakpoints, as many places as they have room
    /// for, where the host lets breakpoints reach vtrace. Needs a trace
    /// disk (--disk, default vtrace.vtd); `vtrace analyze captures` lists
    /// them.
    #[arg(long = "capture", value_name = "CAPTURE", value_parser = parse_capture, help_heading = "Probes, captures and peeping")]
    pub captures: Vec<CaptureRequest>,

    /// Trace each call of a routine, from its first instruction until it
    /// returns to its caller, its callees and the interrupts taken
    /// meanwhile included, and run untraced elsewhere (a place as
    /// --start-at takes it, e.g. page_fault). Where the CPU leaves the
    /// routine's task inside a call (the scheduler runs another), the
    /// vCPU is still stepped, to see the return, but nothing is recorded
    /// until the task runs again; a routine that never returns (a task's
    /// entry) keeps its window open to the end. Repeatable, as many as the
    /// CPU's 4 breakpoints hold (one fewer with --start-at); the summary
    /// says what each routine's windows came to.
    #[arg(
        long = "trace-function",
        value_name = "ROUTINE",
        value_parser = parse_location,
        conflicts_with = "trace", help_heading = "Triggers")]
    pub trace_functions: Vec<Location>,

    /// Enable probes: static probes compiled into the kernel by pattern
    /// (sched:switch, 'sched:*'; `vtrace probes list` lists them), whose
    /// semaphores are set at boot; or fn:ROUTINE, which fires on entry to
    /// a routine of the kernel's symbols with its six argument registers
    /// (a place as --start-at takes it; while tracing is off through the
    /// CPU's breakpoints, which hold 4 with --trace-function and
    /// --start-at). Fires are counted (`vtrace ctl status`, the run's
    /// summary) and recorded in the trace disk (--disk, default
    /// vtrace.vtd) with their arguments, traced or not; `vtrace analyze
    /// probes` counts them. Repeatable.
    #[arg(
        long = "probe",
        value_name = "PATTERN",
        help_heading = "Probes, captures and peeping"
    )]
    pub probes: Vec<String>,

    /// Peep: sample the --sample variables every INTERVAL of host time
    /// (10us up; units ns, us, ms, s) from a host thread that reads guest
    /// RAM while the guest runs on, with no VM exit. Each sample carries
    /// the guest's virtual time and the host's, and goes into the trace
    /// disk (--disk, default vtrace.vtd) whether tracing is on or not;
    /// `vtrace analyze samples` prints the series. A last sample is taken
    /// when the guest stops.
    #[arg(long, value_name = "INTERVAL", value_parser = crate::units::parse_interval, help_heading = "Probes, captures and peeping")]
    pub peep: Option<std::time::Duration>,

    /// A variable to sample with --peep: a symbol of the kernel (its
    /// symbol table, or kallsyms for a Linux bzImage) or a hexadecimal
    /// address (a link address of the kernel image, else guest-physical),
    /// then :TYPE, one of u8, u16, u32, u64 (the default) or i64. Up to 16;
    /// repeatable.
    #[arg(
        long = "sample",
        value_name = "SYMBOL[:TYPE]",
        requires = "peep",
        help_heading = "Probes, captures and peeping"
    )]
    pub samples: Vec<String>,

    /// With --peep: every sample also takes the running pc, for a profile
    /// by routine (`vtrace analyze samples`). This one is not free: the
    /// vCPU is stopped for it, one VM exit per sample.
    #[arg(long, requires = "peep", help_heading = "Probes, captures and peeping")]
    pub sample_pc: bool,

    /// Control socket for `vtrace ctl` (made when a trace disk is used;
    /// default vtrace-PID.sock in $XDG_RUNTIME_DIR, or else in a 0700
    /// directory of the user's own, /tmp/vtrace-UID).
    #[arg(long, value_name = "PATH", help_heading = "Control")]
    pub control: Option<PathBuf>,

    /// Stop tracing when the guest takes one of these exceptions: a comma
    /// list of names (de, nmi, bp, of, br, ud, df, ts, np, ss, gp, pf, ...)
    /// or vectors; `none`; or `default` (de,nmi,bp,of,br,ud,df,ts,np,ss,gp).
    #[arg(long, value_name = "LIST", default_value = "default", value_parser = parse_autostop, help_heading = "Tracing")]
    pub autostop: Autostop,

    /// KVM device to use.
    #[arg(long, value_name = "PATH", default_value = vtrace_vmm::KVM_DEVICE, help_heading = "Guest")]
    pub kvm_device: PathBuf,
}

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
    /// A Chrome/Perfetto trace-event JSON timeline: a process per guest
    /// process and a track per thread (per address space where the trace
    /// names no tasks), an event per routine call, instants for interrupts
    /// and system calls, and a counter of runnable tasks.
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
    /// Two traces side by side (two kernels, two configurations): steps
    /// per routine in each (self and total) by the size of the change,
    /// routines only one of them ran, the instruction mix and interrupts,
    /// and with --flame a differential flame graph.
    Diff(DiffArgs),
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
    /// arg0), as a signed number.
    #[arg(long, value_name = "ARG", value_parser = clap::value_parser!(u8).range(0..6))]
    pub quantize: Option<u8>,
    /// Print JSON: a list of objects with keys probe and count (and
    /// quantize: arg, buckets of value and count, without).
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
    /// First step to print.
    #[arg(long, value_name = "N")]
    pub from: Option<u64>,
    /// Number of steps to print.
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
    /// interrupts taken meanwhile (uftrace's -F).
    #[arg(long, value_name = "NAME")]
    pub function: Option<String>,
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
}

/// A hex number, with or without `0x`.
fn parse_hex(text: &str) -> Result<u64, String> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    u64::from_str_radix(digits, 16).map_err(|_| format!("{text:?} is not a hex number (0x103000)"))
}

/// `--append`'s long help: the default command lines, as they are.
fn append_help() -> String {
    use vtrace_vmm::{default_linux_cmdline, CpuProfile};
    format!(
        "Added to the kernel command line, after the default one (or after --cmdline's). \
         The default for a Linux kernel with --cpu baseline:\n  {}\nwith --cpu host:\n  {}\n\
         The switches after noapic keep Linux off what the baseline CPU hides (on some hosts \
         the CPU's own bits reach an untraced guest). The built-in demo OS has no default.",
        default_linux_cmdline(CpuProfile::Baseline),
        default_linux_cmdline(CpuProfile::Host)
    )
}
