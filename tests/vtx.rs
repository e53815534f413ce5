//! vtrace on a real VT-x KVM: the VT-x test machine (scripts/vtx.sh) boots
//! the installed kernel with its kvm-intel under Bochs's VMX emulation, and
//! `vtrace` runs in it. Stepping there rides on RFLAGS.TF, as on every
//! VT-x and AMD-V host, and hardware breakpoints reach the VMM (they do
//! not on the AMD-V machine). Bochs steps a few thousand instructions a
//! second, so the tests share boots and bound what they trace.

mod common;

use common::vtx::{vtx, vtx_available};
use common::*;
use vtrace_storage::{Event, Record, TraceReason};

/// A value of `vtrace info --json`'s output the machine left in /out.
fn json_file(m: &common::machine::MachineRun, name: &str) -> serde_json::Value {
    let text = m.text(name);
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "{name} is not JSON ({e}): {text:?}\n{}\n{}",
            m.output, m.stderr
        )
    })
}

/// Runs vtrace here with `args` and returns `vtrace info --json` of the
/// trace it left at `disk`.
fn traced_here(disk: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec![
        "run",
        "--no-input",
        "-q",
        "--disk",
        disk.to_str().unwrap(),
        "--disk-size",
        "64M",
    ];
    all.extend_from_slice(args);
    let o = run(&all);
    assert!(o.status.success(), "{}", stderr(&o));
    info_json(disk)
}

