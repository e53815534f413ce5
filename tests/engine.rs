//! The second engine end to end: `vtrace run --engine bochs` traces on
//! Bochs's CPU, handed over from KVM where tracing starts and back where
//! it stops, and gives the trace stepping gives, step for step (the
//! digest), while the guest runs on and ends as it does untraced.
//!
//! Needs the engine's library (`scripts/engine.sh`, which the test script
//! runs): without it these tests say so and pass, except under CI, where
//! the library must be there.

mod common;

use std::path::{Path, PathBuf};

use common::{
    demo_trace, engine_available, info_json, kvm_available, records, run, stderr, vtrace,
};
use vtrace_storage::{Event, Record, TraceReason};

/// `vtrace run` of the demo OS into `dir/name` on `engine`, with `extra`.
fn demo_on(
    dir: &Path,
    name: &str,
    engine: &str,
    extra: &[&str],
) -> (PathBuf, std::process::Output) {
    let mut args = vec!["--engine", engine];
    args.extend_from_slice(extra);
    common::trace_demo(dir, name, &args)
}

/// The two traces are one: the same digest and steps (and if not, where
/// their listings part).
fn assert_same(stepped: &Path, engine: &Path) {
    common::linux::assert_same_trace(stepped, engine);
    let info = info_json(engine);
    assert_eq!(info["gaps"], 0, "{info}");
    assert!(
        info["metadata"]
            .as_str()
            .is_some_and(|m| m.contains("engine: bochs")),
        "the trace says which engine made it: {info}"
    );
}

