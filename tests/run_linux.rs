//! An unmodified Linux kernel boots under `vtrace run` far enough to print
//! its banner on the serial console. `scripts/test.sh` installs Debian's
//! linux-image-cloud-amd64 for this; VTRACE_TEST_KERNEL names another.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;

fn test_kernel() -> PathBuf {
    if let Some(path) = std::env::var_os("VTRACE_TEST_KERNEL") {
        return PathBuf::from(path);
    }
    let mut kernels: Vec<PathBuf> = std::fs::read_dir("/boot")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    kernels.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("vmlinuz-"))
    });
    // Debian's cloud kernel first: it is the one the test script installs.
    kernels.sort_by_key(|p| !p.to_string_lossy().contains("cloud"));
    kernels.into_iter().next().unwrap_or_else(|| {
        panic!(
            "no Linux kernel in /boot: run scripts/test.sh (it installs \
             linux-image-cloud-amd64), or set VTRACE_TEST_KERNEL"
        )
    })
}

#[test]
fn unmodified_linux_prints_its_banner() {
    if !kvm_available() {
        return;
    }
    let kernel = test_kernel();
    let mut child = vtrace()
        .args(["run", "--no-input", "--memory", "128M", "--kernel"])
        .arg(&kernel)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vtrace");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // The banner comes through the early serial console a few million
    // instructions into the kernel: seconds here. The bound is generous for
    // a loaded machine, not a performance target.
    let bound = Duration::from_secs(120);
    let started = Instant::now();
    let mut seen = Vec::new();
    let banner = loop {
        let left = bound.saturating_sub(started.elapsed());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("Linux version") => break Some(line),
            Ok(line) => seen.push(line),
            Err(_) => break None,
        }
    };
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let banner = banner.unwrap_or_else(|| {
        panic!(
            "no 'Linux version' banner from {} within {bound:?}\nconsole:\n{}\nvtrace:\n{}",
            kernel.display(),
            seen.join("\n"),
            stderr(&out)
        )
    });
    assert!(banner.contains("Linux version"), "{banner}");
    let log = stderr(&out);
    assert!(
        log.contains("decompressed on the host"),
        "the LZ4/gzip/zstd fast path: {log}"
    );
}
