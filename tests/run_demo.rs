//! `vtrace run` on the built-in demo OS and the real-mode guest.

mod common;

use common::*;

/// CRC-32 (IEEE) of the data the demo's crc32 task generates, computed here
/// independently of the guest.
fn expected_crc() -> u32 {
    let mut crc = 0xffff_ffffu32;
    for i in 0..8192u64 {
        crc ^= u32::from((i * 7 + (i >> 5)) as u8);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & (0u32.wrapping_sub(crc & 1)));
        }
    }
    !crc
}

/// Trace of the 24x24 product the matrix task computes.
fn expected_matrix_trace() -> u64 {
    let n = 24;
    let a: Vec<u64> = (0..n * n).map(|i| (i % 7 + 1) as u64).collect();
    let b: Vec<u64> = (0..n * n).map(|i| (i % 5 + 2) as u64).collect();
    (0..n)
        .map(|i| (0..n).map(|k| a[i * n + k] * b[k * n + i]).sum::<u64>())
        .sum()
}

/// Pages each task touches for the first time: each is one page fault.
fn expected_page_faults() -> u64 {
    let pages = |bytes: u64| bytes.div_ceil(4096);
    pages(10_000) + pages(8192) + pages(3 * 24 * 24 * 8)
}

#[test]
fn demo_os_boots_runs_its_tasks_and_exits_zero() {
    if !kvm_available() {
        return;
    }
    let out = run(&["run", "--no-input"]);
    let (console, log) = (stdout(&out), stderr(&out));
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{console}\nstderr:\n{log}"
    );
    assert!(console.contains("vtrace demo OS"), "{console}");
    assert!(
        console.contains("vtrace ABI 1"),
        "VERSION hypercall answered: {console}"
    );
    assert!(console.contains("memory: 256 MiB below 4 GiB"), "{console}");
    // pi(10000) = 1229.
    assert!(
        console.contains("sieve: primes below 10000: 1229 (pid 0)"),
        "{console}"
    );
    assert!(
        console.contains(&format!(
            "crc32: checksum of 8 KiB: {} (pid 1)",
            expected_crc()
        )),
        "{console}"
    );
    assert!(console.contains("matrix: woke 3 times"), "{console}");
    assert!(
        console.contains(&format!(
            "matrix: trace of 24x24 product: {} (pid 2)",
            expected_matrix_trace()
        )),
        "{console}"
    );
    // sieve: yield, getpid, write, exit; crc32 the same; matrix: 3 sleeps,
    // 2 writes, getpid, exit.
    assert!(
        console.contains(&format!(
            "page faults: {}, system calls: 15",
            expected_page_faults()
        )),
        "{console}"
    );
    assert!(
        log.contains("vtrace: guest: demo OS done"),
        "LOG hypercall: {log}"
    );
    assert!(log.contains("guest exited with status 0"), "{log}");
}

