//! Command-line syntax.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::exit_status::STATUS_TABLE;

mod analyze;
mod run;

pub use analyze::*;
pub use run::*;

use vtrace_session::DEFAULT_TRACE;

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
    Analyze(Box<AnalyzeArgs>),
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
    /// List each static probe (provider:name), how many arguments it
    /// passes and the addresses of its sites; then, for a Linux kernel, its
    /// own tracepoints (tp:SYSTEM:NAME, from its kallsyms, jump table, event
    /// data and BTF), with their sites and parameters.
    List {
        /// The kernel: an ELF or a bzImage (default: the built-in demo OS).
        #[arg(long, value_name = "FILE")]
        kernel: Option<PathBuf>,
        /// Only the probes this glob matches ('tp:sched:*', 'fn' probes
        /// are not listed); a tracepoint is then shown in full: its
        /// parameters, its event's fields and where each is read from, and
        /// what each site gives. A pattern that matches none exits with
        /// status 2.
        #[arg(value_name = "PATTERN")]
        pattern: Option<String>,
        /// Print JSON: a list of objects with keys probe, arguments and
        /// sites (addresses as hex text); a tracepoint's also system, name,
        /// parameters, fields (name, type, from) and site_states.
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
    /// Run the step benchmark (or --cpus's traced comparison) N times and
    /// give the best and the median ratio as well (a host's speed swings
    /// from run to run; the goal is the best of three). With --json the
    /// top-level keys are the best run's, and `runs` holds every run.
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
    /// Trace the demo OS's SMP mode on one CPU and on N (up to 16), and compare the
    /// steps per second each CPU gets with the one CPU's (goal: 0.8 or
    /// more); then trace N copies of the one-CPU run at once, each in a
    /// process of its own, against one alone: nothing passes between
    /// them, so this is the most the host allows the ratio; then run the
    /// SMP demo's work untraced on one CPU and on N and compare the times
    /// (goal: near N times faster, as far as the host has cores). With
    /// --json: cpus, one_cpu_steps_per_s, steps_per_s,
    /// per_cpu_steps_per_s, per_cpu_ratio, step_pairs (two CPUs' steps
    /// run at once), pair_pauses (pairing paused: the host's cores were
    /// busy), host_limit_alone_steps_per_s, host_limit_steps_per_s (each
    /// of the N at once), host_limit_ratio, untraced_one_cpu_s,
    /// untraced_s, untraced_speedup; with --runs also
    /// per_cpu_ratio_median and runs.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=i64::from(vtrace_demo::DEMO_OS_MAX_CPUS)), conflicts_with = "analyzer")]
    pub cpus: u8,
    /// One of the processes --cpus starts to measure the host's limit:
    /// traces its work on one CPU and prints what it measured as JSON.
    #[arg(long, hide = true, conflicts_with_all = ["analyzer", "cpus", "runs"])]
    pub host_limit_part: bool,
    /// Trace with `run --record-values`: what recording the memory values
    /// registers do not give costs.
    #[arg(long, conflicts_with = "analyzer")]
    pub record_values: bool,
    /// Print JSON (keys: bare_exits_per_s, traced_exits_per_s, ratio,
    /// bytes_per_step, peak_rss_bytes; engine_steps, engine_seconds,
    /// engine_steps_per_s, engine_speedup (over stepping's traced steps per
    /// second) and engine_bytes_per_step, null where the engine's library
    /// is not built; with --runs also ratio_median and runs).
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
