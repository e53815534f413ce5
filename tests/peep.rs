//! Peeping (`vtrace run --peep`): a host thread samples guest variables
//! while the guest runs on, on this host's KVM, the demo OS and Linux.

mod common;

use std::path::Path;
use std::process::Stdio;

use common::*;
use vtrace_storage::{Event, Record};

/// The demo OS's timer period: its PIT divisor (guest-kit/demo/os/kernel.h)
/// over the PIT's 1,193,182 Hz input clock.
const DEMO_TICK_NS: f64 = 4773.0 / 1_193_182.0 * 1e9;

/// `vtrace analyze samples --json` of a trace.
fn samples_json(disk: &Path) -> serde_json::Value {
    let out = run(&["analyze", "samples", "--json", disk.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)))
}

/// (virtual ns, host ns, value of `name`) of every sample.
fn series(json: &serde_json::Value, name: &str) -> Vec<(u64, u64, u64)> {
    json["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .map(|s| {
            (
                s["virtual_ns"].as_u64().unwrap(),
                s["host_ns"].as_u64().unwrap(),
                s["values"][name].as_u64().unwrap(),
            )
        })
        .collect()
}

/// What must hold of a demo run's tick series: it never goes back, nor
/// do its times; no sample has more ticks than the virtual time it
/// carries allows; and it ends at the tick count the demo printed.
fn check_demo_ticks(ticks: &[(u64, u64, u64)], printed: u64) {
    assert!(ticks.len() > 10, "{} samples", ticks.len());
    for w in ticks.windows(2) {
        assert!(w[0].2 <= w[1].2, "ticks went back: {w:?}");
        assert!(w[0].0 <= w[1].0, "virtual time went back: {w:?}");
        assert!(w[0].1 <= w[1].1, "host time went back: {w:?}");
    }
    for &(virtual_ns, _, n) in ticks {
        let most = (virtual_ns as f64 / DEMO_TICK_NS).floor() as u64 + 1;
        assert!(n <= most, "{n} ticks at {virtual_ns} ns of virtual time");
    }
    assert_eq!(ticks.last().unwrap().2, printed, "the last sample");
}

#[test]
fn peeping_the_demo_os_follows_its_tick_counter_without_stepping_it() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("peep.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--ignore-guest-tracing",
        "--peep",
        "100us",
        "--sample",
        "ticks",
        "--sample",
        "context_switches:u32",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    let (console, log) = (stdout(&out), stderr(&out));
    assert!(out.status.success(), "{log}");
    let printed = number_after(&console, "timer ticks:").expect("the demo prints its ticks");
    let switches = number_after(&console, "context switches:").unwrap();

    // No step was traced: the samples came while the guest ran on.
    let info = info_json(&disk);
    assert_eq!(info["steps"], 0, "{info}");
    let json = samples_json(&disk);
    let ticks = series(&json, "ticks");
    assert_eq!(info["events"]["sample"], ticks.len() as u64, "{info}");
    check_demo_ticks(&ticks, printed);
    // Sampled every 100 us, each of the run's ticks (4 ms apart) is seen
    // unless the peeper did not run for milliseconds on end.
    let mut seen: Vec<u64> = ticks.iter().map(|t| t.2).collect();
    seen.dedup();
    assert!(
        seen.len() as u64 > printed / 2,
        "{} of {printed} tick values seen",
        seen.len()
    );
    // The last sample is taken as the guest stops, at its final virtual time.
    let end = virtual_seconds(run_summary(&log)).expect("summary") * 1e9;
    let last = ticks.last().unwrap().0 as f64;
    assert!(
        (last - end).abs() < 2e6,
        "last sample at {last} ns, run ended at {end} ns"
    );
    let last_switches =
        json["samples"].as_array().unwrap().last().unwrap()["values"]["context_switches"].as_u64();
    assert_eq!(last_switches, Some(switches));
    assert_eq!(json["variables"][1]["type"], "u32");
    assert!(
        log.contains(&format!("{} samples in the trace", ticks.len())),
        "{log}"
    );

    // The same series as CSV, and as counters on a timeline.
    let csv = run(&["analyze", "samples", "--csv", disk.to_str().unwrap()]);
    let csv = stdout(&csv);
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("virtual_ns,host_ns,ticks,context_switches")
    );
    assert_eq!(lines.count(), ticks.len());
    let timeline = dir.path().join("t.json");
    let out = run(&[
        "analyze",
        "timeline",
        disk.to_str().unwrap(),
        "-o",
        timeline.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let events: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&timeline).unwrap()).unwrap();
    let counters: Vec<f64> = events["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "ticks")
        .map(|e| e["args"]["ticks"].as_f64().unwrap())
        .collect();
    assert_eq!(counters.len(), ticks.len());
    assert_eq!(counters.last().copied(), Some(printed as f64));
}

