//! Nothing lost, nothing hangs, nothing trusted: the real binary under
//! signals, floods from a guest, and damaged or crafted input.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;
use vtrace_storage::{Event, Record, TraceReader, TraceReason};

/// Steps in the segments already sealed on the disk (0 before the first).
fn sealed_steps(disk: &Path) -> u64 {
    TraceReader::open(disk)
        .map(|r| r.segments().iter().map(|s| s.found.header.steps).sum())
        .unwrap_or(0)
}

/// Starts `vtrace run --no-input ARGS --disk DISK --control CONTROL`, its
/// output piped.
fn spawn_run(disk: &Path, control: &Path, args: &[&str]) -> Child {
    vtrace()
        .args(["run", "--no-input"])
        .args(args)
        .arg("--disk")
        .arg(disk)
        .arg("--control")
        .arg(control)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vtrace")
}

/// Starts tracing the demo OS onto `disk`, its control socket at `control`.
fn spawn_traced_demo(disk: &Path, control: &Path, extra: &[&str]) -> Child {
    let mut args = vec!["-q", "--trace", "--disk-size", "64M"];
    args.extend_from_slice(extra);
    spawn_run(disk, control, &args)
}

/// Waits until the run has made `path`.
fn wait_for(path: &Path) {
    let started = Instant::now();
    while !path.exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "no {path:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Traces the demo OS onto `disk` (`vtrace run --no-input -q --trace
/// EXTRA --disk DISK`); the run must end with status 0.
fn trace_demo_to(disk: &Path, extra: &[&str]) {
    let mut args = vec!["run", "--no-input", "-q", "--trace"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--disk", disk.to_str().unwrap()]);
    let out = run(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
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
    trace_demo_to(&full, &["--disk-size", "64M"]);
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
    // Each stop seals a small segment; 8 MiB holds them all (each once
    // took a whole 1 MiB of the disk, and 8 MiB was full after 7).
    let mut child = spawn_run(
        &disk,
        &control,
        &["--trace", "--disk-size", "8M", "--clock", "prescale:20"],
    );
    wait_for(&control);
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
    assert!(stops >= 10, "only {stops} stops landed");
    let json = info_json(&disk);
    assert_eq!(json["gaps"], 0, "{json}");
    assert_ne!(json["stop_reason"], "disk_full", "{json}");
    assert!(
        json["events"]["trace_stop"].as_u64().unwrap() >= stops,
        "{json}"
    );
}

/// A fresh trace of the demo's first 50,000 steps in several segments.
fn small_trace(dir: &Path, name: &str) -> std::path::PathBuf {
    let disk = dir.join(name);
    trace_demo_to(
        &disk,
        &[
            "--max-steps",
            "50000",
            "--segment-size",
            "64K",
            "--disk-size",
            "8M",
        ],
    );
    disk
}

/// An exit status and what came with it.
type Told<T> = (Option<i32>, T);

/// `vtrace info` in both forms: (status, text), (status, problems).
fn info_both(disk: &Path) -> (Told<String>, Told<Vec<String>>) {
    let text = run(&["info", disk.to_str().unwrap()]);
    let json = run(&["info", "--json", disk.to_str().unwrap()]);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap_or_default();
    let problems = value["problems"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    (
        (text.status.code(), stdout(&text) + &stderr(&text)),
        (json.status.code(), problems),
    )
}

fn patch(disk: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(disk).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

fn byte_at(disk: &Path, offset: u64) -> u8 {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8];
    let f = std::fs::File::open(disk).unwrap();
    f.read_exact_at(&mut b, offset).unwrap();
    b[0]
}

#[test]
fn damage_is_reported_and_fails_info_in_both_forms() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let good = small_trace(dir.path(), "good.vtd");
    let ((status, text), (json_status, problems)) = info_both(&good);
    assert_eq!((status, json_status), (Some(0), Some(0)), "{text}");
    assert!(problems.is_empty());
    let reader = TraceReader::open(&good).unwrap();
    assert!(reader.segments().len() >= 3, "several segments");
    let first = reader.segments()[0].found.offset;
    drop(reader);

    // What each damage must be reported as.
    type Damage = fn(&Path, u64);
    let cases: [(&str, Damage, &str); 5] = [
        (
            "a flipped byte in segment 0's header",
            |d, at| patch(d, at + 20, &[byte_at(d, at + 20) ^ 0x40]),
            "segment 0 is missing",
        ),
        (
            "segment 0 zeroed",
            |d, at| {
                let len = TraceReader::open(d).unwrap().segments()[0]
                    .found
                    .header
                    .total_len();
                patch(d, at, &vec![0u8; len as usize]);
            },
            "segment 0 is missing",
        ),
        (
            "every segment zeroed",
            |d, at| {
                let len = std::fs::metadata(d).unwrap().len() - at;
                patch(d, at, &vec![0u8; len as usize]);
            },
            "segments written are not on the disk",
        ),
        (
            "a flipped superblock byte",
            |d, _| patch(d, 70, &[byte_at(d, 70) ^ 1]),
            "superblock is damaged",
        ),
        (
            "a header claiming a huge sequence number",
            |d, at| {
                // A valid header (CRC fixed up) with seq 2^59: the reader
                // must neither allocate for the gap nor call it fine.
                let mut h = std::fs::read(d).unwrap()[at as usize..at as usize + 64].to_vec();
                h[8..16].copy_from_slice(&(1u64 << 59).to_le_bytes());
                let crc = crc32c(&h[..60]);
                h[60..64].copy_from_slice(&crc.to_le_bytes());
                patch(d, at, &h);
            },
            "segment 0 is missing",
        ),
    ];
    for (what, damage, expected) in cases {
        let disk = dir.path().join("damaged.vtd");
        std::fs::copy(&good, &disk).unwrap();
        damage(&disk, first);
        let ((status, text), (json_status, problems)) = info_both(&disk);
        assert_eq!(status, Some(1), "{what}: {text}");
        assert_eq!(json_status, Some(1), "{what}: --json fails too");
        assert!(
            problems.iter().any(|p| p.contains(expected)),
            "{what}: {problems:?}"
        );
    }
}

/// CRC32C, as the segment headers use it (Castagnoli, reflected).
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn a_run_killed_before_its_first_segment_is_not_a_clean_empty_trace() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("early.vtd");
    let control = dir.path().join("c.sock");
    // Tracing waits for a trigger that never comes; killed meanwhile.
    let mut child = spawn_run(
        &disk,
        &control,
        &["-q", "--clock", "prescale:1000", "--disk-size", "8M"],
    );
    // The disk is made after the socket; the guest runs after both.
    wait_for(&control);
    while std::fs::metadata(&disk).map_or(0, |m| m.len()) == 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    let ((status, text), (json_status, problems)) = info_both(&disk);
    assert_eq!((status, json_status), (Some(1), Some(1)), "{text}");
    assert!(
        problems
            .iter()
            .any(|p| p.contains("did not shut down cleanly")),
        "{problems:?}"
    );
}

#[test]
fn a_damaged_trace_read_into_a_pipe_that_closes_ends_with_its_status_not_a_panic() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("killed.vtd");
    let control = dir.path().join("c.sock");
    // Tracing from the first instruction, killed once a segment of its
    // steps is on the disk (the whole demo takes some 10 s of stepping).
    let mut child = spawn_run(&disk, &control, &["--trace", "--disk-size", "64M"]);
    wait_for(&control);
    let started = std::time::Instant::now();
    while info_json(&disk)["steps"].as_u64().unwrap_or(0) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no steps on the disk"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Warnings and listing into one pipe that its reader closes after a
    // line: the warnings after that go nowhere, and the status is the
    // damaged trace's (1), not a panic's (101).
    let script = format!(
        "{} analyze listing {} 2>&1 | head -1 >/dev/null; exit ${{PIPESTATUS[0]}}",
        env!("CARGO_BIN_EXE_vtrace"),
        disk.display()
    );
    let status = std::process::Command::new("bash")
        .args(["-c", &script])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1));
}