#[test]
fn demo_timer_count_agrees_with_the_virtual_clock() {
    if !kvm_available() {
        return;
    }
    let out = run(&["run", "--no-input"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (console, log) = (stdout(&out), stderr(&out));
    let guest_ticks = number_after(&console, "timer ticks:").expect("guest tick count");
    let delivered = number_before(run_summary(&log), "timer interrupts").expect("vmm IRQ0 count");
    let seconds = virtual_seconds(run_summary(&log)).expect("virtual time");
    // The guest reads its counter after disabling interrupts for good, so
    // every IRQ0 the VMM injected was counted by the guest, and no more.
    assert_eq!(guest_ticks, delivered, "{console}\n{log}");
    // PIT channel 0 at divisor 4773: 1193182 / 4773 = 249.98 Hz. Ticks can
    // only be lost (coalesced while the guest has interrupts off, or while
    // the host runs something else in the vCPU's place), never invented;
    // the demo keeps interrupt-off stretches short. The lower bound is
    // loose: with the suite's two test files at a time on 2 cores, a run
    // got 165 ticks of 327 (alone, all of them).
    let expected = seconds * 1_193_182.0 / 4773.0;
    assert!(
        delivered as f64 <= expected + 1.0,
        "{delivered} ticks in {seconds} s"
    );
    assert!(
        delivered as f64 >= expected * 0.3,
        "{delivered} ticks in {seconds} s"
    );
    assert!(
        delivered >= 20,
        "the workload spans many ticks: {delivered}"
    );
}

#[test]
fn demo_console_output_is_deterministic() {
    if !kvm_available() {
        return;
    }
    // Everything but the timing line (ticks and switches depend on wall time
    // until tracing makes the clock step-driven).
    let stable = |o: &std::process::Output| -> String {
        stdout(o)
            .lines()
            .filter(|l| !l.starts_with("timer ticks"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let a = run(&["run", "--no-input", "--append", "same input"]);
    let b = run(&["run", "--no-input", "--append", "same input"]);
    assert_eq!(a.status.code(), Some(0));
    assert!(
        stable(&a).contains("command line: \"same input\""),
        "{}",
        stable(&a)
    );
    assert_eq!(stable(&a), stable(&b));
}

#[test]
fn real_mode_guest_runs() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = write_guest(dir.path(), "hello.bin", vtrace_demo::REAL_MODE_HELLO);
    let out = run(&[
        "run",
        "--no-input",
        "--real-mode",
        image.to_str().unwrap(),
        "--load-addr",
        "0x7c00",
    ]);
    assert_eq!(
        out.status.code(),
        Some(vtrace_demo::REAL_MODE_HELLO_STATUS),
        "exit status is the guest's: {}",
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("hello from real mode"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("real-mode image at 0x7c00"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn guest_memory_is_reserved_lazily() {
    if !kvm_available() {
        return;
    }
    let mut child = vtrace()
        .args(["run", "--no-input", "--memory", "4G"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Sample the VMM's resident set from /proc while the guest runs.
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0u64;
    while child.try_wait().unwrap().is_none() {
        if let Ok(status) = std::fs::read_to_string(&status_path) {
            if let Some(kib) = number_after(&status, "VmHWM:") {
                peak_kib = peak_kib.max(kib);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // 3 GiB below the hole, 1 GiB above it.
    assert!(
        stdout(&out).contains("memory: 3072 MiB below 4 GiB"),
        "{}",
        stdout(&out)
    );
    let reported_mib = number_after(&stderr(&out), "peak RSS").expect("summary has peak RSS");
    assert!(peak_kib > 0, "sampled /proc at least once");
    assert!(
        peak_kib < 256 * 1024,
        "peak RSS {peak_kib} KiB for a 4 GiB guest"
    );
    assert!(
        reported_mib < 256,
        "peak RSS {reported_mib} MiB for a 4 GiB guest"
    );
}

#[test]
fn console_hotkeys_help_and_quit() {
    if !kvm_available() {
        return;
    }
    use std::io::Write;
    let mut child = vtrace()
        .args(["run"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Help, an unbound key, then quit, before the demo gets to its end.
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"\x01h\x01z\x01x")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert!(log.contains("Ctrl-A x    quit vtrace"), "help: {log}");
    assert!(log.contains("Ctrl-A z does nothing"), "{log}");
    assert!(log.contains("terminated by Ctrl-A x"), "{log}");
    assert!(log.contains("quit by the user"), "{log}");
    assert!(
        !stdout(&out).contains("exiting"),
        "quit before the guest finished"
    );
}

/// Runs `shell` in a real pseudo-terminal (util-linux `script`) in `dir`.
fn in_pty(dir: &std::path::Path, shell: &str) -> String {
    let out = std::process::Command::new("script")
        .args(["-qec", shell, "/dev/null"])
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script (util-linux) runs");
    stdout(&out)
}

#[test]
fn raw_terminal_is_restored_on_exit_and_on_sigterm() {
    if !kvm_available() {
        return;
    }
    let vtrace = env!("CARGO_BIN_EXE_vtrace");
    let dir = tempfile::tempdir().unwrap();
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();

    let text = in_pty(
        dir.path(),
        &format!("stty -g > before; {vtrace} run -q; echo status=$?; stty -g > after"),
    );
    assert!(text.contains("status=0"), "{text}");
    assert!(text.contains("vtrace demo OS"), "{text}");
    assert!(!read("before").trim().is_empty());
    assert_eq!(
        read("before"),
        read("after"),
        "restored after a normal exit"
    );

    // Killed mid-run: the terminal was raw while it ran, and is not after.
    // Its timer slowed a thousandfold, the demo cannot finish before the
    // kill however slowly a loaded machine runs the shell.
    let text = in_pty(
        dir.path(),
        &format!(
            "stty -g > before; {vtrace} run -q --memory 64M --clock prescale:1000 < /dev/tty & \
             sleep 0.3; stty -g > during; \
             kill -TERM $!; wait $!; echo status=$?; stty -g > after"
        ),
    );
    assert!(text.contains("status=143"), "died of SIGTERM: {text}");
    assert_ne!(read("before"), read("during"), "raw mode while running");
    assert_eq!(read("before"), read("after"), "restored after SIGTERM");
}