#[test]
fn pc_samples_of_a_traced_run_stand_where_the_trace_goes_next() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("pc.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--trace",
        "--peep",
        "1ms",
        "--sample",
        "ticks",
        "--sample-pc",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    let (console, log) = (stdout(&out), stderr(&out));
    assert!(out.status.success(), "{log}");
    assert!(log.contains("the pc (an exit each)"), "{log}");
    let printed = number_after(&console, "timer ticks:").unwrap();
    let json = samples_json(&disk);
    check_demo_ticks(&series(&json, "ticks"), printed);

    // A pc sample is taken between two steps: the pc is the next step's,
    // or an interrupt delivered at that exit comes first. At the end of a
    // REP string instruction the two can be a step apart: the host exits
    // once more at the finished REP (the vCPU still at it) before moving
    // past, and the last iteration is recorded at the exit after it.
    let records = records(&disk);
    let rep_at = |step: Option<&vtrace_storage::Step>, pc: u64| {
        step.is_some_and(|s| {
            let bytes = s.bytes.as_slice();
            matches!(bytes.first(), Some(0xf3 | 0xf2))
                && (s.pc == pc || s.pc + bytes.len() as u64 == pc)
        })
    };
    let mut checked = 0;
    let mut previous = None;
    for (i, r) in records.iter().enumerate() {
        let pc = match r {
            Record::Step(step) => {
                previous = Some(step);
                continue;
            }
            Record::Event(Event::Sample {
                pc: Some((pc, _)), ..
            }) => *pc,
            _ => continue,
        };
        let next = records[i + 1..].iter().find(|r| {
            matches!(
                r,
                Record::Step(_) | Record::Event(Event::Interrupt { .. } | Event::TraceStop(_))
            )
        });
        if let Some(Record::Step(step)) = next {
            let ok = step.pc == pc || rep_at(previous, pc) || rep_at(Some(step), pc);
            assert!(
                ok,
                "sample {i} at {pc:#x}: after {previous:?}, before {step:?}"
            );
            checked += 1;
        }
    }
    assert!(checked > 100, "{checked} pc samples checked");

    // The profile names the demo's routines, and so does the flame graph.
    let profile = json["profile"].as_array().expect("a profile");
    let total: u64 = profile.iter().map(|p| p["samples"].as_u64().unwrap()).sum();
    let with_pc = json["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["pc"].is_string())
        .count() as u64;
    assert_eq!(total, with_pc);
    let top = profile[0]["routine"].as_str().unwrap();
    assert!(demo_symbol(top) != 0, "{top} is a demo routine");
    let svg = dir.path().join("pc.svg");
    let out = run(&[
        "analyze",
        "samples",
        disk.to_str().unwrap(),
        "--flame",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("routine (pc samples)"));
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains(top) && svg.contains("samples"), "{top}");
}

#[test]
fn linux_jiffies_grow_while_it_boots() {
    if !kvm_available() {
        return;
    }
    let kernel = test_kernel();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("linux.vtd");
    let mut child = vtrace()
        .args(["run", "--no-input", "--memory", "128M", "--peep", "1ms"])
        .args(["--sample", "jiffies", "--disk"])
        .arg(&disk)
        .arg("--kernel")
        .arg(&kernel)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vtrace");
    // The delay loop is calibrated against jiffies: once it says so, the
    // timer has ticked.
    let stdout = child.stdout.take().unwrap();
    let calibrated = std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .map_while(Result::ok)
        .any(|l| l.contains("Calibrating delay loop"));
    // SIGINT: vtrace stops the guest and closes the trace.
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let log = stderr(&out);
    assert!(calibrated, "{log}");
    let json = samples_json(&disk);
    let jiffies = series(&json, "jiffies");
    assert!(jiffies.windows(2).all(|w| w[0].2 <= w[1].2), "{jiffies:?}");
    let grew = jiffies.last().unwrap().2 - jiffies[0].2;
    let interrupts = number_before(run_summary(&log), "timer interrupts").expect("summary");
    // jiffies count timer interrupts (a tickless kernel may count a few
    // at once after idling, never more than time allows).
    assert!(
        grew > 0 && grew <= interrupts + 1,
        "{grew} jiffies, {interrupts} interrupts"
    );
}

#[test]
fn peeping_refuses_what_it_cannot_do() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("bad.vtd");
    let d = disk.to_str().unwrap();
    for (args, expect) in [
        (vec!["--peep", "100us"], "needs something to sample"),
        (
            vec!["--peep", "100us", "--sample", "no_such_thing"],
            "no symbol named",
        ),
        (
            vec!["--peep", "100us", "--sample", "ticks:f32"],
            "u8, u16, u32, u64, i64",
        ),
        (
            vec!["--peep", "1us", "--sample", "ticks"],
            "below the shortest",
        ),
        (
            vec!["--peep", "100", "--sample", "ticks"],
            "not an interval",
        ),
        (vec!["--sample", "ticks"], "--peep"),
        (
            vec!["--peep", "1ms", "--sample", "0xfff00000000"],
            "not in the guest's RAM",
        ),
    ] {
        let mut all = vec!["run", "--no-input", "--disk", d];
        all.extend(&args);
        let out = run(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(expect), "{args:?}: {}", stderr(&out));
        assert!(!disk.exists(), "{args:?} left a disk behind");
    }
    // A trace without samples says how to take them.
    let out = run(&[
        "run",
        "--no-input",
        "-q",
        "--disk",
        d,
        "--max-steps",
        "10",
        "--trace",
    ]);
    assert!(out.status.success());
    let out = run(&["analyze", "samples", d]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("holds no samples"),
        "{}",
        stderr(&out)
    );
}

