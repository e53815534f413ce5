//! Tracing with `vtrace run --trace` / `--disk` on real guests under KVM,
//! checked through the trace disk and `vtrace info`.

mod common;

use std::ffi::OsStr;

use std::path::{Path, PathBuf};

use common::*;
use object::{Object, ObjectSymbol};
use vtrace_storage::{Event, InterruptSource, Record, TraceReader, TraceReason};

/// The steps of a trace, in order.
fn steps_of(recs: &[Record]) -> Vec<&vtrace_storage::Step> {
    recs.iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some(s),
            Record::Event(_) => None,
        })
        .collect()
}

/// The trace opens with `start` and closes with `stop`.
fn assert_bracketed(recs: &[Record], start: TraceReason, stop: TraceReason) {
    assert_eq!(recs.first(), Some(&Record::Event(Event::TraceStart(start))));
    assert_eq!(recs.last(), Some(&Record::Event(Event::TraceStop(stop))));
}

/// Traces a real-mode test guest: `vtrace run --real-mode IMAGE --disk DISK`
/// with `extra` options; returns the disk and the run's output.
fn trace_real_mode(
    dir: &Path,
    image: &[u8],
    name: &str,
    extra: &[&str],
) -> (PathBuf, std::process::Output) {
    let image = write_guest(dir, &format!("{name}.bin"), image);
    let disk = dir.join(format!("{name}.vtd"));
    let mut args = vec![
        "run",
        "--no-input",
        "--disk",
        disk.to_str().unwrap(),
        "--disk-size",
        "8M",
        "--real-mode",
        image.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    (disk, out)
}

/// Fences, CPUID, WBINVD, INVLPG and control-register writes, each one
/// step, and the instruction after each one step of its own. This host's
/// KVM reports no trap after LFENCE, MFENCE and SFENCE: the next
/// instruction ran in the same exit, and the trace had lost it (a gap
/// after every fence of a Linux trace). Now both steps are rebuilt.
#[test]
fn fences_and_serialising_instructions_are_one_step_each() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (disk, out) = trace_real_mode(
        dir.path(),
        vtrace_demo::test_guests::FENCES,
        "fences",
        &["--trace"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_fences_traced_whole(&disk);
}

#[test]
fn demo_traced_from_first_instruction_to_exit() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (disk, out) = trace_demo(dir.path(), "demo.vtd", &["--trace"]);
    let console = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let info = info_json(&disk);
    assert_eq!(info["gaps"], 0, "{info}");
    assert_eq!(info["stop_reason"], "guest_exit");
    assert!(info["steps"].as_u64().unwrap() > 100_000, "{info}");

    let recs = records(&disk);
    let steps = steps_of(&recs);
    // PVH entry: the ELF's entry point, the first instruction of all.
    let elf = object::File::parse(vtrace_demo::DEMO_OS_ELF).unwrap();
    assert_eq!(steps[0].pc, elf.entry());

    let interrupts: Vec<(usize, u8, Option<u32>, InterruptSource)> = recs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r {
            Record::Event(Event::Interrupt {
                vector,
                error_code,
                source,
            }) => Some((i, *vector, *error_code, *source)),
            _ => None,
        })
        .collect();
    // Page faults: as many as the guest counted, each a not-present fault
    // reported with its error code and followed by the handler's first step.
    let faults: Vec<_> = interrupts.iter().filter(|i| i.1 == 14).collect();
    let guest_faults = number_after(&console, "page faults:").unwrap();
    assert_eq!(faults.len() as u64, guest_faults, "{console}");
    let isr14 = demo_symbol("isr14");
    // The engine foresees each fault from the page tables and the VMM
    // delivers it (as it must where stepping rides on TF), on every host.
    for (i, _, error, source) in &faults {
        assert_eq!(*source, InterruptSource::DeliveredByVmm);
        assert_eq!(error.map(|e| e & 1), Some(0), "not-present fault");
        assert!(
            matches!(&recs[i + 1], Record::Step(s) if s.pc == isr14),
            "{:?}",
            recs[i + 1]
        );
    }
    // Timer interrupts: the ones the guest counted, injected by the VMM,
    // each entering the IRQ0 stub.
    let timers: Vec<_> = interrupts.iter().filter(|i| i.1 == 32).collect();
    let ticks = number_after(&console, "timer ticks:").unwrap();
    assert_eq!(timers.len() as u64, ticks, "{console}");
    assert!(
        ticks > 0,
        "the sleeping task makes the idle loop wait for ticks"
    );
    let isr32 = demo_symbol("isr32");
    for (i, _, _, source) in &timers {
        assert_eq!(*source, InterruptSource::Injected);
        assert!(matches!(&recs[i + 1], Record::Step(s) if s.pc == isr32));
    }
    // Task switches are address-space switches: one CR3 change per switch,
    // after the boot code's first load of its page tables.
    let cr3_changes = recs
        .iter()
        .filter(|r| matches!(r, Record::Event(Event::ControlRegister { reg: 3, .. })))
        .count() as u64;
    let switches = number_after(&console, "context switches:").unwrap();
    assert_eq!(cr3_changes, switches + 1, "{console}");
    // The guest's LOG hypercall is in the trace with its arguments.
    assert!(recs.iter().any(|r| matches!(r,
        Record::Event(Event::Hypercall { command, result: 0, .. }) if *command == vtrace_guest::cmd::LOG)));
    // ... and its text, right after.
    assert!(recs.contains(&Record::Event(Event::Log("demo OS done".into()))));
    // HLT in the idle loop is recorded and the VMM waited for the timer.
    assert!(recs.iter().any(|r| matches!(r, Record::Event(Event::Halt))));
    // Serial output as I/O events: "vtrace demo OS\n" starts with 'v'.
    assert!(recs.iter().any(|r| matches!(r,
        Record::Event(Event::Io { port: 0x3f8, write: true, value, .. }) if *value == u32::from(b'v'))));
}

