//! An unmodified Linux kernel boots under `vtrace run` far enough to print
//! its banner on the serial console, and its first steps traced make a
//! nest diagram with the kernel's own function names. `scripts/test.sh`
//! installs Debian's linux-image-cloud-amd64 for this (its System.map is a
//! stub, so the names come from the kernel's kallsyms table);
//! VTRACE_TEST_KERNEL names another.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;

/// `vtrace run` of `kernel` in 128 MiB with `options` (a trigger and a
/// limit), ending when tracing stops, the trace on `disk`.
fn linux_window(kernel: &Path, disk: &Path, options: &[&str]) -> std::process::Output {
    vtrace()
        .args([
            "run",
            "--no-input",
            "--memory",
            "128M",
            "--exit-after-trace",
        ])
        .args(options)
        .arg("--disk")
        .arg(disk)
        .arg("--kernel")
        .arg(kernel)
        .stdin(Stdio::null())
        .output()
        .expect("run vtrace")
}

/// Reads `output` line by line until one contains `needle`; returns that
/// line (`None` if the output ended or two minutes passed: a bound for a
/// loaded machine, not a performance target) and the lines before it.
fn wait_for_line(
    output: impl std::io::Read + Send + 'static,
    needle: &str,
) -> (Option<String>, Vec<String>) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let bound = Duration::from_secs(120);
    let started = Instant::now();
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(bound.saturating_sub(started.elapsed())) {
            Ok(line) if line.contains(needle) => return (Some(line), seen),
            Ok(line) => seen.push(line),
            Err(_) => return (None, seen),
        }
    }
}

/// Boots `kernel` untraced until it prints `line` (or two minutes pass);
/// returns that line, the console lines before it and what vtrace said.
fn boot_to(kernel: &Path, line: &str) -> (Option<String>, Vec<String>, std::process::Output) {
    let mut child = vtrace()
        .args(["run", "--no-input", "--memory", "128M", "--kernel"])
        .arg(kernel)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vtrace");
    // The banner comes through the early serial console a few million
    // instructions into the kernel: seconds here.
    let (found, seen) = wait_for_line(child.stdout.take().unwrap(), line);
    let _ = child.kill();
    (found, seen, child.wait_with_output().unwrap())
}

fn boot_to_banner(kernel: &Path) -> (Option<String>, Vec<String>, std::process::Output) {
    boot_to(kernel, "Linux version")
}