#[test]
fn a_finished_trace_takes_its_size_and_small_segments_do_not_fill_the_disk() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("demo.vtd");
    // The default 1 GiB is reserved while tracing.
    trace_demo_to(&disk, &[]);
    let json = info_json(&disk);
    let used = json["disk_used"].as_u64().unwrap();
    let meta = std::fs::metadata(&disk).unwrap();
    use std::os::unix::fs::MetadataExt;
    let on_disk = meta.blocks() * 512;
    // Superblock plus each segment rounded up to 4 KiB.
    let segments = json["segments"].as_u64().unwrap();
    assert!(
        on_disk <= used + 4096 * (segments + 1),
        "{on_disk} bytes on the host disk for {used} bytes of trace"
    );
}

/// A trace of a few steps whose metadata names `kernel` as the traced
/// kernel, as a crafted or moved trace may.
fn trace_naming_kernel(dir: &Path, kernel: &str) -> std::path::PathBuf {
    trace_with_metadata(
        dir,
        &format!("guest: crafted\nkernel: {kernel}\nkernel-id: 0\n"),
    )
}

/// A trace of a few steps with `metadata`, as a crafted file may have.
fn trace_with_metadata(dir: &Path, metadata: &str) -> std::path::PathBuf {
    use vtrace_storage::DiskWriter;
    use vtrace_storage::{CpuMode, InsnBytes, Recorder, Regs, Step};
    let path = dir.join("crafted.vtd");
    let disk = DiskWriter::create(&path, 1 << 20, 64 << 10, false, metadata).unwrap();
    let mut recorder = Recorder::start(disk);
    recorder.event(&Event::TraceStart(TraceReason::CommandLine));
    for i in 0..10 {
        recorder.step(&Step {
            pc: 0x1000 + i,
            bytes: InsnBytes::new(&[0x90]).unwrap(),
            cr3: 0x1000,
            mode: CpuMode::Long64,
            cpl: 0,
            regs: Regs::default(),
        });
    }
    recorder.event(&Event::TraceStop(TraceReason::GuestExit));
    recorder.finish().unwrap();
    path
}

