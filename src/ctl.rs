//! `vtrace ctl`.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;

use anyhow::Result;
use vtrace_vmm::control_socket as control;

use crate::cli::CtlArgs;
use crate::exit_status::NoRunListening;

/// The control socket of the one live run of this user in the default
/// directory. Sockets of other users are never considered (a socket there
/// may be anyone's), nor ones nobody answers on (left by a killed run).
fn find_socket() -> Result<PathBuf> {
    let dir = control::default_dir();
    // SAFETY: getuid has no preconditions and cannot fail.
    let me = unsafe { libc::getuid() };
    let candidates = std::fs::read_dir(&dir)
        .map_err(|e| NoRunListening(format!("cannot list {}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vtrace-") && n.ends_with(".sock"))
        })
        .filter(|p| {
            std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket() && m.uid() == me)
        });
    let mut live: Vec<PathBuf> = candidates
        .filter(|p| std::os::unix::net::UnixStream::connect(p).is_ok())
        .collect();
    match live.len() {
        0 => Err(NoRunListening(format!(
            "no vtrace run of yours with a trace disk is listening in {}; start one with \
             --disk or --trace, or name its socket with --control",
            dir.display()
        ))
        .into()),
        1 => Ok(live.remove(0)),
        _ => Err(NoRunListening(format!(
            "several vtrace runs are listening; choose one with --control: {}",
            live.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .into()),
    }
}

pub fn ctl(args: CtlArgs) -> Result<i32> {
    let path = match args.control {
        Some(p) => p,
        None => find_socket()?,
    };
    let answer = control::send(&path, &args.command.request())?;
    println!("{answer}");
    Ok(if answer.starts_with("error:") { 1 } else { 0 })
}