#[test]
fn traces_are_deterministic_with_the_step_clock() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (a, out) = trace_demo(dir.path(), "a.vtd", &["--trace"]);
    assert_eq!(out.status.code(), Some(0));
    let (b, _) = trace_demo(dir.path(), "b.vtd", &["--trace"]);
    let (w, _) = trace_demo(dir.path(), "w.vtd", &["--trace", "--clock", "wall"]);
    let (da, db, dw) = (
        info_json(&a)["digest"].clone(),
        info_json(&b)["digest"].clone(),
        info_json(&w)["digest"].clone(),
    );
    assert_eq!(da, db);
    assert_ne!(da, dw, "wall-clock timer interrupts land elsewhere");
}

#[test]
fn exact_trace_of_a_known_program() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (disk, out) = trace_real_mode(
        dir.path(),
        vtrace_demo::test_guests::COUNT,
        "count",
        &["--trace"],
    );
    assert_eq!(out.status.code(), Some(6), "3 + 2 + 1: {}", stderr(&out));
    // Instruction boundaries of the image, from its bytes.
    let mut decoder = iced_x86::Decoder::with_ip(16, vtrace_demo::test_guests::COUNT, 0x7c00, 0);
    let pcs: Vec<u64> = (0..8).map(|_| decoder.decode().ip()).collect();
    // xor, mov ecx=3, then add/loop three times, mov ebx, mov eax, mov dx,
    // and the EXIT hypercall's IN, which returns OK (0) in EAX before the
    // VM ends, as under QEMU.
    let expect: Vec<(u64, u64, u64, u64)> = vec![
        (pcs[0], 0, 0, 0),
        (pcs[1], 0, 3, 0),
        (pcs[2], 3, 3, 0),
        (pcs[3], 3, 2, 0),
        (pcs[2], 5, 2, 0),
        (pcs[3], 5, 1, 0),
        (pcs[2], 6, 1, 0),
        (pcs[3], 6, 0, 0),
        (pcs[4], 6, 0, 6),
        (pcs[5], 1, 0, 6),
        (pcs[6], 1, 0, 6),
        (pcs[7], 0, 0, 6),
    ];
    let got: Vec<(u64, u64, u64, u64)> = steps_of(&records(&disk))
        .iter()
        .map(|s| {
            (
                s.pc,
                s.regs.gpr[0],
                s.regs.gpr[1] & 0xffff_ffff,
                s.regs.gpr[3],
            )
        })
        .collect();
    assert_eq!(got, expect);
    let info = info_json(&disk);
    assert_eq!(info["gaps"], 0);
    assert_eq!(info["steps"], 12);
}