#[test]
fn unmodified_linux_prints_its_banner() {
    if !kvm_available() {
        return;
    }
    let kernel = test_kernel();
    let (banner, seen, out) = boot_to_banner(&kernel);
    let banner = banner.unwrap_or_else(|| {
        panic!(
            "no 'Linux version' banner from {}\nconsole:\n{}\nvtrace:\n{}",
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

/// The default command line hides from Linux every feature the baseline
/// CPU leaves out, where a host lets the CPU's own CPUID bits through
/// (this project's machines do, untraced): Linux names each one it clears,
/// so a name it does not know, or a list longer than it reads (127 bytes
/// in 6.1), shows. SSSE3 among them: Debian's 6.1 stopped after 7 minutes
/// here, in the SSSE3 BLAKE2s, at a `movd xmm15,ecx` KVM's emulator lacks.
#[test]
fn linux_clears_every_feature_the_default_line_names() {
    if !kvm_available() {
        return;
    }
    let kernel = test_kernel();
    let (cleared, seen, out) = boot_to(&kernel, "Clearing CPUID bits:");
    let cleared = cleared.unwrap_or_else(|| {
        panic!(
            "no 'Clearing CPUID bits' line\nconsole:\n{}\nvtrace:\n{}",
            seen.join("\n"),
            stderr(&out)
        )
    });
    let default = vtrace_vmm::default_linux_cmdline(vtrace_vmm::CpuProfile::Baseline, 1);
    let names = default
        .split_whitespace()
        .find_map(|w| w.strip_prefix("clearcpuid="))
        .unwrap();
    assert!(names.len() <= 127, "{names}");
    let said: Vec<&str> = cleared
        .split("Clearing CPUID bits:")
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    for name in names.split(',') {
        assert!(said.contains(&name), "{name} not cleared: {cleared}");
    }
    for name in ["ssse3", "sse4_1", "sse4_2", "pni"] {
        assert!(names.split(',').any(|n| n == name), "{name}: {names}");
    }
}

/// The test kernel with its payload compressed again with `kind`, as the
/// kernel's build does for CONFIG_KERNEL_XZ, _LZMA and _BZIP2: the new
/// payload (with the uncompressed size after it) is put at the end of the
/// file and the setup header's payload fields point at it.
fn recompressed_kernel(dir: &Path, kind: &str) -> PathBuf {
    use std::io::Write;
    let original = std::fs::read(test_kernel()).unwrap();
    let vmlinux =
        vtrace_image::bzimage::vmlinux_inside(&original).expect("the test kernel unpacks");
    let mut payload = match kind {
        "xz" => {
            let mut filters = xz2::stream::Filters::new();
            filters.x86();
            filters.lzma2(&xz2::stream::LzmaOptions::new_preset(0).unwrap());
            let stream =
                xz2::stream::Stream::new_stream_encoder(&filters, xz2::stream::Check::Crc32)
                    .unwrap();
            let mut e = xz2::write::XzEncoder::new_stream(Vec::new(), stream);
            e.write_all(&vmlinux).unwrap();
            e.finish().unwrap()
        }
        "bzip2" => {
            let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
            e.write_all(&vmlinux).unwrap();
            e.finish().unwrap()
        }
        other => panic!("{other}"),
    };
    payload.extend_from_slice(&(vmlinux.len() as u32).to_le_bytes());
    let setup_sects = match original[0x1f1] {
        0 => 4,
        n => usize::from(n),
    };
    let offset = (original.len() - (setup_sects + 1) * 512) as u32;
    let mut image = original;
    image[0x248..0x24c].copy_from_slice(&offset.to_le_bytes());
    image[0x24c..0x250].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    image.extend_from_slice(&payload);
    let path = dir.join(format!("bzImage-{kind}"));
    std::fs::write(&path, image).unwrap();
    path
}

#[test]
fn xz_and_bzip2_kernels_are_decompressed_on_the_host() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (kind, name) in [("xz", "XZ"), ("bzip2", "bzip2")] {
        let kernel = recompressed_kernel(dir.path(), kind);
        let (banner, seen, out) = boot_to_banner(&kernel);
        let log = stderr(&out);
        assert!(
            banner.is_some(),
            "{kind}: {}
{log}",
            seen.join("\n")
        );
        assert!(
            log.contains(&format!("{name} payload decompressed on the host")),
            "{kind}: {log}"
        );
    }
}

/// The routines called directly by the first `name() {` block of a nest
/// diagram, in order.
fn callees(nest: &str, name: &str) -> Vec<String> {
    let lines: Vec<&str> = nest.lines().collect();
    // The routine column, from the header line.
    let Some(col) = lines
        .iter()
        .find_map(|l| l.strip_prefix('#')?.find("routine"))
    else {
        return Vec::new();
    };
    let col = col + 1;
    let open = format!(" {name}() {{");
    let Some(at) = lines.iter().position(|l| l.trim_end().ends_with(&open)) else {
        return Vec::new();
    };
    let indent = |l: &str| l[col..].len() - l[col..].trim_start().len();
    let depth = indent(lines[at]);
    let mut out = Vec::new();
    for l in &lines[at + 1..] {
        if l.len() <= col || l.contains("==>") || l.contains("##") {
            continue;
        }
        let d = indent(l);
        if d <= depth {
            break;
        }
        if d == depth + 2 && !l.contains("} /*") {
            let routine = l[col..].trim_start();
            out.push(routine[..routine.find('(').unwrap_or(routine.len())].to_string());
        }
    }
    out
}

#[test]
fn a_linux_trace_names_kernel_routines_without_being_told() {
    if !kvm_available() {
        return;
    }
    let kernel = test_kernel();
    let dir = std::env::temp_dir().join(format!("vtrace-linux-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let disk = dir.join("linux.vtd");
    // The guest runs on after --max-steps (for minutes here, where kernel
    // code is emulated); the run is ended the way a user would end it,
    // once vtrace says the steps are on the disk. Every REP iteration is a
    // step, as on a CPU stepping with TF: clear_bss's `rep stosb` (memset
    // with ERMS) clears the Debian kernel's 5.7 MB BSS a byte a step, so
    // start_kernel begins about 5.8 M steps in.
    let mut child = vtrace()
        .args(["run", "--no-input", "--memory", "128M", "--trace"])
        .args(["--max-steps", "6000000", "--disk-size", "64M", "--disk"])
        .arg(&disk)
        .arg("--kernel")
        .arg(&kernel)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vtrace");
    let (stopped, seen) = wait_for_line(
        child.stderr.take().unwrap(),
        "tracing stopped by --max-steps",
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(stopped.is_some(), "no stop message:\n{}", seen.join("\n"));

    // With the hooks shown: the thunks' folding, not their hiding, is
    // what keeps them out of the diagram below.
    let out = run(&["analyze", "nest", "--show-hooks", disk.to_str().unwrap()]);
    let (nest, log) = (stdout(&out), stderr(&out));
    assert!(out.status.success(), "{log}");
    assert!(!log.contains("no symbols found"), "{log}");
    // The 64-bit boot protocol enters startup_64 (arch/x86/kernel/head_64.S)
    // at its physical address, before paging maps the kernel where its
    // symbols are: named through the image's load addresses.
    let first = nest.lines().find(|l| l.trim_end().ends_with("() {"));
    assert!(
        first.is_some_and(|l| l.trim_end().ends_with(" startup_64() {")),
        "{first:?}"
    );
    // arch/x86/kernel/head64.c and init/main.c: the boot CPU's C entry
    // clears BSS before start_kernel, whose first calls have been these
    // for a decade (debug_objects_early_init is empty in a distribution
    // kernel, init_vmlinux_build_id is 5.13 and later).
    let entry = callees(&nest, "x86_64_start_kernel");
    assert!(entry.iter().any(|c| c == "clear_bss"), "{entry:?}");
    let first = callees(&nest, "start_kernel");
    let at = |name: &str| first.iter().position(|c| c == name);
    let (magic, cpu_id, cgroup) = (
        at("set_task_stack_end_magic"),
        at("smp_setup_processor_id"),
        at("cgroup_init_early"),
    );
    assert!(
        magic.is_some() && magic < cpu_id && cpu_id < cgroup,
        "start_kernel's first callees: {first:?}"
    );
    // Return thunks and retpolines are folded into the routines around
    // them: none shows as a routine, and calls through them nest cleanly.
    assert!(!nest.contains("_return_thunk"), "a return thunk shows");
    assert!(!nest.contains("__x86_indirect_thunk"), "a retpoline shows");
    let divided = nest.matches("## divided level ##").count();
    assert!(divided < 5, "{divided} divided levels in 30000 steps");

    // verify_cpu (head_64.S) runs CPUID leaf 1 at CPL 0 in long mode,
    // where a KVM that emulates kernel code answers from the host CPU
    // (`vtrace doctor` lists the leaks): the trace holds what the vCPU's
    // baseline table gives, which hides MOVBE, POPCNT, AES, XSAVE and AVX.
    let reader = vtrace_storage::TraceReader::open(&disk).unwrap();
    let mut rax_before = 0u64;
    let mut leaf1 = 0;
    for record in reader.decode(0).unwrap() {
        if let vtrace_storage::Record::Step(s) = record {
            if s.bytes.as_slice() == [0x0f, 0xa2] && rax_before as u32 == 1 {
                leaf1 += 1;
                let ecx = s.regs.gpr[1];
                let hidden = (1 << 22) | (1 << 23) | (1 << 25) | (1 << 26) | (1 << 28);
                assert_eq!(ecx & hidden, 0, "CPUID leaf 1 ECX {ecx:#x} at {:#x}", s.pc);
            }
            rax_before = s.regs.gpr[0];
        }
    }
    assert!(leaf1 > 0, "no CPUID leaf 1 in the first segment");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tracing_starts_at_a_linux_routine_named_on_the_command_line() {
    if !kvm_available() {
        return;
    }
    let kernel = test_kernel();
    let dir = std::env::temp_dir().join(format!("vtrace-linux-at-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let disk = dir.join("at.vtd");
    // The name resolves through the kernel's own kallsyms, as the
    // analyzer finds it; the run ends with the trace.
    let out = linux_window(
        &kernel,
        &disk,
        &[
            "--start-at",
            "start_kernel",
            "--max-steps",
            "2000",
            "--disk-size",
            "16M",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listing = run(&["analyze", "listing", "--count", "1", disk.to_str().unwrap()]);
    let text = stdout(&listing);
    let first = text
        .lines()
        .find(|l| !l.trim_start().starts_with("--") && !l.starts_with('#'));
    assert!(
        first.is_some_and(|l| l.contains(" start_kernel ")),
        "{text}\n{}",
        stderr(&listing)
    );
    // `symbolize` names that pc the same from the trace and from the
    // kernel image given as --symbols (its kallsyms, recovered).
    let cols: Vec<&str> = first.unwrap().split_whitespace().collect();
    let at = cols.iter().position(|c| *c == "start_kernel").unwrap();
    let pc = cols[at - 1];
    let disk_arg = format!("--trace={}", disk.display());
    let image = format!("--symbols={}", kernel.display());
    for how in [
        vec![disk_arg.as_str()],
        vec![image.as_str(), "--no-kernel-symbols"],
    ] {
        let o = run(&[&["analyze", "symbolize"], &how[..], &[pc]].concat());
        assert!(o.status.success(), "{how:?}: {}", stderr(&o));
        assert_eq!(
            stdout(&o).split_whitespace().nth(1),
            Some("start_kernel"),
            "{how:?}: {}",
            stdout(&o)
        );
    }
    // Every routine of this kernel starts with `call __fentry__`
    // (ftrace's hook; a `ret` until tracing is on): the nest diagram hides
    // it unless asked.
    let nest = |extra: &[&str]| {
        let o = run(&[&["analyze", "nest", disk.to_str().unwrap()], extra].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let hooks = nest(&["--show-hooks"]);
    assert!(hooks.matches("__fentry__();").count() > 10, "{hooks}");
    let plain = nest(&[]);
    assert!(!plain.contains("__fentry__"), "{plain}");
    let routines = |text: &str| text.lines().filter(|l| l.contains("()")).count();
    assert_eq!(
        routines(&plain),
        routines(&hooks) - hooks.matches("__fentry__();").count()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each fire of `tp:sched:sched_switch` on `disk` (at the tracepoint's
/// NOP in `__schedule`, the guest's tracepoint off) names, as the event
/// record does, the task switched out (the one the export says runs at
/// the fire's step, the NOP) and the task switched in (the next one that
/// runs), by pid and comm. Fires past the last switch of the window are
/// not checked: their next task is not in it. The first switch, before
/// tracing starts in the `__switch_to` it leads to, fires through a
/// breakpoint: the boot's idle task (pid 0) switching to the first task
/// the trace shows.
fn sched_switch_names_the_tasks_switched(disk: &Path) {
    let export = run(&["analyze", "export", disk.to_str().unwrap(), "-o", "-"]);
    assert!(export.status.success(), "{}", stderr(&export));
    // (step, tid, comm, mnemonic) of every row.
    type Row = (u64, u64, String, String);
    let rows: Vec<Row> = stdout(&export)
        .lines()
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l).unwrap();
            let text = |key: &str| r[key].as_str().unwrap_or_default().to_string();
            let number = |key: &str| r[key].as_u64().unwrap();
            (
                number("step"),
                number("tid"),
                text("comm"),
                text("mnemonic"),
            )
        })
        .collect();
    let fires = probe_fires(disk);
    assert!(
        fires.len() >= 10,
        "a few switches in 300,000 steps: {fires:?}"
    );
    let (mut checked, mut untraced) = (0, 0);
    for f in &fires {
        assert_eq!(f["probe"], "tp:sched:sched_switch", "{f}");
        let value = |name: &str| fire_value(f, name);
        let at = rows.partition_point(|r| r.0 < f["step"].as_u64().unwrap());
        let (_, tid, comm, mnemonic) = &rows[at];
        if mnemonic != "nop" {
            assert_eq!((at, value("prev_pid")), (0, "0".to_string()), "{f}");
            assert_eq!(value("next_pid"), tid.to_string(), "{f}");
            untraced += 1;
            continue;
        }
        assert_eq!(value("prev_pid"), tid.to_string(), "{f}");
        assert_eq!(value("prev_comm"), format!("\"{comm}\""), "{f}");
        let Some((_, next, next_comm, _)) = rows[at..].iter().find(|r| r.1 != *tid) else {
            continue;
        };
        assert_eq!(value("next_pid"), next.to_string(), "{f}");
        assert_eq!(value("next_comm"), format!("\"{next_comm}\""), "{f}");
        checked += 1;
    }
    assert_eq!(untraced, 1, "{fires:?}");
    assert!(checked + 2 >= fires.len(), "{checked} of {}", fires.len());
}

/// The trace of a booting Linux names its tasks, read from the kernel's
/// own data (kallsyms and BTF; the guest is not changed). Traced from the
/// kernel's first task switch (`__switch_to`, reached about two minutes in
/// here, where kernel code is emulated), the window holds the start of
/// `rest_init` and `kernel_init` (init/main.c, kernel/kthread.c): the boot
/// CPU's idle task (pid 0, "swapper/0"), the init task it forked (pid 1,
/// still called "swapper/0" until it execs /init), kthreadd (pid 2, which
/// names itself) and the first kernel threads kthreadd creates for init,
/// named by their creator. Every fence in it is one step, with no gap.
/// The kernel's `sched:sched_switch` tracepoint, probed, names the same
/// tasks as they switch.
#[test]
fn a_linux_trace_names_its_tasks() {
    if !kvm_available() {
        return;
    }
    let kernel = test_kernel();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("tasks.vtd");
    let out = linux_window(
        &kernel,
        &disk,
        &[
            "--start-at",
            "__switch_to",
            "--max-steps",
            "300000",
            "--disk-size",
            "64M",
            "--probe",
            "tp:sched:sched_switch",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    sched_switch_names_the_tasks_switched(&disk);
    assert!(
        !stderr(&out).contains("tasks are not followed"),
        "{}",
        stderr(&out)
    );

    let o = run(&["analyze", "processes", "--json", disk.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = table["processes"].as_array().unwrap();
    let task = |tid: u64| {
        rows.iter()
            .find(|r| r["tid"] == tid)
            .unwrap_or_else(|| panic!("no task {tid}: {table}"))
    };
    assert_eq!(task(0)["comm"], "swapper/0", "{table}");
    assert_eq!(task(1)["comm"], "swapper/0", "{table}");
    assert_eq!(task(2)["comm"], "kthreadd", "{table}");
    // Kernel threads lead their own thread group; this host cannot step
    // user mode, and there is none yet.
    for r in rows {
        assert_eq!(r["pid"], r["tid"], "{r}");
        assert_eq!(r["user_steps"], 0, "{r}");
    }
    assert!(
        task(1)["switches_in"].as_u64() > Some(0) && task(2)["switches_in"].as_u64() > Some(0),
        "{table}"
    );
    // Tracing starts in the kernel, where the task is read at once: every
    // step belongs to a named task.
    let steps: u64 = rows
        .iter()
        .map(|r| r["kernel_steps"].as_u64().unwrap())
        .sum();
    assert_eq!(steps, 300_000, "{table}");
    assert!(rows.iter().all(|r| !r["tid"].is_null()), "{table}");
    // kthreadd's children are named by it or by whoever asked for them.
    let named: Vec<&str> = rows
        .iter()
        .filter(|r| r["tid"].as_u64() > Some(2))
        .map(|r| r["comm"].as_str().unwrap())
        .collect();
    assert!(
        !named.is_empty() && named.iter().all(|c| !c.is_empty()),
        "{table}"
    );

    // The scheduler's path runs LFENCE and MFENCE (speculation barriers,
    // ordering): each one step, and no gap anywhere. This host runs the
    // instruction after a fence in the same exit; every fence of this
    // window used to cost that instruction and a gap.
    let fences = records(&disk)
        .iter()
        .filter(|r| {
            matches!(r, vtrace_storage::Record::Step(s)
                if matches!(s.bytes.as_slice(), [0x0f, 0xae, 0xe8 | 0xf0 | 0xf8]))
        })
        .count();
    assert!(fences > 0, "no fence in the window");
    let info = info_json(&disk);
    assert_eq!(info["gaps"], 0, "{fences} fences: {info}");

    // The export's rows carry the task: as many per thread as the
    // per-task table counts, each with its thread group and a name.
    let export = run(&["analyze", "export", disk.to_str().unwrap(), "-o", "-"]);
    assert!(export.status.success(), "{}", stderr(&export));
    let mut per_tid: std::collections::BTreeMap<u64, u64> = Default::default();
    let mut per_name: std::collections::BTreeMap<(u64, String), u64> = Default::default();
    for line in stdout(&export).lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let tid = row["tid"]
            .as_u64()
            .unwrap_or_else(|| panic!("no task: {line}"));
        assert_eq!(row["pid"].as_u64(), Some(tid), "{line}");
        let comm = row["comm"].as_str().unwrap_or_default();
        assert!(!comm.is_empty(), "{line}");
        *per_tid.entry(tid).or_default() += 1;
        *per_name.entry((tid, comm.to_string())).or_default() += 1;
    }
    let counted: std::collections::BTreeMap<u64, u64> = rows
        .iter()
        .map(|r| {
            (
                r["tid"].as_u64().unwrap(),
                r["kernel_steps"].as_u64().unwrap(),
            )
        })
        .filter(|(_, steps)| *steps > 0)
        .collect();
    assert_eq!(per_tid, counted, "{table}");
    // The Parquet export's task columns are the JSON lines' (each built
    // its own way), as DuckDB reads them.
    let parquet = disk.with_extension("parquet");
    let (trace, out) = (disk.to_str().unwrap(), parquet.to_str().unwrap());
    let o = run(&["analyze", "export", trace, "-o", out]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mismatched = duckdb(&format!(
        "SELECT count(*) FROM '{out}' WHERE pid IS DISTINCT FROM tid"
    ));
    assert_eq!(mismatched[0][0], 0, "rows whose pid is not their tid");
    let counts = duckdb(&format!(
        "SELECT tid, comm, count(*) FROM '{out}' GROUP BY tid, comm"
    ));
    let per_name_parquet: std::collections::BTreeMap<(u64, String), u64> = counts
        .iter()
        .map(|r| {
            let comm = r[1].as_str().unwrap_or_else(|| panic!("no comm: {r:?}"));
            (
                (r[0].as_u64().unwrap(), comm.to_string()),
                r[2].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(per_name_parquet, per_name);

    // The listing says where the kernel switched.
    let trace = disk.to_str().unwrap();
    let listing = run(&["analyze", "listing", "--no-lines", trace]);
    let text = stdout(&listing);
    assert!(
        text.contains("-- task \"kthreadd\" pid 2"),
        "{}",
        stderr(&listing)
    );

    // Filtered to kthreadd, each analysis sees its steps and no others:
    // the listing's pid and comm columns, stats' step count, the nest
    // diagram's switches, the timeline's tracks.
    let kthreadd = task(2)["kernel_steps"].as_u64().unwrap();
    assert!(kthreadd > 0, "{table}");
    let listing = run(&["analyze", "listing", "--no-lines", "--pid", "2", trace]);
    assert!(listing.status.success(), "{}", stderr(&listing));
    let text = stdout(&listing);
    let steps: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|n| n.parse::<u64>().is_ok())
        })
        .collect();
    assert_eq!(steps.len() as u64, kthreadd);
    // Forked from the idle task, pid 2 is "swapper/0" until it names
    // itself: the columns give the name each step ran under.
    let mut renamed = false;
    for line in &steps {
        let columns: Vec<&str> = line.split_whitespace().take(3).collect();
        assert_eq!(columns[1], "2", "{line}");
        match columns[2] {
            "kthreadd" => renamed = true,
            "swapper/0" => assert!(!renamed, "named swapper/0 again: {line}"),
            other => panic!("pid 2 named {other}: {line}"),
        }
    }
    assert!(renamed);
    let by_pid = run(&["analyze", "stats", "--json", "--pid", "2", trace]);
    let stats: serde_json::Value = serde_json::from_slice(&by_pid.stdout).unwrap();
    assert_eq!(stats["steps"], kthreadd, "{}", stderr(&by_pid));
    assert_eq!(stats["tasks"], "pid 2");
    let by_name = run(&["analyze", "stats", "--json", "--comm", "kthreadd", trace]);
    let stats: serde_json::Value = serde_json::from_slice(&by_name.stdout).unwrap();
    // Its steps since it named itself, and those of the threads it forks,
    // which run as "kthreadd" until they are named.
    assert!(stats["steps"].as_u64() > Some(0), "{stats}");
    let nest = run(&["analyze", "nest", "--pid", "2", trace]);
    let text = stdout(&nest);
    assert!(text.contains("==> switch to kthreadd-2"), "{text}");
    assert!(!text.contains("==> switch to swapper"), "{text}");
    let none = run(&["analyze", "stats", "--pid", "4000000", trace]);
    assert!(none.status.success());
    assert!(
        stderr(&none).contains("no step of pid 4000000"),
        "{}",
        stderr(&none)
    );

    // The timeline: a Perfetto process per guest process, named, and the
    // run queue's length as a counter.
    let json = dir.path().join("timeline.json");
    let o = run(&["analyze", "timeline", trace, "-o", json.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let timeline: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let events = timeline["traceEvents"].as_array().unwrap();
    assert!(
        events.iter().any(|e| e["ph"] == "M"
            && e["name"] == "process_name"
            && e["pid"] == 2
            && e["args"]["name"] == "kthreadd"),
        "no kthreadd process"
    );
    assert!(
        events
            .iter()
            .any(|e| e["ph"] == "X" && e["pid"] == 2 && e["tid"] == 2),
        "no routine on kthreadd's track"
    );
    let counts: Vec<u64> = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "runnable tasks")
        .map(|e| e["args"]["runnable"].as_u64().unwrap())
        .collect();
    // Booting, the boot CPU's queue holds init and the kernel threads it
    // starts: at least the task switched to.
    assert!(
        !counts.is_empty() && counts.iter().all(|c| (1..1000).contains(c)),
        "{counts:?}"
    );

    // The flame graph's stacks start at the task's name.
    let svg = dir.path().join("flame.svg");
    let o = run(&["analyze", "flame", trace, "-o", svg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("<title>kthreadd ("), "no kthreadd frame");
}

/// `--start-at PROGRAM:ROUTINE` finds a user program in the initramfs the
/// run boots and its routine through the program's ELF symbols: the
/// address agrees with binutils' `nm`, and the trigger is bound to tasks
/// of the program's name. A position-independent program, a misspelt
/// routine and a missing program are refused before the trace disk is
/// made. (The breakpoint itself cannot fire in user mode on this host's
/// KVM, nor reach the VMM on the AMD-V test machine: the trigger's task
/// check is covered by the tracer's unit tests.)
#[test]
fn a_user_routine_is_found_through_the_programs_elf() {
    if !kvm_available() {
        return;
    }
    let kernel = test_kernel();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    let vtprog = static_program(dir.path(), "vtprog");
    std::fs::copy(&vtprog, root.join("bin/vtprog")).unwrap();
    let pie = build_program(dir.path(), "vtprog", "piprog", &["-pie", "-fPIE"]);
    std::fs::copy(&pie, root.join("bin/piprog")).unwrap();
    let cpio = dir.path().join("root.cpio");
    newc_archive(&root, &cpio);
    let nm = std::process::Command::new("nm")
        .arg(&vtprog)
        .output()
        .unwrap();
    let main = stdout(&nm)
        .lines()
        .find_map(|l| l.strip_suffix(" T main"))
        .and_then(|a| u64::from_str_radix(a, 16).ok())
        .unwrap_or_else(|| panic!("nm shows no main: {}", stdout(&nm)));

    let disk = dir.path().join("user.vtd");
    let mut child = vtrace()
        .args([
            "run",
            "--no-input",
            "--memory",
            "128M",
            "--disk-size",
            "16M",
        ])
        .args(["--start-at", "vtprog:main", "--disk"])
        .arg(&disk)
        .arg("--kernel")
        .arg(&kernel)
        .arg("--initrd")
        .arg(&cpio)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vtrace");
    let (note, seen) = wait_for_line(child.stderr.take().unwrap(), "--start-at vtprog:main is");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let note = note.unwrap_or_else(|| panic!("no note of the place: {}", seen.join("\n")));
    assert!(
        note.contains(&format!(" is {main:#x} in /bin/vtprog in ")),
        "{note} (nm: main at {main:#x})"
    );
    assert!(note.contains("fires in tasks named vtprog"), "{note}");
    assert_eq!(info_json(&disk)["steps"], 0, "nothing ran at main here");

    for (place, says) in [
        ("piprog:main", "position-independent"),
        ("vtprog:no_such_routine", "no routine no_such_routine"),
        ("nosuch:main", "no program nosuch"),
    ] {
        let refused = dir.path().join("refused.vtd");
        let out = run(&[
            "run",
            "--no-input",
            "--kernel",
            kernel.to_str().unwrap(),
            "--initrd",
            cpio.to_str().unwrap(),
            "--start-at",
            place,
            "--disk",
            refused.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2), "{place}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{place}: {}", stderr(&out));
        assert!(!refused.exists(), "{place}: a disk was made");
    }
}

/// `--append` adds to the default command line (which keeps Linux off
/// what vtrace and the baseline CPU lack), `--cmdline` replaces it, and
/// the trace records the line the kernel booted with. Before, `--append`
/// replaced the defaults in silence, and the run failed later.
#[test]
fn append_adds_to_the_default_command_line_and_cmdline_replaces_it() {
    if !kvm_available() {
        return;
    }
    let kernel = test_kernel();
    let dir = tempfile::tempdir().unwrap();
    let booted = |name: &str, extra: &[&str]| {
        let disk = dir.path().join(name);
        let mut args = vec![
            "run",
            "--no-input",
            "-q",
            "--kernel",
            kernel.to_str().unwrap(),
            "--trace",
            "--max-steps",
            "10",
            "--exit-after-trace",
            "--disk-size",
            "8M",
            "--disk",
            disk.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = run(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let metadata = info_json(&disk)["metadata"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        metadata
            .lines()
            .find_map(|l| l.strip_prefix("cmdline: "))
            .unwrap_or_default()
            .to_string()
    };
    let default = vtrace_vmm::default_linux_cmdline(vtrace_vmm::CpuProfile::Baseline, 1);
    assert_eq!(booted("default.vtd", &[]), default);
    assert_eq!(
        booted("append.vtd", &["--append", "quiet vtrace.test=1"]),
        format!("{default} quiet vtrace.test=1")
    );
    assert_eq!(
        booted(
            "cmdline.vtd",
            &["--cmdline", "console=ttyS0 panic=1", "--append", "quiet"]
        ),
        "console=ttyS0 panic=1 quiet"
    );
}

/// An initrd the kernel cannot take (2000 MiB where Linux takes one below
/// 2 GiB, less its own size: more memory would not move that limit) is
/// refused with its own status and the limit, before any of it is read:
/// the VMM's peak memory stays far below the initrd's size (before, all
/// 2 GB were read into the VMM first).
#[test]
fn an_initrd_past_the_kernels_limit_is_refused_before_it_is_read() {
    if !kvm_available() {
        return;
    }
    let kernel = test_kernel();
    let dir = tempfile::tempdir().unwrap();
    let initrd = dir.path().join("huge.cpio");
    // Sparse: its size costs the test no disk.
    std::fs::File::create(&initrd)
        .unwrap()
        .set_len(2000 << 20)
        .unwrap();
    let (status, err, peak_mib) = run_measuring_memory(&[
        "run".as_ref(),
        "--no-input".as_ref(),
        "-q".as_ref(),
        "--memory".as_ref(),
        "5G".as_ref(),
        "--kernel".as_ref(),
        kernel.as_os_str(),
        "--initrd".as_ref(),
        initrd.as_os_str(),
    ]);
    assert_eq!(status.code(), Some(78), "{err}");
    assert!(
        err.contains("the initrd (2097152000 bytes) does not fit"),
        "{err}"
    );
    assert!(err.contains("whatever --memory is"), "{err}");
    assert!(
        peak_mib < 1000,
        "the VMM reached {peak_mib} MiB refusing a 2000 MiB initrd"
    );
    eprintln!("peak resident set {peak_mib} MiB");
}
