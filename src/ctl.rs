//! `vtrace ctl`.

use std::path::PathBuf;

use anyhow::{bail, Result};
use vtrace_vmm::control;

use crate::cli::CtlArgs;

/// The one control socket in the default directory.
fn find_socket() -> Result<PathBuf> {
    let dir = control::default_dir();
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vtrace-") && n.ends_with(".sock"))
        })
        .collect();
    match found.len() {
        0 => bail!(
            "no vtrace run with a trace disk is running (no vtrace-*.sock in {}); \
             start one with --disk or --trace, or name its socket with --control",
            dir.display()
        ),
        1 => Ok(found.remove(0)),
        _ => bail!(
            "several vtrace runs are listening; choose one with --control: {}",
            found
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

pub fn ctl(args: CtlArgs) -> Result<i32> {
    let path = match args.control {
        Some(p) => p,
        None => find_socket()?,
    };
    let answer = control::send(&path, &args.command.join(" "))?;
    println!("{answer}");
    Ok(if answer.starts_with("error:") { 1 } else { 0 })
}