/// `vtrace ARGS`'s output; a panic saying `hangs` (the process killed)
/// where it runs past a minute.
fn within_a_minute(args: &[&str], hangs: &str) -> std::process::Output {
    let child = vtrace()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    // Read on a thread of its own: a pipe no one reads would stop it.
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid])
                .status();
            panic!("{hangs}");
        }
    }
}

/// A crafted trace whose metadata claims four billion CPUs: the
/// analyses that take a pass per CPU (timeline, export) took four billion
/// passes (and the export a list of them, 32 GiB). The trace says what is
/// wrong and each analysis ends, at most a pass per CPU a trace can hold.
#[test]
fn a_trace_claiming_more_cpus_than_a_trace_holds_is_told_and_read_in_bounded_time() {
    let dir = tempfile::tempdir().unwrap();
    let trace = trace_with_metadata(dir.path(), "guest: crafted\ncpus: 4294967295\n");
    let t = trace.to_str().unwrap();
    let out = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (json, parquet) = (out("t.json"), out("s.parquet"));
    let analyses: [&[&str]; 4] = [
        &["info", t],
        &["analyze", "timeline", "--allow-damage", "-o", &json, t],
        &[
            "analyze",
            "export",
            "--allow-damage",
            "-q",
            "-o",
            &parquet,
            t,
        ],
        &["analyze", "stats", "--allow-damage", "--cpu", "all", t],
    ];
    for args in analyses {
        let o = within_a_minute(args, &format!("{args:?} runs on and on"));
        // info tells its problems with the rest of its report.
        let err = String::from_utf8_lossy(&o.stderr) + String::from_utf8_lossy(&o.stdout);
        assert!(
            err.contains("4294967295 CPUs"),
            "{args:?} does not say what is wrong: {err}"
        );
        // info fails on a damaged trace; the analyses, told to take it,
        // finish.
        let want = if args[0] == "info" { 1 } else { 0 };
        assert_eq!(o.status.code(), Some(want), "{args:?}: {err}");
    }
}

#[test]
fn a_trace_naming_a_device_or_fifo_as_its_kernel_is_not_read_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    for kernel in ["/dev/zero", fifo.to_str().unwrap()] {
        let trace = trace_naming_kernel(dir.path(), kernel);
        let out = within_a_minute(
            &["analyze", "nest", trace.to_str().unwrap()],
            &format!("analyze hangs on a trace naming {kernel}"),
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("is not a regular file"),
            "{kernel}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn a_directory_is_refused_as_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    for args in [vec!["info", path], vec!["analyze", "stats", path]] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(65), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("is a directory"), "{}", stderr(&out));
    }
}

#[test]
fn a_flooding_guest_cannot_flood_the_terminal_forge_lines_or_grow_the_vmm() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = write_guest(dir.path(), "flood.bin", vtrace_demo::test_guests::FLOOD);
    let out = run(&["run", "--no-input", "--real-mode", image.to_str().unwrap()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    // 40,000 guest lines asked for, about 4 MB raw.
    assert!(
        out.stderr.len() < 200_000,
        "{} bytes of output",
        out.stderr.len()
    );
    assert!(
        !out.stderr.contains(&0x1b),
        "a raw escape reached the terminal"
    );
    assert!(!out.stderr.contains(&0), "a raw NUL reached the terminal");
    let forged = err
        .lines()
        .filter(|l| l.starts_with("vtrace: guest exited"))
        .count();
    assert_eq!(forged, 1, "only vtrace's own line: {err}");
    assert!(err.contains("vtrace: guest: \\u{1b}[2J"), "shown escaped");
    assert!(err.contains("guest lines not shown"), "the drop is told");
    let rss_mib = number_before(&err, " MiB").expect("the summary gives the peak RSS");
    assert!(rss_mib < 64, "peak RSS {rss_mib} MiB");
}

#[test]
fn a_listing_of_a_wrapped_trace_starts_where_the_trace_does() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("wrap.vtd");
    trace_demo_to(
        &disk,
        &["--wrap", "--disk-size", "1M", "--segment-size", "64K"],
    );
    let first = TraceReader::open(&disk)
        .unwrap()
        .segments()
        .iter()
        .find(|s| s.state == vtrace_storage::SegmentState::Good)
        .map(|s| s.found.header.first_step)
        .unwrap();
    assert!(first > 0, "the beginning was overwritten");
    let out = run(&[
        "analyze",
        "listing",
        "--no-lines",
        "--count",
        "3",
        disk.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let steps: Vec<u64> = stdout(&out)
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(steps, vec![first, first + 1, first + 2], "{}", stdout(&out));
}

/// The idle guest (it waits for console input, which stays open: a pipe
/// nobody writes, so nothing else can wake it) run with `args`, a trace
/// disk and a control socket in `dir`, once its socket answers.
fn run_idle(dir: &Path, args: &[&str]) -> (Child, PathBuf, PathBuf) {
    let image = write_guest(dir, "idle.bin", vtrace_demo::test_guests::IDLE);
    let disk = dir.join("idle.vtd");
    let control = dir.join("c.sock");
    let child = vtrace()
        .args(["run", "--disk-size", "8M"])
        .args(args)
        .arg("--real-mode")
        .arg(&image)
        .arg("--disk")
        .arg(&disk)
        .arg("--control")
        .arg(&control)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&control);
    std::thread::sleep(Duration::from_millis(300));
    (child, disk, control)
}

/// Ends a [`run_idle`] run with Ctrl-C: its exit status is 130.
fn interrupt_idle(mut child: Child) {
    kill(&child, "INT");
    let stdin = child.stdin.take();
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
}

#[test]
fn ctl_is_answered_while_the_guest_idles_with_no_timer() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (child, _, control) = run_idle(dir.path(), &[]);
    for _ in 0..3 {
        let asked = Instant::now();
        let out = run(&["ctl", "--control", control.to_str().unwrap(), "status"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(stdout(&out).starts_with("tracing off"), "{}", stdout(&out));
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "answered after {:?}",
            asked.elapsed()
        );
    }
    interrupt_idle(child);
}

/// Once the trace holds --max-steps, a request to trace again says so
/// and opens nothing (it once opened a window of no steps).
#[test]
fn ctl_start_after_max_steps_says_why_and_opens_no_window() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (child, disk, control) = run_idle(dir.path(), &["--trace", "--max-steps", "1"]);
    let out = run(&["ctl", "--control", control.to_str().unwrap(), "start"]);
    assert_eq!(
        stdout(&out).trim(),
        "tracing not started: --max-steps 1 reached",
        "{}",
        stderr(&out)
    );
    interrupt_idle(child);
    let info = info_json(&disk);
    assert_eq!(info["steps"], 1, "{info}");
    assert_eq!(info["start_reasons"], serde_json::json!(["command_line"]));
    assert_eq!(info["stop_reason"], "max_steps", "{info}");
}

