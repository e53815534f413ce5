//! `vtrace completions` and `vtrace man`: what clap_complete and
//! clap_mangen make of the command line's own definition, so they never
//! drift from it.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use clap::CommandFactory;

use crate::cli::Cli;

/// Writes `text` to standard output; a reader that closed the pipe early
/// (`| head`) is not an error.
fn print(text: &[u8]) -> Result<i32> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("cannot write to standard output")
        }
        _ => Ok(0),
    }
}

/// Prints the completion script for `shell`.
pub fn completions(shell: clap_complete::Shell) -> Result<i32> {
    // Into memory first: clap_complete panics on a failed write.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "vtrace", &mut script);
    print(&script)
}

/// Prints vtrace(1), or writes a page per command into `dir`.
pub fn man(dir: Option<&Path>) -> Result<i32> {
    let command = Cli::command();
    match dir {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command)
                .render(&mut page)
                .context("cannot make the manual page")?;
            print(&page)
        }
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(command, dir)
                .with_context(|| format!("cannot write the manual pages into {}", dir.display()))?;
            say!("vtrace: wrote the manual pages into {}", dir.display());
            Ok(0)
        }
    }
}