/// One boot of the VT-x machine, checked against the same runs here:
///
/// - `vtrace doctor` finds KVM on VT-x, every kernel and user instruction
///   stepped (the single-step exits KVM reports twice passed over), and
///   breakpoints that reach the VMM;
/// - the demo OS traced from its first instruction: 0 gaps and the digest
///   of this host. Before the VMM passed over the exits that ran nothing,
///   every instruction KVM completed itself recorded the next one twice
///   (178 gaps in the first 100,000 steps);
/// - the SMP demo's first steps on two CPUs, digest for digest;
/// - `--start-at schedule --stop-at isr_common` (hardware breakpoints, the
///   guest untraced until the first): from the scheduler's first
///   instruction to the one before the interrupt entry, no gap. (Untraced,
///   the guest's timer follows wall time, which Bochs's guest outruns less:
///   there a timer interrupt may come inside the window, so the steps are
///   not compared with this host's.)
/// - `--trace-function page_fault`: one window a fault, as here, 0 gaps;
/// - the serialising instructions, each one step;
/// - `--start-at` in a guest that sets a breakpoint of its own first: the
///   VMM's still fires, the guest's does not take over;
/// - untraced, `--capture`, a `fn:` probe and an `fnret:` probe (its
///   entry's and each call's return address) at hardware breakpoints, and
///   the stretch the demo traces by hypercall;
/// - SYSENTER one step onto its target; a #GP that KVM raises (RDMSR of an
///   MSR it lacks) and a #UD the CPU raises, each taken at the breakpoint
///   on its handler's entry (the guests load their IDT after tracing
///   starts) and the handler traced from its first instruction;
/// - tracing started by the hotkey, and a mark;
/// - stores to MMIO, each one step, the same trace as here.
#[test]
fn demo_os_breakpoints_and_fences_on_vtx_match_this_host() {
    if !vtx_available() || !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let demo_here = traced_here(&dir.path().join("demo.vtd"), &["--trace"]);
    let smp_here = traced_here(&dir.path().join("smp.vtd"), SMP_PREFIX);
    let start_here = dir.path().join("start.vtd");
    let start_info = traced_here(
        &start_here,
        &[
            "--start-at",
            "schedule",
            "--stop-at",
            "isr_common",
            "--exit-after-trace",
        ],
    );
    let function_here = traced_here(
        &dir.path().join("function.vtd"),
        &["--trace-function", "page_fault"],
    );
    let bp_here = dir.path().join("bp.vtd");
    traced_here(&bp_here, BREAKPOINT_PROBES);
    let fences = write_guest(dir.path(), "fences.bin", vtrace_demo::test_guests::FENCES);
    // The guest sets a breakpoint of its own (DR0 on its first byte, DR7)
    // before the `add` of its loop, where --start-at puts the VMM's.
    let image = vtrace_demo::test_guests::DEBUG_REGS;
    let debug_regs = write_guest(dir.path(), "dr.bin", image);
    let mut decoder = iced_x86::Decoder::with_ip(16, image, 0x7c00, 0);
    let insns: Vec<iced_x86::Instruction> = (0..9).map(|_| decoder.decode()).collect();
    assert_eq!(insns[8].mnemonic(), iced_x86::Mnemonic::Add, "{insns:?}");
    let add = insns[8].ip();

    let command = format!(
        "{} vtrace run --no-input -q --real-mode dr.bin --start-at {add:#x} --disk /out/dr.vtd \
           --disk-size 8M > /out/dr.txt 2>&1; echo \"dr status $?\"; \
         vtrace run --no-input -q --disk /out/bp.vtd --disk-size 8M {} > /out/bp.txt 2>&1",
        DEMO_RUNS_THERE,
        BREAKPOINT_PROBES.join(" ")
    );
    let jumping: Vec<(std::path::PathBuf, &str)> = JUMPING_GUESTS
        .iter()
        .map(|(image, name, ..)| (write_guest(dir.path(), name, image), *name))
        .collect();
    let (mmio, mmio_here) = mmio_traced_here(dir.path());
    let engine = engine_available();
    let command = command
        + if engine { ENGINE_RUNS_THERE } else { "" }
        + "; "
        + &jumping_guests_there(&JUMPING_GUESTS)
        + HOTKEY_THERE
        + "; vtrace "
        + &mmio_run("mmio.elf", "/out/mmio.vtd");
    let mut files = vec![
        (fences.as_path(), "fences.bin"),
        (debug_regs.as_path(), "dr.bin"),
    ];
    files.extend(jumping.iter().map(|(p, n)| (p.as_path(), *n)));
    files.push((mmio.as_path(), "mmio.elf"));
    let m = vtx(&files, &command, 1800);
    assert_eq!(m.status, Some(0), "{}\n{}", m.output, m.stderr);
    assert!(
        m.output.contains("vmx") && m.output.contains("kvm_intel"),
        "{}",
        m.output
    );

    let d = json_file(&m, "doctor.json");
    assert_eq!(d["kind"], "VT-x", "{d}");
    assert_eq!(d["kernel_code_emulated"], false, "{d}");
    assert_eq!(d["kernel_stepping"]["works"], true, "{d}");
    assert_eq!(
        d["kernel_stepping"]["seen"], d["kernel_stepping"]["expected"],
        "armed once, every instruction once: {d}"
    );
    assert!(
        d["kernel_stepping"]["echoes"].as_u64() > Some(0),
        "the probe's OUT is an instruction KVM completes: {d}"
    );
    assert_eq!(d["user_stepping"]["works"], true, "{d}");
    assert_eq!(d["syscall_enters_kernel"], true, "{d}");
    assert_eq!(d["breakpoints_exit"], true, "{d}");
    // Data breakpoints too (here and on the AMD-V machine they do not):
    // what gdb's watchpoints could use untraced on VT-x.
    assert_eq!(d["watchpoints_exit"], true, "{d}");
    let verdict = d["trace_shows"][0]["verdict"].as_str().unwrap_or_default();
    assert!(verdict.starts_with("every instruction"), "{d}");

    let demo = json_file(&m, "demo.json");
    assert!(
        m.text("demo.txt").contains("demo OS done"),
        "{}",
        m.text("demo.txt")
    );
    assert_eq!(demo["gaps"], 0, "{demo}");
    assert_eq!(demo["steps"], demo_here["steps"], "{demo}\n{demo_here}");
    assert_eq!(demo["events"], demo_here["events"], "{demo}\n{demo_here}");
    assert_eq!(demo["digest"], demo_here["digest"], "{demo}\n{demo_here}");

    if engine {
        assert_engine_runs_there(&m, &demo_here, dir.path());
    }

    // Two CPUs: the application processor's start (INIT and STARTUP
    // IPIs, real mode to long mode, its first wait) in the step clock's
    // order, as here.
    let smp = json_file(&m, "smp.json");
    assert_eq!(smp["gaps"], 0, "{smp}\n{}", m.text("smp.txt"));
    assert_eq!(
        smp["steps_by_cpu"], smp_here["steps_by_cpu"],
        "{smp}\n{smp_here}"
    );
    assert!(smp["steps_by_cpu"]["1"].as_u64() > Some(1000), "{smp}");
    assert_eq!(smp["digest"], smp_here["digest"], "{smp}\n{smp_here}");

    // The stretch between two breakpoints: the same steps, one by one.
    let there = m.file("start.vtd");
    let start_there = info_json(&there);
    assert_eq!(
        start_there["gaps"],
        0,
        "{start_there}\n{}",
        m.text("start.txt")
    );
    assert_eq!(start_there["stop_reason"], start_info["stop_reason"]);
    let recs = records(&there);
    let schedule = demo_symbol("schedule");
    assert_eq!(
        recs.iter().find_map(|r| match r {
            Record::Step(s) => Some(s.pc),
            Record::Event(_) => None,
        }),
        Some(schedule)
    );
    assert!(
        recs.contains(&Record::Event(Event::TraceStop(TraceReason::Address(
            demo_symbol("isr_common")
        ))))
    );

    // One window a page fault, from the entry to the return: the untraced
    // stretches between run on wall time, so only the control flow is
    // compared, not the registers.
    let function = json_file(&m, "function.json");
    assert_eq!(function["gaps"], 0, "{function}");
    assert_eq!(function["steps"], function_here["steps"], "{function}");
    assert_eq!(function["events"], function_here["events"], "{function}");
    let faults = number_after(&m.text("function.txt"), "page faults:");
    assert!(faults > Some(1), "{}", m.text("function.txt"));
    assert_eq!(
        function["events"]["trace_start"].as_u64(),
        faults,
        "{function}"
    );

    assert_fences_traced_whole(&m.file("fences.vtd"));

    // The VMM's breakpoint fired though the guest wrote its own debug
    // registers: add/loop three times, mov ebx, mov eax, mov dx, the EXIT.
    assert!(m.output.contains("dr status 6"), "{}", m.text("dr.txt"));
    let got: Vec<u64> = records(&m.file("dr.vtd"))
        .iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some(s.pc),
            Record::Event(_) => None,
        })
        .collect();
    assert_eq!(got.len(), 10, "{got:x?}");
    assert_eq!(got[0], add);

    // Untraced, captures and fn: probes fire at hardware breakpoints,
    // which reach the VMM on VT-x: the same kprintf formats as here, and a
    // schedule() probe a timer tick or yield trap, as the demo counts
    // them. The stretch the demo traces by hypercall has no gap.
    let captures = |trace: &std::path::Path| {
        let o = run(&["analyze", "captures", "--json", trace.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let mut texts: Vec<String> = json["captures"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap_or_default().to_string())
            .collect();
        texts.sort();
        texts
    };
    let bp_there = m.file("bp.vtd");
    let texts = captures(&bp_there);
    assert!(texts.len() > 5, "{texts:?}\n{}", m.text("bp.txt"));
    assert_eq!(texts, captures(&bp_here));
    let o = run(&["analyze", "probes", "--json", bp_there.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let probes: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let schedules = probes["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["probe"] == "fn:schedule")
        .and_then(|p| p["count"].as_u64());
    let console = m.text("bp.txt");
    let (ticks, yields) = (
        number_after(&console, "timer ticks:"),
        number_after(&console, "yield traps:"),
    );
    assert!(ticks.is_some() && yields.is_some(), "{console}");
    assert_eq!(
        schedules,
        Some(ticks.unwrap() + yields.unwrap()),
        "{probes}"
    );
    // `fnret:` untraced: a breakpoint at the entry, one at the return
    // address; the frames the demo allocates, in order, as here.
    let returns = returned_values(&bp_there, "fnret:frame_alloc");
    assert!(returns.len() > 5, "{returns:?}\n{}", m.text("bp.txt"));
    assert_eq!(returns, returned_values(&bp_here, "fnret:frame_alloc"));
    let stretch = info_json(&bp_there);
    assert_eq!(stretch["gaps"], 0, "{stretch}");
    assert!(stretch["steps"].as_u64() > Some(0), "{stretch}");

    assert_jumping_guests(&JUMPING_GUESTS, &m.output, |name| m.file(name));
    // MMIO stores, one step each, the same trace as here.
    assert_mmio_stores_stepped(&m.file("mmio.vtd"));
    common::linux::assert_same_trace(&mmio_here, &m.file("mmio.vtd"));
    for (_, name, ..) in &JUMPING_GUESTS[1..] {
        let text = m.text(&format!("{name}.txt"));
        assert!(!text.contains("GAP"), "{name}: {text}");
    }

    // The hotkey (Ctrl-A t, then Ctrl-A m for a mark) on standard input.
    let keys = m.file("keys.vtd");
    let recs = records(&keys);
    assert_eq!(
        recs.first(),
        Some(&Record::Event(Event::TraceStart(TraceReason::Hotkey))),
        "{}",
        m.text("keys.txt")
    );
    assert!(recs.contains(&Record::Event(Event::Mark {
        id: u64::MAX,
        value: 1
    })));
    assert_eq!(info_json(&keys)["gaps"], 0);
}

/// Tracing started by the hotkey on standard input, a mark, and 20,000
/// steps.
const HOTKEY_THERE: &str =
    "printf '\\001t\\001m' | vtrace run --disk /out/keys.vtd --disk-size 8M \
     --max-steps 20000 --exit-after-trace > /dev/null 2> /out/keys.txt; echo \"keys status $?\"";

/// Untraced, with a capture and a fn: probe (hardware breakpoints) and
/// the demo's own hypercalls tracing a stretch of it.
const BREAKPOINT_PROBES: &[&str] = &[
    "--capture",
    "kprintf:rdi:64",
    "--probe",
    "fn:schedule",
    "--probe",
    "fnret:frame_alloc",
];

/// The return values of `probe`'s fires in `trace`, in order.
fn returned_values(trace: &std::path::Path, probe: &str) -> Vec<String> {
    probe_fires(trace)
        .iter()
        .filter(|f| f["probe"] == probe)
        .map(|f| fire_value(f, "retval"))
        .collect()
}

/// `vtrace run` options for the SMP demo's first steps on two CPUs: CPU 0
/// starts CPU 1, which reaches its wait for work (`DEMO_RUNS_THERE`
/// gives the machine the same).
const SMP_PREFIX: &[&str] = &["--cpus", "2", "--trace", "--max-steps", "300000"];

/// What the first boot runs in the VT-x machine, each result in /out.
const DEMO_RUNS_THERE: &str =
    "grep -qw vmx /proc/cpuinfo && echo vmx; lsmod | grep -q '^kvm_intel' && echo kvm_intel; \
     vtrace doctor --json > /out/doctor.json; \
     vtrace run --no-input -q --trace --disk /tmp/demo.vtd --disk-size 64M > /out/demo.txt 2>&1; \
     vtrace info --json /tmp/demo.vtd > /out/demo.json; \
     vtrace run --no-input -q --cpus 2 --trace --max-steps 300000 --disk /tmp/smp.vtd \
       --disk-size 16M > /out/smp.txt 2>&1; \
     vtrace info --json /tmp/smp.vtd > /out/smp.json; \
     vtrace run --no-input -q --disk /out/start.vtd --disk-size 8M \
       --start-at schedule --stop-at isr_common --exit-after-trace > /out/start.txt 2>&1; \
     vtrace run --no-input -q --disk /tmp/function.vtd --disk-size 64M \
       --trace-function page_fault > /out/function.txt 2>&1; \
     vtrace info --json /tmp/function.vtd > /out/function.json; \
     vtrace run --no-input -q --trace --real-mode fences.bin --disk /out/fences.vtd \
       --disk-size 8M > /out/fences.txt 2>&1;";

/// The second engine in the VT-x machine, where its library is there: the
/// demo OS traced whole (the hand-over from VT-x's KVM at its first
/// instruction), and a `--start-at` window (a hardware breakpoint's exit,
/// then the CPU to the engine and back).
const ENGINE_RUNS_THERE: &str = "; \
     vtrace run --no-input -q --trace --engine bochs --disk /tmp/engine.vtd --disk-size 64M \
       > /out/engine.txt 2>&1; \
     vtrace info --json /tmp/engine.vtd > /out/engine.json; \
     vtrace run --no-input -q --engine bochs --disk /out/window.vtd --disk-size 8M \
       --start-at kmain --max-steps 300000 --ignore-guest-tracing >> /out/engine.txt 2>&1";

/// What [`ENGINE_RUNS_THERE`] left: the demo's trace of this host, and the
/// window this host's engine takes.
fn assert_engine_runs_there(
    m: &common::machine::MachineRun,
    demo_here: &serde_json::Value,
    dir: &std::path::Path,
) {
    let engine = json_file(m, "engine.json");
    assert_eq!(engine["gaps"], 0, "{engine}\n{}", m.text("engine.txt"));
    assert_eq!(
        engine["digest"], demo_here["digest"],
        "{engine}\n{demo_here}"
    );
    let window = dir.join("window.vtd");
    let o = run(&[
        "run",
        "--no-input",
        "-q",
        "--engine",
        "bochs",
        "--disk",
        window.to_str().unwrap(),
        "--disk-size",
        "8M",
        "--start-at",
        "kmain",
        "--max-steps",
        "300000",
        "--ignore-guest-tracing",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    common::linux::assert_same_trace(&window, &m.file("window.vtd"));
}

/// Linux on the VT-x machine: Debian's kernel boots to a busybox userspace
/// under vtrace, and `vtrace ctl start` from another process traces it
/// while userspace loops on a system call, until `--max-steps`: every
/// system call followed from the user-mode SYSCALL through the kernel's
/// entry and SYSRETQ back into user mode, no gap, and `analyze processes`
/// names the shell. That boot has the host's CPU (`--cpu host`: Intel's
/// Haswell, XSAVE and all), on which the kernel isolates user page tables,
/// so the running task is read through the kernel's own page tables where
/// tracing starts in user mode. A second boot, with the baseline CPU,
/// powers off: the run ends with status 0. The first 200,000 steps of a
/// third, traced from the kernel's first instruction, are this host's,
/// digest for digest (the baseline CPU is one fixed table; before, Linux
/// saw an Intel CPU here and an AMD one there).
#[test]
fn linux_user_mode_power_off_and_boot_trace_as_here_on_vtx() {
    use common::linux::*;
    if !vtx_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = test_kernel();
    let initrd = busybox_initramfs(dir.path(), SYSCALL_LOOP);
    let off = tempfile::tempdir().unwrap();
    let poweroff = busybox_initramfs(off.path(), "echo 'l2: poweroff'; poweroff -f");
    let script = linux_up(
        "--cpu host --disk /out/l.vtd --disk-size 128M --max-steps 60000 --exit-after-trace",
    )
        + "sleep 2; vtrace ctl start; wait $pid; s=$?; tail -3 /tmp/log; [ $s = 0 ] || exit $s; \
           vtrace run --no-input --kernel vmlinuz --initrd off.cpio --memory 256M > /tmp/off 2>&1; \
           echo \"poweroff status $?\"; grep -e 'l2:' -e '^vtrace:' /tmp/off; "
        + &boot_prefix_there()
        + "; echo \"prefix status $?\"";
    let m = vtx(
        &[
            (&kernel, "vmlinuz"),
            (&initrd, "l2.cpio"),
            (&poweroff, "off.cpio"),
        ],
        &script,
        1500,
    );
    assert_eq!(m.status, Some(0), "{}\n{}", m.output, m.stderr);
    assert!(m.output.contains("stopped by --max-steps"), "{}", m.output);
    assert_user_mode_traced_whole(&m.file("l.vtd"));
    assert!(m.output.contains("l2: poweroff"), "{}", m.output);
    assert!(m.output.contains("poweroff status 0"), "{}", m.output);
    assert!(
        m.output.contains("vtrace: guest powered off"),
        "{}",
        m.output
    );
    assert_boot_prefix_as_here(&m, dir.path());
}