#[test]
fn guest_hypercalls_start_and_stop_with_pass_counts() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // No --trace: the demo's matrix task calls START(3) before each row and
    // STOP(2) after it, so tracing covers rows 3 and 4.
    let (disk, out) = trace_demo(dir.path(), "roi.vtd", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let recs = records(&disk);
    assert_bracketed(
        &recs,
        TraceReason::Hypercall { pass: 3 },
        TraceReason::Hypercall { pass: 2 },
    );
    let calls: Vec<u32> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Event(Event::Hypercall { command, .. }) => Some(*command),
            _ => None,
        })
        .collect();
    use vtrace_guest::cmd::{TRACE_START, TRACE_STOP};
    // Traced: the STOP ending row 3 (1st after starting, not yet due) and
    // the START before row 4 (tracing is on already); the 2nd STOP stops it.
    assert_eq!(calls, vec![TRACE_STOP, TRACE_START]);
    // A timer interrupt (pending from the untraced stretch before) may
    // preempt the region, so other tasks can appear too; the matrix task's
    // own steps are two rows' worth.
    let elf = object::File::parse(vtrace_demo::DEMO_OS_ELF).unwrap();
    let matrix = elf
        .symbols()
        .find(|s| s.name() == Ok("task_matrix"))
        .unwrap();
    let in_matrix = |pc: u64| (matrix.address()..matrix.address() + matrix.size()).contains(&pc);
    let steps = recs
        .iter()
        .filter(|r| matches!(r, Record::Step(s) if in_matrix(s.pc)))
        .count();
    assert!(
        (5_000..20_000).contains(&steps),
        "two rows of a 24x24 product: {steps}"
    );
}

#[test]
fn max_steps_and_disk_full_stop_with_their_reason() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (disk, out) = trace_demo(dir.path(), "max.vtd", &["--trace", "--max-steps", "1000"]);
    assert_eq!(out.status.code(), Some(0));
    let info = info_json(&disk);
    assert_eq!(info["steps"], 1000);
    assert_eq!(info["stop_reason"], "max_steps");

    // Fifteen 64 KiB segments: too small for the whole demo, so tracing
    // stops, keeping the beginning, and says why.
    let disk = dir.path().join("full.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--trace",
        "--disk",
        disk.to_str().unwrap(),
        "--disk-size",
        "1M",
        "--segment-size",
        "64K",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the guest runs on untraced: {}",
        stderr(&out)
    );
    let info = info_json(&disk);
    assert_eq!(info["stop_reason"], "disk_full", "{info}");
    assert_eq!(info["clean_end"], true);
    assert_eq!(info["first_pc"], 0x100000);
    assert!(info["steps"].as_u64().unwrap() > 10_000);
}

