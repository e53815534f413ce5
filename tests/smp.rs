//! `vtrace run --cpus N`: a machine of several CPUs, on the demo OS's SMP
//! mode (CPU 0 starts the others with INIT and STARTUP IPIs through its
//! local APIC, they share a queue of work items under a spinlock and
//! report each item with an IPI).

mod common;

use common::*;

/// The primes below each work item's n (200 + 40 i, i < 24), counted here
/// by a sieve, independently of the guest's trial division.
fn expected_primes() -> u64 {
    let limit = 200 + 40 * 23;
    let mut composite = vec![false; limit];
    for k in 2..limit {
        if !composite[k] {
            (k * k..limit).step_by(k).for_each(|m| composite[m] = true);
        }
    }
    let below = |n: usize| (2..n).filter(|&k| !composite[k]).count() as u64;
    (0..24).map(|i| below(200 + 40 * i)).sum()
}

/// The number after `label` on the console line that starts with `line`.
fn number_after(console: &str, line: &str, label: &str) -> Option<u64> {
    let l = console.lines().find(|l| l.starts_with(line))?;
    let rest = &l[l.find(label)? + label.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())?
        .parse()
        .ok()
}

fn smp_demo(cpus: u8) {
    let n = cpus.to_string();
    let out = run(&["run", "--no-input", "--cpus", &n]);
    let (console, log) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{console}\n{log}");
    assert!(log.contains("built-in demo OS (SMP)"), "{log}");
    let ids: Vec<String> = (0..cpus).map(|c| c.to_string()).collect();
    let up = format!("SMP: {cpus} CPUs up (APIC IDs {})", ids.join(" "));
    assert!(console.contains(&up), "every CPU started: {console}");
    assert!(
        console.contains(&format!(
            "SMP: 24 work items, {} primes counted",
            expected_primes()
        )),
        "{console}"
    );
    let mut items = 0;
    for cpu in 0..cpus {
        let line = format!("SMP: CPU {cpu}: ");
        items += number_after(&console, &line, &line).unwrap_or_else(|| panic!("{line} {console}"));
        if cpu > 0 {
            // Each other CPU sleeps until CPU 0's wake IPI.
            let ipis = number_after(&console, &line, "items, ").unwrap();
            assert!(ipis >= 1, "CPU {cpu} took the wake IPI: {console}");
        }
    }
    assert_eq!(items, 24, "every item done once: {console}");
    // The one-CPU demo's tasks ran on CPU 0 as they do alone.
    assert!(
        console.contains("sieve: primes below 10000: 1229 (pid 0)"),
        "{console}"
    );
    assert!(log.contains("demo OS done"), "the LOG hypercall: {log}");
}

#[test]
fn the_smp_demo_starts_two_cpus_and_shares_its_work() {
    if kvm_available() {
        smp_demo(2);
    }
}

#[test]
fn the_smp_demo_starts_four_cpus_and_shares_its_work() {
    if kvm_available() {
        smp_demo(4);
    }
}

#[test]
fn a_cpu_count_out_of_range_is_refused_before_anything_runs() {
    for bad in ["0", "255", "many"] {
        let out = run(&["run", "--no-input", "--cpus", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(stderr(&out).contains("--cpus"), "{}", stderr(&out));
    }
}

#[test]
fn several_cpus_refuse_what_cannot_use_them_yet() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = write_guest(dir.path(), "hello.bin", vtrace_demo::REAL_MODE_HELLO);
    let out = run(&[
        "run",
        "--no-input",
        "--cpus",
        "2",
        "--real-mode",
        image.to_str().unwrap(),
    ]);
    assert_ne!(out.status.code(), Some(0));
    let log = stderr(&out);
    assert!(
        log.contains("a real-mode image") && log.contains("--cpus 1"),
        "{log}"
    );

    let disk = dir.path().join("t.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--cpus",
        "2",
        "--trace",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    assert_ne!(out.status.code(), Some(0));
    let log = stderr(&out);
    assert!(log.contains("not built yet"), "{log}");
    assert!(!disk.exists(), "no disk made for a run that cannot trace");
}