#[test]
fn files_that_are_not_traces_or_sockets_are_never_overwritten() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "precious").unwrap();
    // As the trace disk: refused, then replaced only with --force.
    let out = run(&[
        "run",
        "--no-input",
        "-q",
        "--trace",
        "--max-steps",
        "1000",
        "--disk-size",
        "8M",
        "--disk",
        notes.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(73), "{}", stderr(&out));
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "precious");
    // As the control socket: refused.
    let disk = dir.path().join("t.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "-q",
        "--trace",
        "--max-steps",
        "1000",
        "--disk-size",
        "8M",
        "--disk",
        disk.to_str().unwrap(),
        "--control",
        notes.to_str().unwrap(),
    ]);
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("not a socket"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "precious");
    // --force means it.
    let out = run(&[
        "run",
        "--no-input",
        "-q",
        "--trace",
        "--max-steps",
        "1000",
        "--force",
        "--disk-size",
        "8M",
        "--disk",
        notes.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(info_json(&notes)["steps"], 1000);
}

#[test]
fn ctl_finds_the_live_run_past_stale_sockets_and_says_what_a_mark_records() {
    if !kvm_available() {
        return;
    }
    let runtime = tempfile::tempdir().unwrap();
    // A socket left by a killed run: bound, then nobody listens.
    let stale = runtime.path().join("vtrace-1.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let disk = runtime.path().join("t.vtd");
    let child = vtrace()
        .env("XDG_RUNTIME_DIR", runtime.path())
        .args(["run", "--no-input", "--clock", "prescale:1000"])
        .args(["--disk-size", "8M", "--disk"])
        .arg(&disk)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ctl = |args: &[&str]| {
        let out = vtrace()
            .env("XDG_RUNTIME_DIR", runtime.path())
            .arg("ctl")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (out.status.code(), stdout(&out).trim().to_string())
    };
    let started = Instant::now();
    while ctl(&["status"]).0 != Some(0) {
        assert!(started.elapsed() < Duration::from_secs(30), "no run found");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(ctl(&["start"]), (Some(0), "tracing started".into()));
    assert_eq!(
        ctl(&["mark", "7"]),
        (Some(0), "mark 7 recorded (value 1)".into())
    );
    assert_eq!(ctl(&["mark"]), (Some(0), "host mark 2 recorded".into()));
    assert_eq!(ctl(&["mark", "seven"]).0, Some(2), "a usage error");

    // A client that connects and says nothing is let go; others are served.
    let sock = std::fs::read_dir(runtime.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p != &stale && p.extension().is_some_and(|x| x == "sock"))
        .unwrap();
    // The run names its commands; one it does not know is an error that
    // says where to look (the VMM hands the monitor's words on unread).
    let raw = |request: &str| vtrace_vmm::control_socket::send(&sock, request).unwrap();
    assert_eq!(
        raw("help"),
        "commands: start, stop, mark [ID], probe enable PATTERN, probe disable PATTERN, \
         status, help"
    );
    let unknown = raw("frobnicate 3");
    assert!(
        unknown.starts_with("error: unknown command 'frobnicate 3'") && unknown.contains("help"),
        "{unknown}"
    );
    assert!(raw("probe enable").starts_with("error: probe enable takes one pattern"));
    let mut idle = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    assert_eq!(ctl(&["status"]).0, Some(0), "served beside an idle client");
    idle.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut answer = String::new();
    use std::io::Read;
    idle.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("error: no request"), "{answer}");

    kill(&child, "TERM");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    let recs = records(&disk);
    assert!(recs.contains(&Record::Event(Event::Mark { id: 7, value: 1 })));
    assert!(recs.contains(&Record::Event(Event::Mark {
        id: vtrace_storage::HOST_MARK,
        value: 2
    })));
}

#[test]
fn a_header_claiming_steps_near_the_top_of_u64_is_reported_not_wrapped() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = small_trace(dir.path(), "big.vtd");
    let reader = TraceReader::open(&disk).unwrap();
    let second = reader.segments()[1].found.offset;
    drop(reader);
    // Segment 1 claims to start at step 2^64 - 10 (its CRC fixed up).
    let mut h = std::fs::read(&disk).unwrap()[second as usize..second as usize + 64].to_vec();
    h[16..24].copy_from_slice(&(u64::MAX - 10).to_le_bytes());
    let crc = crc32c(&h[..60]);
    h[60..64].copy_from_slice(&crc.to_le_bytes());
    patch(&disk, second, &h);
    let ((status, text), (_, problems)) = info_both(&disk);
    assert_eq!(status, Some(1), "{text}");
    assert!(
        problems.iter().any(|p| p.contains("not contiguous")),
        "{problems:?}"
    );
    for what in ["nest", "stats", "listing"] {
        let out = run(&[
            "analyze",
            what,
            "--no-kernel-symbols",
            disk.to_str().unwrap(),
        ]);
        assert!(
            out.status.code().is_some_and(|c| c <= 1),
            "{what}: {:?} {}",
            out.status,
            stderr(&out)
        );
    }
}

#[test]
fn ctl_never_talks_to_another_users_socket() {
    let runtime = tempfile::tempdir().unwrap();
    let fake = runtime.path().join("vtrace-4242.sock");
    // Where a run would listen, a socket that another user owns (made here
    // and given to "nobody", which needs root, as tests/run_errors.rs
    // does), answering like a run.
    let listener = std::os::unix::net::UnixListener::bind(&fake).unwrap();
    std::os::unix::fs::chown(&fake, Some(65534), Some(65534)).expect("chown as root");
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut client in listener.incoming().flatten() {
            let mut buf = [0u8; 256];
            let _ = client.read(&mut buf);
            let _ = client.write_all(b"tracing stopped after 0 steps\n");
        }
    });
    let out = vtrace()
        .env("XDG_RUNTIME_DIR", runtime.path())
        .args(["ctl", "stop"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(
        !stdout(&out).contains("tracing stopped"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("no vtrace run of yours"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_guest_that_dies_while_traced_is_not_said_to_run_on() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = write_guest(dir.path(), "tf.elf", vtrace_demo::test_guests::TRIPLE_FAULT);
    let disk = dir.path().join("tf.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--trace",
        "--autostop",
        "none",
        "--kernel",
        image.to_str().unwrap(),
        "--disk-size",
        "8M",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(80), "{err}");
    assert!(err.contains("the run ends"), "{err}");
    assert!(!err.contains("runs on"), "{err}");
    let json = info_json(&disk);
    assert_eq!(json["clean_end"], true, "{json}");
    assert!(
        json["stop_reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("other:the guest shut down")),
        "{json}"
    );
}

#[test]
fn a_guest_halted_for_good_is_told_as_such_not_blamed_on_kvm() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // cli; hlt
    let image = write_guest(dir.path(), "stuck.bin", &[0xfa, 0xf4]);
    let out = run(&["run", "--no-input", "--real-mode", image.to_str().unwrap()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(82), "{err}");
    assert!(err.contains("halted with interrupts disabled"), "{err}");
    assert!(!err.contains("KVM stopped the guest"), "{err}");
}

/// The step clock gives one timer tick per PIT period, idle HLTs included
/// (they jump to the next tick, never over one). QEMU's TCG with
/// `-icount shift=0,sleep=off` spaces the demo's ticks the same way
/// (244, 413, 244, 413, 244 instructions apart).
#[test]
fn the_step_clock_gives_one_tick_per_timer_period() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("ticks.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--trace",
        "--disk-size",
        "64M",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{log}");
    let ticks = number_before(run_summary(&log), "timer interrupts").expect("IRQ0 count");
    let seconds = virtual_seconds(run_summary(&log)).expect("virtual time");
    // PIT channel 0 at divisor 4773: a period of 4773 / 1193182 s.
    let periods = seconds * 1_193_182.0 / 4773.0;
    assert!(ticks >= 2, "{log}");
    assert!(
        (ticks as f64 - periods).abs() <= 1.0,
        "{ticks} ticks in {periods:.2} periods: {log}"
    );
    let interrupts = records(&disk)
        .iter()
        .filter(|r| matches!(r, Record::Event(Event::Interrupt { vector: 32, .. })))
        .count() as u64;
    assert_eq!(interrupts, ticks, "every tick is in the trace once");
}

/// One writer per trace disk. A second run on a disk that another run is
/// writing is refused at once (exit 75), naming that run; `info` says the
/// trace is still being written (not that its run was killed); the first
/// run's trace ends whole. Before, both ran on the one disk and neither
/// trace survived.
#[test]
fn a_second_run_on_a_disk_being_written_is_refused() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = write_guest(dir.path(), "idle.bin", vtrace_demo::test_guests::IDLE);
    let disk = dir.path().join("shared.vtd");
    let control = dir.path().join("c.sock");
    // Traced, the guest idles until it is stopped from outside.
    let mut first = vtrace()
        .args(["run", "--trace", "--disk-size", "8M", "--real-mode"])
        .arg(&image)
        .arg("--disk")
        .arg(&disk)
        .arg("--control")
        .arg(&control)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&control);
    let second = run(&[
        "run",
        "--no-input",
        "-q",
        "--trace",
        "--max-steps",
        "1000",
        "--disk-size",
        "8M",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    assert_eq!(second.status.code(), Some(75), "{}", stderr(&second));
    let said = stderr(&second);
    assert!(
        said.contains(&format!("being written by another run (pid {}", first.id())),
        "{said}"
    );
    let o = run(&["info", "--json", disk.to_str().unwrap()]);
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let problems = info["problems"].to_string();
    assert!(problems.contains("still being written"), "{info}");
    assert!(!problems.contains("killed"), "{info}");

    kill(&first, "INT");
    let stdin = first.stdin.take();
    let out = first.wait_with_output().unwrap();
    drop(stdin);
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    let info = info_json(&disk);
    assert_eq!(info["problems"], serde_json::json!([]), "{info}");
    assert_eq!(info["clean_end"], true, "{info}");
}

/// A trace disk that cannot be made leaves what was at its path as it
/// was, and nothing beside it: a size past the file system's free space
/// is refused before anything is written (before, the old trace was gone
/// and a file of the asked size filled the file system), and a symbolic
/// link that points nowhere is not followed into a new file.
#[test]
fn a_disk_that_cannot_be_made_leaves_the_old_trace_and_nothing_else() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("old.vtd");
    trace_demo_to(&disk, &["--max-steps", "1000", "--disk-size", "8M"]);
    let before = info_json(&disk);
    let out = run(&[
        "run",
        "--no-input",
        "-q",
        "--trace",
        "--disk-size",
        "16000T",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(73), "{}", stderr(&out));
    assert!(stderr(&out).contains("no room"), "{}", stderr(&out));
    assert_eq!(info_json(&disk)["digest"], before["digest"]);
    let names = |dir: &Path| -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(dir.path()), ["old.vtd"]);

    let link = dir.path().join("link.vtd");
    std::os::unix::fs::symlink(dir.path().join("target.vtd"), &link).unwrap();
    let out = run(&[
        "run",
        "--no-input",
        "-q",
        "--trace",
        "--max-steps",
        "1000",
        "--disk-size",
        "8M",
        "--disk",
        link.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(66), "{}", stderr(&out));
    assert_eq!(names(dir.path()), ["link.vtd", "old.vtd"]);
}

/// A trace stretched by a hole to terabytes is read as fast as the trace
/// itself, with its superblock intact (the scan ends where its blocks do)
/// or damaged (the scan jumps over holes). Before, `info` read the hole
/// 4 KiB at a time: 49 s for a terabyte, and a file of exabytes never
/// ended. The bound here only tells a hang from an answer.
#[test]
fn a_trace_stretched_to_terabytes_is_read_at_once() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = small_trace(dir.path(), "t.vtd");
    let digest = info_json(&disk)["digest"].clone();
    let file = std::fs::OpenOptions::new().write(true).open(&disk).unwrap();
    // 15 TiB where the file system allows it (ext4's limit is 16): read
    // 4 KiB at a time, that would take the old scan some twelve minutes.
    file.set_len(15 << 40)
        .or_else(|_| file.set_len(1 << 40))
        .unwrap();
    for damaged in [false, true] {
        if damaged {
            // The superblock's metadata: its checksum no longer holds.
            let at = 64;
            patch(&disk, at, &[byte_at(&disk, at) ^ 0xff]);
        }
        let mut child = vtrace()
            .args(["info", "--json"])
            .arg(&disk)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                panic!(
                    "info did not answer on a file of terabytes (damaged superblock: {damaged})"
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(info["digest"], digest, "{info}");
        let problems = info["problems"].to_string();
        assert_eq!(problems.contains("superblock"), damaged, "{info}");
    }
}

/// Every analysis says the damage it passes over, on stderr, and exits 1
/// unless `--allow-damage` takes the trace as it is (then 0, still said):
/// a segment whose checksums hold but whose records do not decode, which
/// only reading finds (before: stats, nest, listing, export and report
/// exited 0 in silence with the segment's steps missing), and a trace
/// whose run was killed.
#[test]
fn analyses_say_the_damage_they_pass_over_and_fail_without_allow_damage() {
    use std::os::unix::fs::FileExt;
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let good = small_trace(dir.path(), "good.vtd");
    let undecodable = dir.path().join("undecodable.vtd");
    std::fs::copy(&good, &undecodable).unwrap();
    let second = TraceReader::open(&undecodable).unwrap().segments()[1].found;
    let h = second.header;
    // Records of an unknown tag, sealed with checksums that hold.
    let sealed = vtrace_storage::seal(&[0xff; 64], h.seq, h.first_step, h.steps, h.events);
    assert!(sealed.len() as u64 <= h.total_len());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&undecodable)
        .unwrap();
    file.write_all_at(&sealed, second.offset).unwrap();

    let killed = dir.path().join("killed.vtd");
    let control = dir.path().join("c.sock");
    let mut child = spawn_traced_demo(&killed, &control, &["--segment-size", "64K"]);
    wait_for_a_segment(&mut child, &killed);
    kill(&child, "KILL");
    let _ = child.wait();

    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    for (disk, says) in [
        (&undecodable, "could not be read whole"),
        (&killed, "did not end cleanly"),
    ] {
        let disk = disk.to_str().unwrap();
        let export = out_dir.join("x.parquet");
        let report = out_dir.join("r.html");
        let analyses: [&[&str]; 5] = [
            &["stats"],
            &["nest"],
            &["listing"],
            &["export", "-o", export.to_str().unwrap()],
            &["report", "-o", report.to_str().unwrap()],
        ];
        for analysis in analyses {
            for allow in [false, true] {
                let mut args = vec!["analyze"];
                args.extend_from_slice(analysis);
                args.extend(["--no-kernel-symbols", "-q", disk]);
                if allow {
                    args.push("--allow-damage");
                }
                let out = run(&args);
                let err = stderr(&out);
                assert_eq!(
                    out.status.code(),
                    Some(if allow { 0 } else { 1 }),
                    "{args:?}: {err}"
                );
                assert!(err.contains(says), "{args:?}: {err}");
            }
        }
        // `info` lists the problems and fails the same way.
        for allow in [false, true] {
            let mut args = vec!["info", disk];
            if allow {
                args.push("--allow-damage");
            }
            let out = run(&args);
            assert_eq!(
                out.status.code(),
                Some(if allow { 0 } else { 1 }),
                "{args:?}: {}",
                stderr(&out)
            );
            assert!(stdout(&out).contains("problem:"), "{args:?}");
        }
        // The JSON of an analysis carries them, naming the trace.
        let out = run(&["analyze", "stats", "--json", "-q", "--allow-damage", disk]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let problems = json["problems"].as_array().unwrap();
        assert!(
            problems
                .iter()
                .any(|p| p["trace"] == disk && p["problem"].as_str().unwrap().contains(says)),
            "{problems:?}"
        );
        assert!(json["steps"].as_u64().unwrap() > 0);
    }
    // An undamaged trace, and one whose run was killed after tracing
    // stopped (the guest running on untraced: its disk never closed, its
    // last record the stop), which lost nothing: nothing said, status 0,
    // no problems in the JSON.
    let stopped_then_killed = dir.path().join("stopped-then-killed.vtd");
    std::fs::copy(&good, &stopped_then_killed).unwrap();
    unclose(&stopped_then_killed);
    assert!(
        !TraceReader::open(&stopped_then_killed)
            .unwrap()
            .superblock()
            .unwrap()
            .closed
    );
    for disk in [&good, &stopped_then_killed] {
        let disk = disk.to_str().unwrap();
        for args in [
            vec!["analyze", "stats", "-q", "--no-kernel-symbols", disk],
            vec!["info", disk],
        ] {
            let out = run(&args);
            assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
            assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
            assert!(!stdout(&out).contains("problem"), "{}", stdout(&out));
        }
        let out = run(&["analyze", "stats", "--json", "-q", disk]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["problems"], serde_json::json!([]), "{disk}");
        let out = run(&["info", "--json", disk]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["problems"], serde_json::json!([]), "{disk}");
        assert_eq!(json["clean_end"], true, "{disk}");
    }
}

/// Makes a closed trace's superblock say what a run killed after its last
/// write leaves: not closed (checksum made good again).
fn unclose(disk: &Path) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(disk)
        .unwrap();
    let mut sb = vec![0u8; 4096];
    file.read_exact_at(&mut sb, 0).unwrap();
    // Flags at 24..28, closed = 2; CRC32C of 0..4092 at 4092.
    sb[24] &= !2;
    let crc = crc32c::crc32c(&sb[..4092]);
    sb[4092..].copy_from_slice(&crc.to_le_bytes());
    file.write_all_at(&sb, 0).unwrap();
}

/// Corruption fuzzing of the readers: a byte flipped anywhere in a trace
/// either changes nothing an analysis shows (padding between segments) or
/// makes `info` and `analyze stats` exit non-zero; neither exits 0 with
/// an output other than the intact trace's.
#[test]
fn no_reader_exits_0_in_silence_on_a_flipped_byte() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let good = small_trace(dir.path(), "good.vtd");
    let len = std::fs::metadata(&good).unwrap().len();
    let read = |disk: &Path| {
        let disk = disk.to_str().unwrap();
        let info = run(&["info", "--json", disk]);
        let stats = run(&[
            "analyze",
            "stats",
            "--json",
            "-q",
            "--no-kernel-symbols",
            disk,
        ]);
        (
            (info.status.code(), stdout(&info)),
            (stats.status.code(), stdout(&stats)),
        )
    };
    let (info_good, stats_good) = read(&good);
    assert_eq!(info_good.0, Some(0));
    assert_eq!(stats_good.0, Some(0));
    let disk = dir.path().join("flipped.vtd");
    // A fixed walk over the file, the superblock and segment headers
    // included (64 variants).
    let mut at: u64 = 7;
    for _ in 0..64 {
        at = at
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407)
            % len;
        std::fs::copy(&good, &disk).unwrap();
        patch(&disk, at, &[byte_at(&disk, at) ^ 0x10]);
        let (info, stats) = read(&disk);
        for ((status, output), (_, intact), what) in [
            (&info, &info_good, "info"),
            (&stats, &stats_good, "analyze stats"),
        ] {
            assert!(
                *status != Some(0) || output == intact,
                "{what} exited 0 with another output after a flip at byte {at}"
            );
        }
    }
}

/// Nothing a trace holds reaches the terminal raw: a --real-mode image
/// whose name holds an escape sequence goes into the trace's metadata, and
/// `vtrace run`'s messages, `vtrace info` and `vtrace analyze`'s warnings
/// show it escaped (before, `info` printed it as it was).
#[test]
fn names_in_a_trace_cannot_steer_the_terminal() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = write_guest(
        dir.path(),
        "evil\x1b[2J\x07.bin",
        vtrace_demo::test_guests::COUNT,
    );
    let disk = dir.path().join("evil.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--trace",
        "--disk-size",
        "8M",
        "--real-mode",
        image.to_str().unwrap(),
        "--disk",
        disk.to_str().unwrap(),
    ]);
    assert!(!stderr(&out).contains('\x1b'), "{:?}", stderr(&out));
    assert!(stderr(&out).contains("evil\\u{1b}[2J"), "{}", stderr(&out));
    let info = run(&["info", disk.to_str().unwrap()]);
    let text = stdout(&info) + &stderr(&info);
    assert!(text.contains("evil\\u{1b}[2J\\u{7}"), "{text:?}");
    assert!(!text.contains('\x1b') && !text.contains('\x07'), "{text:?}");
    // Damaged, its warnings quote the path: escaped too.
    let named = dir.path().join("trace\x1b]0;title\x07.vtd");
    std::fs::copy(&disk, &named).unwrap();
    patch(&named, 70, &[byte_at(&named, 70) ^ 1]);
    let analysis = run(&["analyze", "stats", "-q", named.to_str().unwrap()]);
    let err = stderr(&analysis);
    assert!(err.contains("warning"), "{err:?}");
    assert!(!err.contains('\x1b') && !err.contains('\x07'), "{err:?}");
}