#[test]
fn the_demo_traced_whole_on_the_engine_is_the_stepped_trace() {
    if !kvm_available() || !engine_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (disk, out) = demo_on(dir.path(), "whole.vtd", "bochs", &["--trace"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("vtrace: guest: demo OS done"), "{said}");
    assert!(said.contains("guest exited with status 0"), "{said}");
    assert_same(demo_trace(), &disk);
}

/// What the tracer adds on the way is the same on the engine: captures
/// of kprintf's format strings and of the page-fault addresses (not
/// present), static and `fn:`/`fnret:` probes, the memory values.
#[test]
fn captures_probes_and_values_on_the_engine_are_stepping_s() {
    if !kvm_available() || !engine_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let extra = [
        "--trace",
        "--capture",
        "kprintf:rdi:64",
        "--capture",
        "page_fault:rdi:16:fault",
        "--probe",
        "sched:*",
        "--probe",
        "fn:schedule",
        "--probe",
        "fnret:schedule",
        "--record-values",
    ];
    let (stepped, out) = demo_on(dir.path(), "stepped.vtd", "step", &extra);
    assert!(out.status.success(), "{}", stderr(&out));
    let (engine, out) = demo_on(dir.path(), "engine.vtd", "bochs", &extra);
    assert!(out.status.success(), "{}", stderr(&out));
    let info = info_json(&engine);
    for kind in ["capture", "probe", "memory values"] {
        assert!(
            info["events"][kind].as_u64().is_some_and(|n| n > 0),
            "{kind} events: {info}"
        );
    }
    assert_same(&stepped, &engine);
}

/// Without `--trace` the demo OS starts and stops tracing itself with its
/// hypercalls: each start a hand-over to the engine, each stop one back to
/// KVM, from the middle of the hypercall's step. The stretches between
/// follow the host's clock, so a timer interrupt may fall into a window in
/// one run and not in another: the windows are compared step for step
/// where neither run has one.
#[test]
fn the_demos_own_windows_go_to_the_engine_and_back_and_give_stepping_trace() {
    if !kvm_available() || !engine_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (stepped, out) = demo_on(dir.path(), "stepped.vtd", "step", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (engine, out) = demo_on(dir.path(), "engine.vtd", "bochs", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("vtrace: guest: demo OS done"));
    let windows = |trace: &Path| -> Vec<Record> {
        records(trace)
            .into_iter()
            .filter(|r| matches!(r, Record::Event(Event::TraceStart(_) | Event::TraceStop(_))))
            .collect()
    };
    let ours = windows(&engine);
    assert!(!ours.is_empty(), "the guest's windows");
    assert_eq!(
        ours,
        windows(&stepped),
        "the same windows, started and stopped alike"
    );
    let interrupted = |trace: &Path| {
        info_json(trace)["events"]["interrupt"]
            .as_u64()
            .unwrap_or(0)
            > 0
    };
    assert_eq!(info_json(&engine)["gaps"], 0);
    if !interrupted(&stepped) && !interrupted(&engine) {
        assert_same(&stepped, &engine);
    }
}

/// `--start-at` takes the CPU from KVM at a hardware breakpoint, after an
/// untraced boot; `--max-steps` gives it back, and the demo runs on to its
/// end under KVM. The window holds interrupts, port I/O and a hypercall.
#[test]
fn a_start_at_window_on_the_engine_is_the_stepped_window_and_the_guest_ends_as_untraced() {
    if !kvm_available() || !engine_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let window = [
        "--start-at",
        "kmain",
        "--max-steps",
        "300000",
        "--ignore-guest-tracing",
    ];
    let (stepped, out) = demo_on(dir.path(), "stepped.vtd", "step", &window);
    assert!(out.status.success(), "{}", stderr(&out));
    let (engine, out) = demo_on(dir.path(), "engine.vtd", "bochs", &window);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("vtrace: guest: demo OS done"), "{said}");
    assert!(said.contains("guest exited with status 0"), "{said}");
    let info = info_json(&engine);
    assert_eq!(info["steps"], 300_000, "{info}");
    let recs = records(&engine);
    for kind in ["interrupt", "io", "hypercall"] {
        assert!(
            info["events"][kind].as_u64().is_some_and(|n| n > 0),
            "a window with {kind} events: {info}"
        );
    }
    assert!(recs.contains(&Record::Event(Event::TraceStop(TraceReason::MaxSteps))));
    assert_same(&stepped, &engine);
}

/// `vtrace ctl start` and `stop` hand the CPU over wherever the guest is
/// (running, or idle in HLT), and the guest ends as it would untraced.
#[test]
fn ctl_windows_on_the_engine_are_whole_and_the_guest_ends_as_untraced() {
    if !kvm_available() || !engine_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("ctl.vtd");
    let sock = dir.path().join("ctl.sock");
    let args = [
        "--no-input",
        "--engine",
        "bochs",
        "--ignore-guest-tracing",
        "--disk-size",
        "64M",
        "--disk",
    ];
    let mut args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    args.push(disk.as_os_str());
    let child = common::spawn_with_control(&args, &sock);
    let ctl = |cmd: &str| {
        let out = run(&["ctl", "--control", sock.to_str().unwrap(), cmd]);
        out.status.code()
    };
    // The guest may be done before a request comes (it is short): then
    // ctl finds nobody (69), and the windows it did open count.
    for _ in 0..3 {
        if ctl("start") != Some(0) || ctl("stop") != Some(0) {
            break;
        }
    }
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("vtrace: guest: demo OS done"), "{said}");
    let info = info_json(&disk);
    assert_eq!(info["gaps"], 0, "{info}");
    let recs = records(&disk);
    assert_eq!(
        recs.first(),
        Some(&Record::Event(Event::TraceStart(TraceReason::Control))),
        "{info}"
    );
}

/// Linux's first 200,000 steps from its first instruction, on the engine:
/// stepping's trace.
#[test]
fn linux_boot_prefix_on_the_engine_is_the_stepped_prefix() {
    if !kvm_available() || !engine_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let stepped = common::linux::boot_prefix_here(dir.path());
    let engine = dir.path().join("engine.vtd");
    let kernel = common::test_kernel();
    let args = common::linux::boot_prefix_args(kernel.to_str().unwrap(), engine.to_str().unwrap());
    let mut args: Vec<&str> = args.split_whitespace().collect();
    args.extend(["--engine", "bochs"]);
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_same(&stepped, &engine);
}

