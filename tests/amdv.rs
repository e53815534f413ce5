//! vtrace on a real AMD-V KVM: the AMD-V test machine (scripts/amdv.sh)
//! boots the installed kernel with its kvm-amd under QEMU's SVM emulation,
//! and `vtrace` runs in it. Stepping there rides on RFLAGS.TF, as on every
//! VT-x and AMD-V host, where this project's own hosts emulate kernel code.

mod common;

use common::amdv::{amdv, amdv_available};
use common::*;

/// The listing of a trace, without the progress bar.
fn listing(trace: &std::path::Path) -> Vec<String> {
    let o = run(&["analyze", "listing", trace.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o).lines().map(str::to_owned).collect()
}

fn info_json(trace: &std::path::Path) -> serde_json::Value {
    let o = run(&["info", "--json", trace.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("info --json")
}

#[test]
fn the_machine_has_kvm_amd_and_runs_the_demo_os_untraced() {
    if !amdv_available() {
        return;
    }
    let m = amdv(
        &[],
        "grep -qw svm /proc/cpuinfo && echo svm; lsmod | grep -q '^kvm_amd' && echo kvm_amd; \
         vtrace run --no-input -q",
    );
    assert_eq!(m.status, Some(0), "{}\n{}", m.output, m.stderr);
    assert!(
        m.output.contains("svm") && m.output.contains("kvm_amd"),
        "{}",
        m.output
    );
    assert!(m.output.contains("demo OS done"), "{}", m.output);
}

/// The demo OS traced from its first instruction on the AMD-V machine and
/// here. Before the trap flag was re-armed where KVM handles an
/// instruction itself, the AMD-V trace lost everything after the switch to
/// long mode (49,625 steps, 356 gaps). Now both hosts record the same
/// steps, registers and events, REP iterations and STI shadows included,
/// up to the first page fault; a fault the CPU delivers on AMD-V runs its
/// handler unstepped, and each is marked by a gap where it happened, never
/// lost silently: the AMD-V trace has one gap per page fault this host
/// traced.
#[test]
fn demo_os_traced_on_amdv_matches_this_host() {
    if !amdv_available() || !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let here = dir.path().join("here.vtd");
    let o = run(&[
        "run",
        "--no-input",
        "-q",
        "--trace",
        "--disk",
        here.to_str().unwrap(),
        "--disk-size",
        "64M",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));

    let m = amdv(
        &[],
        "vtrace run --no-input -q --trace --disk /out/amdv.vtd --disk-size 64M",
    );
    assert_eq!(m.status, Some(0), "{}\n{}", m.output, m.stderr);
    let there = m.file("amdv.vtd");

    let (a, b) = (listing(&here), listing(&there));
    let first_gap = b.iter().position(|l| l.contains("GAP")).unwrap_or(b.len());
    assert!(first_gap > 0);
    assert_eq!(
        a[..first_gap],
        b[..first_gap],
        "the traces differ before the AMD-V trace's first gap"
    );
    // The first divergence is the first page fault here.
    let first_fault = a.iter().position(|l| l.contains("#PF")).unwrap();
    assert!(first_fault >= first_gap - 1, "{first_fault} {first_gap}");

    let (ih, ia) = (info_json(&here), info_json(&there));
    assert_eq!(ih["gaps"], 0);
    let faults_here = a
        .iter()
        .filter(|l| l.contains("interrupt 14 (#PF)"))
        .count();
    assert!(faults_here > 0);
    assert_eq!(ia["gaps"].as_u64(), Some(faults_here as u64), "{ia}");
}
