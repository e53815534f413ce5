//! `vtrace`: the command line. Parsing and wiring only; the work is in the
//! library crates.

/// `eprintln!` through [`vtrace_vmm::user_message`], which never panics
/// (a message to a stderr that is gone, `2>&1 | head`, is dropped) and
/// escapes what could steer the terminal. Defined before the modules,
/// which use it.
macro_rules! say {
    ($($arg:tt)*) => {
        vtrace_vmm::user_message(&format!($($arg)*))
    };
}

mod analyze;
mod bench;
mod cli;
mod cpus_bench;
mod ctl;
mod doctor;
mod exit_status;
mod info;
mod manual;
mod peep;
mod probes;
mod run;
mod step_bench;
mod units;

use clap::Parser;

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("VTRACE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour codes only for a terminal: not in a log file or a pipe.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .without_time()
        .init();
}

/// The error and those of its causes its message does not already include
/// (library errors quote their cause; anyhow contexts do not).
fn describe(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text = format!("{text}: {cause}");
        }
    }
    text
}

/// Caps glibc's malloc arenas at two for the analyses. Their decoding,
/// encoding and writing threads each got an arena of their own, and each
/// arena kept the segments' columns freed into it (about 17 MB a segment):
/// the export of a 50.7 M-step trace peaked at 247-253 MiB, and at 210-212
/// MiB with two arenas, in the same time (one arena: 197-199 MiB, up to
/// 6 % slower). Not for `run`: its per-step path was not measured with it.
fn few_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: a plain setting of glibc's allocator, for the arenas it makes
    // from now on; it holds no pointer.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn main() {
    let cli = cli::Cli::parse();
    init_logging(cli.verbose);
    let status = match cli.command {
        cli::Command::Run(args) => run::run(*args),
        cli::Command::Info(args) => info::info(args),
        cli::Command::Analyze(args) => {
            few_malloc_arenas();
            analyze::analyze(*args)
        }
        cli::Command::Bench(args) => bench::bench(args),
        cli::Command::Ctl(args) => ctl::ctl(args),
        cli::Command::Probes(args) => probes::probes(args),
        cli::Command::Doctor(args) => doctor::doctor(args),
        cli::Command::Completions { shell } => manual::completions(shell),
        cli::Command::Man { dir } => manual::man(dir.as_deref()),
    };
    match status {
        Ok(code) => std::process::exit(code),
        Err(error) => {
            vtrace_vmm::user_message(&format!("vtrace: error: {}", describe(&error)));
            if let Some(advice) = exit_status::advice(&error) {
                vtrace_vmm::user_message(&format!("vtrace: {advice}"));
            }
            std::process::exit(exit_status::for_error(&error));
        }
    }
}