/// An interval longer than the run: the sampler sleeps until it is due or
/// stopped, so the run ends with its guest, and a signal still ends it
/// with its trace.
#[test]
fn a_long_interval_neither_outlasts_the_guest_nor_deafens_the_run() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("long.vtd");
    let d = disk.to_str().unwrap();
    let hang = std::time::Duration::from_secs(120);
    let peep = |extra: &[&str], interval: &str| {
        vtrace()
            .args(["run", "--no-input", "--peep", interval])
            .args(["--sample", "ticks", "--disk", d])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start vtrace")
    };
    for interval in ["1000s", "1000000000s"] {
        let mut child = peep(&[], interval);
        assert!(ended_within(&mut child, hang).success(), "{interval}");
        let log = stderr(&child.wait_with_output().unwrap());
        // One sample, as the guest stops; the virtual time is the guest's.
        assert!(log.contains("1 sample in the trace"), "{log}");
        assert!(virtual_seconds(run_summary(&log)).unwrap() < 5.0, "{log}");
    }

    // Traced, the demo runs for seconds: SIGINT stops it, trace kept.
    let mut child = peep(&["--trace"], "1000s");
    std::thread::sleep(std::time::Duration::from_secs(1));
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = ended_within(&mut child, hang);
    let log = stderr(&child.wait_with_output().unwrap());
    assert_eq!(status.code(), Some(130), "{log}");
    assert!(log.contains("stopped by SIGINT"), "{log}");
    let out = run(&["info", d]);
    assert!(out.status.success(), "{}", stderr(&out));
}