/// Without $XDG_RUNTIME_DIR, a run's socket goes in a directory of the
/// user's own in the temporary directory (`vtrace-UID`, mode 0700), where
/// no other user can listen first on the name the run will take (before,
/// /tmp/vtrace-PID.sock: another user listening there stopped the run,
/// exit 70); `vtrace ctl` finds it there. A directory of that name that
/// another user made is refused (exit 73), never used. Finding the run
/// (a connection that says nothing) is no request to it.
#[test]
fn the_default_socket_lives_in_a_directory_of_the_users_own() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !kvm_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let own = tmp.path().join(format!("vtrace-{uid}"));
    let image = write_guest(tmp.path(), "idle.bin", vtrace_demo::test_guests::IDLE);
    let mut child = vtrace()
        .env_remove("XDG_RUNTIME_DIR")
        .env("TMPDIR", tmp.path())
        .args(["run", "--trace", "--disk-size", "8M", "--real-mode"])
        .arg(&image)
        .arg("--disk")
        .arg(tmp.path().join("t.vtd"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let socket = own.join(format!("vtrace-{}.sock", child.id()));
    wait_for(&socket);
    let meta = std::fs::metadata(&own).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    assert_eq!(meta.uid(), uid);
    let status = vtrace()
        .env_remove("XDG_RUNTIME_DIR")
        .env("TMPDIR", tmp.path())
        .args(["ctl", "status"])
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    kill(&child, "INT");
    let stdin = child.stdin.take();
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    // `ctl` found the run by connecting to its socket first: no request,
    // nothing said on the run's console.
    assert!(
        !stderr(&out).contains("unknown command"),
        "{}",
        stderr(&out)
    );

    // Another user made the directory first.
    let planted = tempfile::tempdir().unwrap();
    let theirs = planted.path().join(format!("vtrace-{uid}"));
    std::fs::create_dir(&theirs).unwrap();
    if std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).is_err() {
        return; // not root: no other user to be
    }
    let out = vtrace()
        .env_remove("XDG_RUNTIME_DIR")
        .env("TMPDIR", planted.path())
        .args(["run", "--no-input", "-q", "--trace", "--max-steps", "100"])
        .arg("--disk")
        .arg(planted.path().join("t.vtd"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(73), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a directory of this user's"),
        "{}",
        stderr(&out)
    );
}
