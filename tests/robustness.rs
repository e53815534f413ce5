//! Nothing lost, nothing hangs, nothing trusted: the real binary under
//! signals, floods from a guest, and damaged or crafted input.

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;
use vtrace_storage::{Event, Record, TraceReader, TraceReason};

fn records(path: &Path) -> Vec<Record> {
    let reader = TraceReader::open(path).expect("open trace");
    (0..reader.segments().len())
        .flat_map(|i| reader.decode(i).expect("segment decodes"))
        .collect()
}

/// Steps in the segments already sealed on the disk (0 before the first).
fn sealed_steps(disk: &Path) -> u64 {
    TraceReader::open(disk)
        .map(|r| r.segments().iter().map(|s| s.found.header.steps).sum())
        .unwrap_or(0)
}

/// Starts tracing the demo OS onto `disk`, its control socket at `control`.
fn spawn_traced_demo(disk: &Path, control: &Path, extra: &[&str]) -> Child {
    vtrace()
        .args(["run", "--no-input", "-q", "--trace", "--disk-size", "64M"])
        .arg("--disk")
        .arg(disk)
        .arg("--control")
        .arg(control)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vtrace")
}

fn kill(child: &Child, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

/// Waits until `disk` holds at least one sealed segment: tracing is well
/// under way, and one more segment is being filled in memory.
fn wait_for_a_segment(child: &mut Child, disk: &Path) {
    let started = Instant::now();
    while sealed_steps(disk) == 0 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the guest finished before the signal"
        );
        assert!(started.elapsed() < Duration::from_secs(120), "no segment");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn stop_signals_keep_every_step_and_remove_the_socket() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "-q",
        "--trace",
        "--disk-size",
        "64M",
        "--disk",
        full.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let full = records(&full);

    for (signal, status, number) in [("INT", 130, 2u8), ("TERM", 143, 15), ("HUP", 129, 1)] {
        let disk = dir.path().join(format!("{signal}.vtd"));
        let control = dir.path().join(format!("{signal}.sock"));
        let mut child = spawn_traced_demo(&disk, &control, &[]);
        wait_for_a_segment(&mut child, &disk);
        let sealed = sealed_steps(&disk);
        assert!(control.exists(), "the socket is there while it runs");
        kill(&child, signal);
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(status), "{}", stderr(&out));
        assert!(!control.exists(), "SIG{signal} left the control socket");

        let info = run(&["info", disk.to_str().unwrap()]);
        assert_eq!(info.status.code(), Some(0), "{}", stdout(&info));
        let json = info_json(&disk);
        assert_eq!(json["stop_reason"], format!("signal:SIG{signal}"), "{json}");
        assert_eq!(json["clean_end"], true);
        let steps = json["steps"].as_u64().unwrap();
        assert!(
            steps > sealed,
            "SIG{signal}: {steps} steps kept, no more than the {sealed} sealed before it"
        );
        // The step clock makes the run deterministic: what was kept is the
        // full trace's beginning, then the stop.
        let kept = records(&disk);
        let (last, body) = kept.split_last().unwrap();
        assert_eq!(
            last,
            &Record::Event(Event::TraceStop(TraceReason::Signal(number)))
        );
        assert!(body.len() < full.len());
        assert!(body == &full[..body.len()], "SIG{signal}: not a prefix");
    }
}

#[test]
fn a_signal_ends_a_run_whose_guest_idles_in_hlt() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A thousandfold slower timer: the demo idles in HLT for seconds.
    let child = vtrace()
        .args(["run", "--no-input", "--clock", "prescale:1000"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .current_dir(dir.path())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let sent = Instant::now();
    kill(&child, "TERM");
    let out = child.wait_with_output().unwrap();
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "took {:?}",
        sent.elapsed()
    );
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("stopped by SIGTERM"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn stopping_anywhere_never_hands_the_guest_a_debug_trap() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("toggled.vtd");
    let control = dir.path().join("c.sock");
    // A slower timer keeps the guest busy for the whole exercise untraced.
    let mut child = vtrace()
        .args(["run", "--no-input", "--trace", "--disk-size", "64M"])
        .arg("--disk")
        .arg(&disk)
        .arg("--control")
        .arg(&control)
        .args(["--clock", "prescale:20"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while !control.exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let ctl = |command: &str| {
        vtrace()
            .args(["ctl", "--control", control.to_str().unwrap(), command])
            .output()
            .unwrap()
    };
    let mut stops = 0;
    // Stops land on whatever the guest runs: kernel code, its interrupt
    // handlers, HLT, port I/O, hypercalls. Pauses of 1-13 ms vary where.
    for i in 0..30u64 {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if ctl("stop").status.success() {
            stops += 1;
        }
        std::thread::sleep(Duration::from_millis(1 + (i * 7) % 13));
        ctl("start");
        std::thread::sleep(Duration::from_millis(1 + (i * 5) % 11));
    }
    let out = child.wait_with_output().unwrap();
    let console = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{console}\n{}", stderr(&out));
    assert!(!console.contains("PANIC"), "{console}");
    assert!(stops >= 5, "only {stops} stops landed");
    let json = info_json(&disk);
    assert_eq!(json["gaps"], 0, "{json}");
    assert!(
        json["events"]["trace_stop"].as_u64().unwrap() >= stops,
        "{json}"
    );
}