#[test]
fn without_its_library_the_engine_is_refused_with_how_to_build_it() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // No library where VTRACE_ENGINE points: unavailable (69), and how to
    // build it.
    let out = vtrace()
        .args([
            "run",
            "--no-input",
            "--trace",
            "--engine",
            "bochs",
            "--disk",
        ])
        .arg(dir.path().join("none.vtd"))
        .env("VTRACE_ENGINE", dir.path().join("missing.so"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{said}");
    assert!(
        said.contains("scripts/engine.sh") || said.contains("missing.so"),
        "{said}"
    );
    if !engine_available() {
        return;
    }
    let (_, out) = demo_on(
        dir.path(),
        "many.vtd",
        "bochs",
        &["--trace", "--cpus", "255"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// The SMP demo on two CPUs, traced whole: the CPUs take turns on the
/// engine as they do stepped (a turn may end at a store's MMIO exit,
/// before the store's own step: its IPI's handler runs first), the
/// application processor is started by INIT and STARTUP IPIs into the
/// engine's CPU, local APIC timers and IPIs land at the same steps.
#[test]
fn the_smp_demo_on_two_cpus_on_the_engine_is_the_stepped_trace() {
    if !kvm_available() || !engine_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let smp = ["--trace", "--cpus", "2"];
    let (stepped, out) = demo_on(dir.path(), "stepped.vtd", "step", &smp);
    assert!(out.status.success(), "{}", stderr(&out));
    let (engine, out) = demo_on(dir.path(), "engine.vtd", "bochs", &smp);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("vtrace: guest: demo OS done"), "{said}");
    let info = info_json(&engine);
    assert!(
        info["steps_by_cpu"]["1"].as_u64().is_some_and(|n| n > 0),
        "{info}"
    );
    assert_same(&stepped, &engine);
}

/// Linux traced whole on the engine: from its first instruction through
/// its boot, the busybox shell as `/init` in user space (which stepping on
/// this project's hosts cannot enter) and its power-off, with no gap. The
/// trace holds the shell's own user steps and its system calls.
///
/// `cryptomgr.notests`: the kernel's boot-time self-tests of its ciphers
/// are two thirds of this boot's 1.29 billion steps (RSA's multiprecision
/// routines alone 830 million); without them it is about 450 million.
#[test]
fn linux_traced_whole_on_the_engine_reaches_user_space_and_powers_off() {
    if !kvm_available() || !engine_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let initrd = common::linux::busybox_initramfs(dir.path(), "echo 'l2: poweroff'; poweroff -f");
    let disk = dir.path().join("linux.vtd");
    let kernel = common::test_kernel();
    let out = vtrace()
        .args(["run", "--no-input", "--engine", "bochs", "--trace"])
        .args(["--memory", "128M", "--append", "cryptomgr.notests"])
        .args(["--disk-size", "4G", "--kernel"])
        .arg(&kernel)
        .arg("--initrd")
        .arg(&initrd)
        .arg("--disk")
        .arg(&disk)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let (console, said) = (common::stdout(&out), stderr(&out));
    assert!(out.status.success(), "{said}\n{console}");
    assert!(console.contains("l2: userspace up"), "{console}");
    assert!(console.contains("l2: poweroff"), "{console}");
    assert!(said.contains("vtrace: guest powered off"), "{said}");
    assert!(said.contains(" steps, 0 gaps,"), "{said}");
    // What Bochs does not model is said once, not at every access.
    assert!(said.contains("the engine does not model"), "{said}");
    assert!(!said.contains("Unknown register"), "{said}");

    // /init is the shell, pid 1, named "init": user steps and system
    // calls of its, and of the applets it runs, in the trace.
    let table = common::linux::processes(&disk);
    let rows = table["processes"].as_array().unwrap();
    let user: u64 = rows.iter().filter_map(|r| r["user_steps"].as_u64()).sum();
    assert!(user > 10_000, "{table}");
    let init = rows
        .iter()
        .find(|r| r["tid"] == 1)
        .unwrap_or_else(|| panic!("no task 1: {table}"));
    assert_eq!(init["comm"], "init", "{table}");
    assert!(
        init["user_steps"].as_u64().is_some_and(|n| n > 1_000),
        "{table}"
    );
    assert!(init["syscalls"].as_u64().is_some_and(|n| n > 10), "{table}");
}
