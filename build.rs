//! Puts the commit vtrace was built from into `vtrace --version` and into
//! the traces it writes, so a trace says which code made it.

use std::path::Path;
use std::process::Command;

fn main() {
    let version = env!("CARGO_PKG_VERSION");
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let long = match commit {
        Some(commit) => format!("{version} (commit {commit})"),
        None => format!("{version} (built outside a git checkout)"),
    };
    println!("cargo:rustc-env=VTRACE_LONG_VERSION={long}");
    // Build again when HEAD moves: a commit, a checkout. Only files that
    // exist are named (cargo reruns every time for a missing one).
    let git = Path::new(".git");
    let mut watched = vec![git.join("HEAD"), git.join("packed-refs")];
    if let Ok(head) = std::fs::read_to_string(git.join("HEAD")) {
        if let Some(reference) = head.trim().strip_prefix("ref: ") {
            watched.push(git.join(reference));
        }
    }
    for path in watched.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-changed=build.rs");
}