#[test]
fn exit_after_trace_ends_the_run_at_the_stop() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (disk, out) = trace_demo(
        dir.path(),
        "short.vtd",
        &["--trace", "--max-steps", "5000", "--exit-after-trace"],
    );
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert!(log.contains("run ended when tracing stopped"), "{log}");
    // The demo OS logs this at its very end: it never got there.
    assert!(!log.contains("demo OS done"), "{log}");
    let info = info_json(&disk);
    assert_eq!(info["steps"], 5000);
    assert_eq!(info["stop_reason"], "max_steps");

    // Without tracing there is nothing to wait for: a bad argument.
    let out = run(&["run", "--no-input", "--exit-after-trace"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn wrap_keeps_the_newest_steps() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (full, _) = trace_demo(dir.path(), "full.vtd", &["--trace"]);
    let disk = dir.path().join("ring.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--trace",
        "--wrap",
        "--disk",
        disk.to_str().unwrap(),
        // Less than the demo's 1.5 MB of trace: it must wrap.
        "--disk-size",
        "1M",
        "--segment-size",
        "64K",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let (whole, ring) = (info_json(&full), info_json(&disk));
    assert_eq!(ring["stop_reason"], "guest_exit", "{ring}");
    assert_eq!(ring["last_pc"], whole["last_pc"], "the end is kept");
    assert_ne!(
        ring["first_pc"], whole["first_pc"],
        "the beginning was overwritten"
    );
    assert!(ring["steps"].as_u64().unwrap() < whole["steps"].as_u64().unwrap());
    // What is kept is exactly the tail of the full trace.
    let (a, b) = (records(&full), records(&disk));
    let tail = &a[a.len() - b.len()..];
    assert_eq!(&b[..], tail);
}

#[test]
fn killed_mid_trace_keeps_completed_segments() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("killed.vtd");
    // The step clock keeps the run deterministic: traced, the demo runs
    // about 8 s here, and two segments are on the disk after about 3.
    let mut child = vtrace()
        .args([
            "run",
            "--no-input",
            "-q",
            "--trace",
            "--disk-size",
            "64M",
            "--disk",
        ])
        .arg(&disk)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let segments = TraceReader::open(&disk)
            .map(|r| r.segments().len())
            .unwrap_or(0);
        if segments >= 2 {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the guest finished before it could be killed"
        );
        assert!(started.elapsed().as_secs() < 120, "no segments written");
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let out = run(&["info", disk.to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "problems make info fail: {text}"
    );
    assert!(text.contains("did not shut down cleanly"), "{text}");
    let info = info_json(&disk);
    assert!(info["steps"].as_u64().unwrap() > 100_000, "{info}");
    assert_eq!(info["gaps"], 0);
}

#[test]
fn bench_reports_its_figures() {
    if !kvm_available() {
        return;
    }
    // Not a timed assertion: the figures exist and are consistent, run by
    // run, and the summary is the best run's.
    let out = run(&["bench", "--json", "--runs", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{v}");
    for r in runs {
        for key in [
            "bare_exits_per_s",
            "traced_exits_per_s",
            "ratio",
            "bytes_per_step",
        ] {
            assert!(r[key].as_f64().unwrap() > 0.0, "{key}: {v}");
        }
        let (bare, traced, steps) = (
            r["bare_exits"].as_u64().unwrap(),
            r["traced_exits"].as_u64().unwrap(),
            r["traced_steps"].as_u64().unwrap(),
        );
        // The same guest each time (bare twice, around the traced run);
        // the bare loop does not wait on HLT, so its idle loop may spin a
        // little longer. Every REP iteration is a step, while this host's
        // KVM runs up to 1,024 of them per exit.
        assert!(traced > 100_000 && 2 * traced <= bare + 2000, "{v}");
        assert!(steps > traced, "{v}");
        // The same deterministic guest traced twice: the same trace.
        assert_eq!(steps, runs[0]["traced_steps"].as_u64().unwrap(), "{v}");
    }
    let ratios: Vec<f64> = runs.iter().map(|r| r["ratio"].as_f64().unwrap()).collect();
    let best = ratios.iter().copied().fold(f64::MIN, f64::max);
    assert_eq!(v["ratio"].as_f64(), Some(best), "{v}");
    let mean = (ratios[0] + ratios[1]) / 2.0;
    assert!(
        (v["ratio_median"].as_f64().unwrap() - mean).abs() < 1e-9,
        "{v}"
    );

    let out = run(&["bench", "--runs", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--runs"), "{}", stderr(&out));
}

#[test]
fn analyzer_bench_times_the_demo_trace() {
    if !kvm_available() {
        return;
    }
    // One copy of the demo's trace (the fewest --steps allow), traced by
    // the step benchmark and each analysis timed over it.
    let out = run(&["bench", "--analyzer", "--json", "--steps", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["steps"].as_u64().unwrap() > 1_000_000, "{v}");
    for key in [
        "nest_steps_per_s",
        "stats_steps_per_s",
        "export_steps_per_s",
        "export_parquet_bytes_per_step",
    ] {
        assert!(v[key].as_f64().unwrap() > 0.0, "{key}: {v}");
    }
}

/// SYSENTER (which KVM's emulator runs here, the CPU on VT-x and AMD-V)
/// is one step that lands on its target; an RDMSR of an MSR no KVM has is
/// a #GP that KVM raises, and its handler, installed after tracing began,
/// follows the event from its first instruction; so does the #UD handler
/// of a UD2. tests/vtx.rs and tests/amdv.rs trace the same guests there.
#[test]
fn sysenter_and_exceptions_are_followed() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (image, name, status, label, vector) in JUMPING_GUESTS {
        let guest = write_guest(dir.path(), name, image);
        let disk = dir.path().join(format!("{name}.vtd"));
        let mut args: Vec<&str> = JUMPING_GUEST_RUN.split_whitespace().collect();
        args.extend([
            "--kernel",
            guest.to_str().unwrap(),
            "--disk",
            disk.to_str().unwrap(),
        ]);
        let out = run(&args);
        assert_eq!(out.status.code(), Some(status), "{}", stderr(&out));
        assert_jumps_to(&disk, image, label, vector);
    }
}

/// Stores to MMIO are steps like any other: a MOV store completes its MMIO
/// exit on the next entry, and on this host no trap comes until after the
/// instruction after it (before: a gap at every store, the `inc` after it
/// lost and its registers shown on the store). The same trace on the VT-x
/// and AMD-V machines (tests/vtx.rs, tests/amdv.rs).
#[test]
fn mmio_stores_are_stepped_one_by_one() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, disk) = mmio_traced_here(dir.path());
    assert_mmio_stores_stepped(&disk);
}

/// One REP STOSB of 500,000 bytes to MMIO, traced: every iteration a step
/// with its store's event after it, no gap, and the VMM's memory bounded
/// (before, the iterations and their events were all held until the
/// instruction ended: 126 MiB at the peak for this guest, 440 MiB for two
/// million; now some 30 MiB, as for the demo OS, whatever the count).
#[test]
fn a_rep_string_flood_to_mmio_is_traced_in_bounded_memory() {
    use vtrace_demo::test_guests::{MMIO_FLOOD, MMIO_FLOOD_BYTES};
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let guest = write_guest(dir.path(), "flood.elf", MMIO_FLOOD);
    let disk = dir.path().join("flood.vtd");
    let args = [
        "run",
        "--no-input",
        "-q",
        "--trace",
        "--disk-size",
        "64M",
        "--kernel",
        guest.to_str().unwrap(),
        "--disk",
        disk.to_str().unwrap(),
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    let (status, err, peak_mib) = run_measuring_memory(&args);
    assert_eq!(status.code(), Some(0), "{err}");
    let info = info_json(&disk);
    assert_eq!(info["gaps"], 0, "{info}");
    assert_eq!(info["events"]["mmio"], MMIO_FLOOD_BYTES, "{info}");
    let mut iterations = 0u64;
    let recs = records(&disk);
    for (i, r) in recs.iter().enumerate() {
        let vtrace_storage::Record::Step(s) = r else {
            continue;
        };
        if s.bytes.as_slice() == [0xf3, 0xaa] {
            iterations += 1;
            assert!(
                matches!(
                    recs.get(i + 1),
                    Some(vtrace_storage::Record::Event(vtrace_storage::Event::Mmio {
                        write: true,
                        ..
                    }))
                ),
                "iteration {iterations}: {:?}",
                recs.get(i + 1)
            );
        }
    }
    assert_eq!(iterations, MMIO_FLOOD_BYTES);
    assert!(
        peak_mib < 64,
        "the VMM reached {peak_mib} MiB tracing {MMIO_FLOOD_BYTES} MMIO stores"
    );
    eprintln!("peak resident set {peak_mib} MiB");
}

#[test]
fn autostop_on_an_exception_the_guest_takes() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let guest = write_guest(dir.path(), "ud.elf", vtrace_demo::test_guests::EXCEPTION);
    let trace = |name: &str, extra: &[&str]| {
        let disk = dir.path().join(name);
        let mut args = vec![
            "run",
            "--no-input",
            "--trace",
            "--disk-size",
            "8M",
            "--kernel",
            guest.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--disk", disk.to_str().unwrap()]);
        let out = run(&args);
        assert_eq!(
            out.status.code(),
            Some(vtrace_demo::test_guests::EXCEPTION_STATUS),
            "{}",
            stderr(&out)
        );
        disk
    };
    // Default list: #UD stops tracing, with the exception as the reason.
    let stopped = trace("stop.vtd", &[]);
    let recs = records(&stopped);
    assert_eq!(
        recs.last(),
        Some(&Record::Event(Event::TraceStop(TraceReason::Exception(6))))
    );
    let ud = recs
        .iter()
        .position(|r| {
            matches!(
                r,
                Record::Event(Event::Interrupt {
                    vector: 6,
                    error_code: None,
                    // 32-bit code: not foreseen (the engine foresees only
                    // 64-bit code), so inferred from the handler's step.
                    source: InterruptSource::InferredFromIdt
                })
            )
        })
        .expect("the #UD is an event");
    // The UD2 itself never completes, so the last step before the event is
    // the instruction before it, and the handler's first step follows.
    let elf = object::File::parse(vtrace_demo::test_guests::EXCEPTION).unwrap();
    let handler = elf
        .symbols()
        .find(|s| s.name() == Ok("ud_handler"))
        .unwrap()
        .address();
    assert!(
        matches!(&recs[ud + 1], Record::Step(s) if s.pc == handler),
        "{:?}",
        recs[ud + 1]
    );
    assert!(matches!(&recs[ud - 1], Record::Step(s) if s.bytes.as_slice() != [0x0f, 0x0b]));

    // With --autostop none the trace runs on to the guest's exit.
    let through = trace("through.vtd", &["--autostop", "none"]);
    assert_eq!(info_json(&through)["stop_reason"], "guest_exit");
    assert_eq!(info_json(&through)["gaps"], 0);
    let bad = run(&["run", "--no-input", "--autostop", "ud,bogus"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
}

#[test]
fn ctl_starts_marks_and_stops_a_running_trace() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("ctl.vtd");
    let sock = dir.path().join("ctl.sock");
    let args = [
        OsStr::new("--no-input"),
        OsStr::new("--disk-size"),
        OsStr::new("64M"),
    ];
    let mut args = args.to_vec();
    args.extend([OsStr::new("--disk"), disk.as_os_str()]);
    let child = common::spawn_with_control(&args, &sock);
    let mode = std::fs::metadata(&sock)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()))
        .unwrap();
    assert_eq!(mode & 0o777, 0o600, "only the owner may steer the VM");
    let ctl = |cmd: &[&str]| {
        let mut args = vec!["ctl", "--control", sock.to_str().unwrap()];
        args.extend_from_slice(cmd);
        let out = run(&args);
        (out.status.code(), stdout(&out))
    };
    assert_eq!(ctl(&["start"]), (Some(0), "tracing started\n".into()));
    assert_eq!(ctl(&["mark", "7"]).0, Some(0));
    let (code, status) = ctl(&["status"]);
    assert_eq!(code, Some(0));
    assert!(status.starts_with("tracing on"), "{status}");
    assert_eq!(ctl(&["bogus"]).0, Some(2), "a usage error");
    assert!(ctl(&["stop"]).1.starts_with("tracing stopped"));
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!sock.exists(), "the socket is removed at exit");
    // The run's own console says what ctl did to it (not the status asks).
    let console = String::from_utf8_lossy(&out.stderr);
    for said in [
        "vtrace: tracing started (vtrace ctl start)",
        "(vtrace ctl mark 7)",
        "(vtrace ctl stop)",
    ] {
        assert!(console.contains(said), "{said} in {console}");
    }
    assert!(!console.contains("ctl status"), "{console}");
    let recs = records(&disk);
    assert_eq!(
        recs.first(),
        Some(&Record::Event(Event::TraceStart(TraceReason::Control)))
    );
    assert!(recs.contains(&Record::Event(Event::Mark { id: 7, value: 1 })));
    assert!(recs.contains(&Record::Event(Event::TraceStop(TraceReason::Control))));
    // With the VM gone, ctl says nobody is listening.
    assert_eq!(ctl(&["status"]).0, Some(69));
}

#[test]
fn start_and_stop_at_addresses() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut decoder = iced_x86::Decoder::with_ip(16, vtrace_demo::test_guests::COUNT, 0x7c00, 0);
    let pcs: Vec<u64> = (0..5).map(|_| decoder.decode().ip()).collect();
    // From the loop body (a hardware breakpoint) to the instruction after
    // the loop: the three add/loop pairs and nothing else.
    let (start, stop) = (format!("{:#x}", pcs[2]), format!("{:#x}", pcs[4]));
    let (disk, out) = trace_real_mode(
        dir.path(),
        vtrace_demo::test_guests::COUNT,
        "bp",
        &["--start-at", &start, "--stop-at", &stop],
    );
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    let got: Vec<u64> = steps_of(&records(&disk)).iter().map(|s| s.pc).collect();
    assert_eq!(got, vec![pcs[2], pcs[3], pcs[2], pcs[3], pcs[2], pcs[3]]);
    let info = info_json(&disk);
    assert_eq!(info["start_reasons"][0], format!("address:{start}"));
    assert_eq!(info["stop_reason"], format!("address:{stop}"));
}

/// A guest that writes its own debug registers (DR7 off, then DR0 on its
/// own first byte and enabled) before the address `--start-at` names: the
/// VMM's breakpoint still fires there, and the guest's does not take over.
#[test]
fn start_at_survives_the_guest_rewriting_its_debug_registers() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = vtrace_demo::test_guests::DEBUG_REGS;
    let mut decoder = iced_x86::Decoder::with_ip(16, image, 0x7c00, 0);
    let insns: Vec<iced_x86::Instruction> = (0..9).map(|_| decoder.decode()).collect();
    assert_eq!(insns[8].mnemonic(), iced_x86::Mnemonic::Add, "{insns:?}");
    let start = format!("{:#x}", insns[8].ip());
    let (disk, out) = trace_real_mode(dir.path(), image, "dr", &["--start-at", &start]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    let got: Vec<u64> = steps_of(&records(&disk)).iter().map(|s| s.pc).collect();
    // add/loop three times, mov ebx, mov eax, mov dx, the EXIT's IN.
    assert_eq!(got.len(), 10, "{got:x?}");
    assert_eq!(got[0], insns[8].ip());
    assert_eq!(
        info_json(&disk)["start_reasons"][0],
        format!("address:{start}")
    );
}

#[test]
fn start_and_stop_at_routines_by_name() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // From the demo OS's scheduler to the next interrupt entry (both
    // found in the demo OS's own symbols).
    let (schedule, switch) = (demo_symbol("schedule"), demo_symbol("isr_common"));
    let (disk, out) = trace_demo(
        dir.path(),
        "named.vtd",
        &["--start-at", "schedule", "--stop-at", "isr_common"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let recs = records(&disk);
    // The demo OS's own start/stop hypercalls may trace more later: only
    // the first stretch is the triggers'.
    let first_stop = recs
        .iter()
        .position(|r| matches!(r, Record::Event(Event::TraceStop(_))))
        .expect("a stop");
    assert_eq!(
        recs[first_stop],
        Record::Event(Event::TraceStop(TraceReason::Address(switch)))
    );
    let steps = steps_of(&recs[..first_stop]);
    assert_eq!(steps.first().map(|s| s.pc), Some(schedule));
    assert!(steps.iter().all(|s| s.pc != switch), "stops before it runs");
    let info = info_json(&disk);
    assert_eq!(info["start_reasons"][0], format!("address:{schedule:#x}"));

    // A name the kernel does not have is a bad argument, caught before a
    // disk is made.
    let (disk, out) = trace_demo(dir.path(), "typo.vtd", &["--start-at", "shedule"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--start-at shedule"),
        "{}",
        stderr(&out)
    );
    assert!(!disk.exists());
}

#[test]
fn hotkeys_start_tracing_and_mark() {
    if !kvm_available() {
        return;
    }
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("keys.vtd");
    let mut child = vtrace()
        .args(["run", "--disk-size", "64M", "--disk"])
        .arg(&disk)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"\x01t\x01m")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert!(
        log.contains("tracing started") && log.contains("mark 1 recorded"),
        "{log}"
    );
    let recs = records(&disk);
    assert_eq!(
        recs.first(),
        Some(&Record::Event(Event::TraceStart(TraceReason::Hotkey)))
    );
    assert!(recs.contains(&Record::Event(Event::Mark {
        id: u64::MAX,
        value: 1
    })));
    assert_eq!(info_json(&disk)["gaps"], 0);
}

#[test]
fn combined_region_hypercall_traces_the_asked_passes() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (disk, out) = trace_real_mode(dir.path(), vtrace_demo::test_guests::REGION, "region", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let recs = records(&disk);
    assert_bracketed(
        &recs,
        TraceReason::Hypercall { pass: 2 },
        TraceReason::Hypercall { pass: 4 },
    );
    // ESI counts the passes: the traced ones end with 2 and 3.
    let esi: std::collections::BTreeSet<u64> =
        steps_of(&recs).iter().map(|s| s.regs.gpr[6]).collect();
    assert_eq!(esi.into_iter().collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(info_json(&disk)["gaps"], 0);
}
