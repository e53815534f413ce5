//! Helpers shared by the end-to-end tests: they run the real `vtrace`
//! binary on real guests under KVM.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `vtrace` binary cargo built for these tests.
pub fn vtrace() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vtrace"))
}

/// Whether this host can run the KVM tests. Without a usable /dev/kvm the
/// tests fail with the reason, unless VTRACE_SKIP_KVM_TESTS=1 says to skip.
pub fn kvm_available() -> bool {
    let usable = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm");
    match usable {
        Ok(_) => true,
        Err(e) if std::env::var("VTRACE_SKIP_KVM_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping: /dev/kvm is not usable ({e}) and VTRACE_SKIP_KVM_TESTS=1");
            false
        }
        Err(e) => panic!(
            "/dev/kvm is not usable ({e}); these tests need KVM. \
             Set VTRACE_SKIP_KVM_TESTS=1 to skip them on a host without it."
        ),
    }
}

/// Runs the demo OS onto the trace disk `dir/name` (64 MiB) with `extra`:
/// the disk and the run's output.
pub fn trace_demo(dir: &Path, name: &str, extra: &[&str]) -> (PathBuf, std::process::Output) {
    let disk = dir.join(name);
    let mut args = vec![
        "run",
        "--no-input",
        "--disk",
        disk.to_str().unwrap(),
        "--disk-size",
        "64M",
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    (disk, out)
}

/// Starts `vtrace run` with `args` and `--control SOCK`, stdout
/// discarded, stderr piped; returns once the control socket is there.
pub fn spawn_with_control(args: &[&OsStr], sock: &Path) -> std::process::Child {
    let child = vtrace()
        .arg("run")
        .args(args)
        .arg("--control")
        .arg(sock)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !sock.exists() {
        assert!(started.elapsed().as_secs() < 30, "no control socket");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child
}

/// Whether the second engine's library is there (`scripts/engine.sh`,
/// which the test script runs): without it a test of the engine says so
/// and passes, except under CI, where the library must be there. The test
/// machines get it too where it is (`scripts/lib/machine.sh`).
pub fn engine_available() -> bool {
    match vtrace_bochs::Library::find() {
        Ok(_) => true,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: {e}");
            false
        }
        Err(e) => panic!("{e}"),
    }
}

/// The address of the demo OS's symbol `name`, from its ELF.
pub fn demo_symbol(name: &str) -> u64 {
    use object::{Object, ObjectSymbol};
    let elf = object::File::parse(vtrace_demo::DEMO_OS_ELF).unwrap();
    elf.symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("demo OS has no symbol {name}"))
        .address()
}

/// Writes `bytes` to a fresh file in `dir` and returns its path.
pub fn write_guest(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write test guest");
    path
}

/// Runs vtrace with `args`, no stdin, stdout discarded; returns how it
/// ended, its stderr and its peak resident set in MiB (from wait4: std's
/// wait gives none).
pub fn run_measuring_memory(args: &[&OsStr]) -> (std::process::ExitStatus, String, i64) {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    // Reaped by wait4 below, which std's Child does not know of.
    #[allow(clippy::zombie_processes)]
    let mut child = vtrace()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vtrace");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut err).expect("read stderr");
    }
    let mut status = 0;
    // SAFETY: rusage is plain data; the child is ours and not yet waited.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    // SAFETY: the pointers are to locals that outlive the call.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4");
    (
        std::process::ExitStatus::from_raw(status),
        err,
        usage.ru_maxrss / 1024,
    )
}

/// Runs vtrace with `args` and no stdin; returns its output.
pub fn run(args: &[&str]) -> Output {
    vtrace()
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("start vtrace")
}

/// Waits for `child` to end, at most `limit`: a hang guard, not a speed
/// check. One still running then is killed and the test fails.
pub fn ended_within(
    child: &mut std::process::Child,
    limit: std::time::Duration,
) -> std::process::ExitStatus {
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait for vtrace") {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("vtrace still ran after {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Every record of a trace, in order; panics on a damaged segment.
pub fn records(path: &Path) -> Vec<vtrace_storage::Record> {
    let reader = vtrace_storage::TraceReader::open(path).expect("open trace");
    (0..reader.segments().len())
        .flat_map(|i| reader.decode(i).expect("segment decodes"))
        .collect()
}

/// `vtrace info --json` of a trace.
pub fn info_json(path: &Path) -> serde_json::Value {
    let out = run(&["info", "--json", path.to_str().unwrap()]);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)))
}

/// Each probe fire of a trace (`vtrace analyze probes --fires --json`):
/// step, probe, args and the typed values as `[name, text]` pairs.
pub fn probe_fires(trace: &Path) -> Vec<serde_json::Value> {
    let out = run(&[
        "analyze",
        "probes",
        "--fires",
        "--json",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["fires"].as_array().cloned().unwrap_or_default()
}

/// A fire's typed value `name`, as text.
pub fn fire_value(fire: &serde_json::Value, name: &str) -> String {
    let values = fire["values"]
        .as_array()
        .unwrap_or_else(|| panic!("{fire}"));
    let found = values.iter().find(|p| p[0] == name);
    found.unwrap_or_else(|| panic!("no {name}: {fire}"))[1]
        .as_str()
        .unwrap_or_else(|| panic!("{fire}"))
        .to_string()
}

/// Runs Python `script` with `args` and returns its output (its packages are
/// those scripts/test.sh installs: DuckDB, pyarrow); `what` names it if it
/// fails.
pub fn python(script: &str, args: &[&str], what: &str) -> std::process::Output {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{what} (Python packages scripts/test.sh installs) failed: {}",
        stderr(&out)
    );
    out
}

/// The rows of a DuckDB query, as JSON (DuckDB is the Python package
/// scripts/test.sh installs: what a user's own data tools see). Its
/// progress bar, which a query of a few seconds draws on standard output,
/// is off.
pub fn duckdb(sql: &str) -> Vec<Vec<serde_json::Value>> {
    const SCRIPT: &str = "import duckdb, json, sys\n\
        duckdb.sql('SET enable_progress_bar = false')\n\
        rows = duckdb.sql(sys.argv[1]).fetchall()\n\
        print(json.dumps(rows, default=str))\n";
    let out = python(SCRIPT, &[sql], &format!("DuckDB on {sql}"));
    serde_json::from_slice(&out.stdout).expect("JSON rows")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The number before `label` in `text` ("154 timer interrupts").
pub fn number_before(text: &str, label: &str) -> Option<u64> {
    let at = text.find(label)?;
    text[..at].split_whitespace().last()?.parse().ok()
}

/// The number after `label` in `text` ("timer ticks: 154").
pub fn number_after(text: &str, label: &str) -> Option<u64> {
    let at = text.find(label)? + label.len();
    let digits: String = text[at..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    digits.split('.').next()?.parse().ok()
}

/// The run's closing summary in its log ("guest exited with status 0
/// after 1.2 s (virtual time 0.024 s): 6 timer interrupts, ..."): the
/// last line with a virtual time, past the progress lines a slow run
/// prints before it.
pub fn run_summary(log: &str) -> &str {
    log.lines()
        .rev()
        .find(|l| l.contains("virtual time"))
        .unwrap_or_default()
}

/// Virtual seconds from the run summary ("virtual time 1.064 s").
pub fn virtual_seconds(text: &str) -> Option<f64> {
    let at = text.find("virtual time ")? + "virtual time ".len();
    text[at..].split_whitespace().next()?.parse().ok()
}

pub mod amdv;
pub mod gdb;
pub mod linux;
pub mod machine;
pub mod vtx;

/// The Linux kernel the tests boot: VTRACE_TEST_KERNEL, else Debian's
/// cloud kernel in /boot (`scripts/test.sh` installs it), else another.
pub fn test_kernel() -> PathBuf {
    if let Some(path) = std::env::var_os("VTRACE_TEST_KERNEL") {
        return PathBuf::from(path);
    }
    let mut kernels: Vec<PathBuf> = std::fs::read_dir("/boot")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    kernels.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("vmlinuz-"))
    });
    // Debian's cloud kernel first: it is the one the test script installs.
    kernels.sort_by_key(|p| !p.to_string_lossy().contains("cloud"));
    kernels.into_iter().next().unwrap_or_else(|| {
        panic!(
            "no Linux kernel in /boot: run scripts/test.sh (it installs \
             linux-image-cloud-amd64), or set VTRACE_TEST_KERNEL"
        )
    })
}

/// Builds tests/programs/NAME.c into a static program in `dir`, with
/// symbols and lines.
pub fn static_program(dir: &Path, name: &str) -> PathBuf {
    build_program(dir, name, name, &["-static"])
}

/// Builds tests/programs/NAME.c with gcc, linked as `link` says, with
/// symbols and lines, into `dir/out`.
pub fn build_program(dir: &Path, name: &str, out: &str, link: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(format!("{name}.c"));
    let out = dir.join(out);
    let o = Command::new("gcc")
        .args(link)
        .args(["-O1", "-g", "-o"])
        .arg(&out)
        .arg(&src)
        .output()
        .expect("gcc");
    assert!(o.status.success(), "gcc {name}: {}", stderr(&o));
    out
}

/// Packs the tree at `root` into the newc cpio archive `out` (an
/// initramfs), with the system's `cpio`.
pub fn newc_archive(root: &Path, out: &Path) {
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd {} && find . | cpio -o -H newc --quiet > {}",
            root.display(),
            out.display()
        ))
        .output()
        .expect("sh");
    assert!(o.status.success(), "cpio: {}", stderr(&o));
}

/// One traced run of the demo OS (`--trace`, a 64 MiB disk), made once
/// per test binary and shared by its tests.
pub fn demo_trace() -> &'static Path {
    static TRACE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    TRACE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir").keep();
        let disk = dir.join("demo.vtd");
        let out = run(&[
            "run",
            "--no-input",
            "--trace",
            "--disk",
            disk.to_str().unwrap(),
            "--disk-size",
            "64M",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        disk
    })
}

/// The linear addresses of straight-line real-mode code loaded at `load`,
/// one per instruction up to and including the first `in eax, dx` (the
/// test guests' EXIT hypercall): what a faithful trace of such a guest
/// steps through, derived from its bytes alone.
pub fn straight_line_pcs(image: &[u8], load: u64) -> Vec<u64> {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};
    let mut decoder = Decoder::with_ip(16, image, load, DecoderOptions::NONE);
    let mut pcs = Vec::new();
    for insn in &mut decoder {
        assert!(!insn.is_invalid(), "undecodable byte at {:#x}", insn.ip());
        pcs.push(insn.ip());
        if insn.mnemonic() == Mnemonic::In {
            return pcs;
        }
    }
    panic!("the image has no IN: not a straight-line test guest")
}

/// Checks a trace of [`vtrace_demo::test_guests::FENCES`] step by step:
/// every instruction once, in order, no gap, and each `inc esi` after its
/// fence with the count so far.
pub fn assert_fences_traced_whole(trace: &Path) {
    use vtrace_storage::Record;
    let expected = straight_line_pcs(vtrace_demo::test_guests::FENCES, 0x7c00);
    let recs = records(trace);
    assert_no_gap(&recs);
    let steps: Vec<_> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some(s),
            Record::Event(_) => None,
        })
        .collect();
    let pcs: Vec<u64> = steps.iter().map(|s| s.pc).collect();
    assert_eq!(pcs, expected, "each instruction once, in order");
    let marks: Vec<u64> = steps
        .iter()
        .filter(|s| s.bytes.as_slice() == [0x66, 0x46])
        .map(|s| s.regs.gpr[6])
        .collect();
    let counted: Vec<u64> = (1..=vtrace_demo::test_guests::FENCES_MARKS).collect();
    assert_eq!(marks, counted, "ESI after each inc esi");
}

/// The address of `name` in a test guest's ELF.
pub fn guest_symbol(elf: &[u8], name: &str) -> u64 {
    use object::{Object, ObjectSymbol};
    let file = object::File::parse(elf).expect("a test guest's ELF");
    let symbol = file.symbols().find(|s| s.name() == Ok(name));
    symbol
        .unwrap_or_else(|| panic!("no {name} in the guest"))
        .address()
}

/// Checks a trace of a PVH test guest that leaves its straight line once,
/// for `label`: by SYSENTER (`vector` None) or by an exception of
/// `vector`. No gap; right after the SYSENTER's step (or the exception's
/// event, the faulting instruction never completing) comes the label's
/// first instruction, and the guest's EXIT hypercall is the last step.
pub fn assert_jumps_to(trace: &Path, elf: &[u8], label: &str, vector: Option<u8>) {
    use vtrace_storage::{Event, Record};
    let recs = records(trace);
    assert_no_gap(&recs);
    let jump = recs.iter().position(|r| match (r, vector) {
        (Record::Step(s), None) => s.bytes.as_slice() == [0x0f, 0x34],
        (Record::Event(Event::Interrupt { vector: v, .. }), Some(want)) => *v == want,
        _ => false,
    });
    let jump = jump.unwrap_or_else(|| panic!("no jump ({vector:?}) in {recs:?}"));
    let target = guest_symbol(elf, label);
    assert!(
        matches!(recs.get(jump + 1), Some(Record::Step(s)) if s.pc == target),
        "{label} ({target:#x}) after {:?}: {:?}",
        recs[jump],
        recs.get(jump + 1)
    );
    let last = recs.iter().rev().find_map(|r| match r {
        Record::Step(s) => Some(s.bytes.as_slice()),
        Record::Event(_) => None,
    });
    assert_eq!(last, Some(&[0xed][..]), "the EXIT hypercall ends it");
}

/// A PVH test guest that leaves its straight line once (see
/// [`assert_jumps_to`]): its image, its file name, its exit status, the
/// label it jumps to, and the exception that takes it there (None:
/// SYSENTER).
pub type JumpingGuest = (&'static [u8], &'static str, i32, &'static str, Option<u8>);

/// SYSENTER; a #GP that KVM raises (RDMSR of an MSR it lacks); a #UD the
/// CPU raises. The last two load their IDT after tracing starts.
pub const JUMPING_GUESTS: [JumpingGuest; 3] = {
    use vtrace_demo::test_guests::*;
    [
        (SYSENTER, "sysenter.elf", SYSENTER_STATUS, "entered", None),
        (
            MSR_FAULT,
            "msr-fault.elf",
            MSR_FAULT_STATUS,
            "gp_handler",
            Some(13),
        ),
        (
            EXCEPTION,
            "exception.elf",
            EXCEPTION_STATUS,
            "ud_handler",
            Some(6),
        ),
    ]
};

/// Options that trace a test guest from its first instruction to its
/// exit (no autostop at its exception).
pub const JUMPING_GUEST_RUN: &str = "run --no-input -q --trace --autostop none --disk-size 8M";

/// Shell for a test machine that traces `guests` (copied in under their
/// file names) into /out/NAME.vtd and says "NAME status N" for each.
pub fn jumping_guests_there(guests: &[JumpingGuest]) -> String {
    guests
        .iter()
        .map(|(_, name, ..)| {
            format!(
                "vtrace {JUMPING_GUEST_RUN} --kernel {name} --disk /out/{name}.vtd \
                 > /out/{name}.txt 2>&1; echo \"{name} status $?\"; "
            )
        })
        .collect()
}

/// Checks what [`jumping_guests_there`] ran in machine output `output`,
/// the traces found by `file`.
pub fn assert_jumping_guests(
    guests: &[JumpingGuest],
    output: &str,
    file: impl Fn(&str) -> PathBuf,
) {
    for (image, name, status, label, vector) in guests {
        assert!(
            output.contains(&format!("{name} status {status}")),
            "{name}: {output}"
        );
        assert_jumps_to(&file(&format!("{name}.vtd")), image, label, *vector);
    }
}

/// Checks that a trace's records hold no gap.
pub fn assert_no_gap(recs: &[vtrace_storage::Record]) {
    use vtrace_storage::{Event, Record};
    let gaps: Vec<_> = recs
        .iter()
        .filter(|r| matches!(r, Record::Event(Event::Gap { .. })))
        .collect();
    assert!(gaps.is_empty(), "{gaps:?}");
}

/// Checks a trace of [`vtrace_demo::test_guests::MMIO`]: no gap, each of
/// its 100 MOV stores one step with its MMIO event right after it and the
/// `inc eax` after that, and the REP STOSB 100 steps with 100 events.
pub fn assert_mmio_stores_stepped(trace: &Path) {
    use vtrace_storage::{Event, Record};
    let recs = records(trace);
    assert_no_gap(&recs);
    let mut stores = 0;
    for (i, r) in recs.iter().enumerate() {
        let Record::Step(s) = r else { continue };
        if s.bytes.as_slice() != [0x88, 0x07] {
            continue;
        }
        stores += 1;
        assert!(
            matches!(
                recs.get(i + 1),
                Some(Record::Event(Event::Mmio { write: true, .. }))
            ),
            "the store's event right after it: {:?}",
            recs.get(i + 1)
        );
        assert!(
            matches!(recs.get(i + 2), Some(Record::Step(inc)) if inc.bytes.as_slice() == [0x40]),
            "then the inc: {:?}",
            recs.get(i + 2)
        );
    }
    assert_eq!(stores, 100);
    // Each REP STOSB iteration a step, its store's event right after it
    // (the byte before where the step left EDI), as on a host that traps
    // every iteration: not all steps first, all events held till the end.
    let mut rep = 0;
    for (i, r) in recs.iter().enumerate() {
        let Record::Step(s) = r else { continue };
        if s.bytes.as_slice() != [0xf3, 0xaa] {
            continue;
        }
        rep += 1;
        let stored = s.regs.gpr[7].wrapping_sub(1);
        assert!(
            matches!(
                recs.get(i + 1),
                Some(Record::Event(Event::Mmio { write: true, addr, .. })) if *addr == stored
            ),
            "iteration {rep}'s store at {stored:#x} right after it: {:?}",
            recs.get(i + 1)
        );
    }
    assert_eq!(rep, 100, "one step per REP STOSB iteration");
    let events = recs
        .iter()
        .filter(|r| matches!(r, Record::Event(Event::Mmio { .. })))
        .count();
    assert_eq!(events, 200);
}

/// The options that trace [`vtrace_demo::test_guests::MMIO`] (given as
/// `mmio.elf`) into DISK: the same here and in the test machines.
pub fn mmio_run(guest: &str, disk: &str) -> String {
    format!("run --no-input -q --trace --disk-size 8M --kernel {guest} --disk {disk}")
}

/// Writes [`vtrace_demo::test_guests::MMIO`] into `dir` and traces it here
/// with [`mmio_run`]: the guest's path (for a test machine) and its trace.
pub fn mmio_traced_here(dir: &Path) -> (PathBuf, PathBuf) {
    let guest = write_guest(dir, "mmio.elf", vtrace_demo::test_guests::MMIO);
    let trace = dir.join("mmio.vtd");
    let args = mmio_run(guest.to_str().unwrap(), trace.to_str().unwrap());
    let out = run(&args.split_whitespace().collect::<Vec<_>>());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    (guest, trace)
}

/// A gdb session over the demo OS: a breakpoint at `schedule`, its
/// caller, a global, a single step, a watchpoint on `context_switches`
/// (where the run is traced, it stops the guest twice, the pc printed
/// after each; untraced, gdb cannot insert it); then on to the guest's end.
pub fn demo_gdb_commands(traced: bool) -> Vec<&'static str> {
    let mut commands = vec![
        "break schedule",
        "continue",
        "bt",
        "p ntasks",
        "p/x $pc",
        "stepi",
        "p/x $pc",
    ];
    commands.extend(["delete", "watch context_switches", "continue"]);
    if traced {
        commands.extend(["p/x $pc", "continue", "p/x $pc"]);
    }
    commands.extend(["delete", "continue"]);
    commands
}

/// The rows of `trace`'s JSON-lines export, one value each.
pub fn export_rows(trace: &Path) -> Vec<serde_json::Value> {
    let out = run(&[
        "analyze",
        "export",
        trace.to_str().unwrap(),
        "-q",
        "-o",
        "-",
        "--format",
        "jsonl",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A list of numbers in an export row (`writes`, `write_sizes`...).
pub fn row_numbers(row: &serde_json::Value, key: &str) -> Vec<u64> {
    row[key]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
        .unwrap_or_default()
}

/// The pcs of the steps right after the first `n` stores to the 8 bytes
/// at `addr` that follow the first step at `from` in `trace` (from its
/// export): where a watchpoint on them stops the guest.
pub fn pcs_after_stores(trace: &Path, from: u64, addr: u64, n: usize) -> Vec<u64> {
    let mut rows = export_rows(trace).into_iter().map(|row| {
        let stores = row_numbers(&row, "writes")
            .into_iter()
            .zip(row_numbers(&row, "write_sizes"))
            .any(|(a, s)| a < addr + 8 && a + s > addr);
        (row["pc"].as_u64().unwrap(), stores)
    });
    rows.by_ref().find(|r| r.0 == from).expect("the pc runs");
    let mut pcs = Vec::new();
    let mut stored = false;
    for (pc, stores) in rows {
        if stored {
            pcs.push(pc);
            if pcs.len() == n {
                break;
            }
        }
        stored = stores;
    }
    pcs
}

/// Checks the watchpoint of [`demo_gdb_commands`]: gdb stopped after two
/// stores to `context_switches`, each adding one (sched.c's `switch_to`),
/// right after the first two stores after the first call of `schedule`:
/// at the pcs of the next steps in this host's trace of the demo.
pub fn assert_gdb_watched_the_demo(said: &str) {
    assert!(
        said.contains("Hardware watchpoint 2: context_switches"),
        "{said}"
    );
    let values = |label: &str| -> Vec<u64> {
        said.lines()
            .filter_map(|l| l.strip_prefix(label)?.trim().parse().ok())
            .collect()
    };
    let (old, new) = (values("Old value = "), values("New value = "));
    assert_eq!(old.len(), 2, "{said}");
    assert_eq!(new.len(), 2, "{said}");
    for (o, n) in old.iter().zip(&new) {
        assert_eq!(o + 1, *n, "one more context switch\n{said}");
    }
    assert_eq!(new[0], old[1], "the second stop is the next store\n{said}");
    let pc = |n: &str| {
        said.lines()
            .find_map(|l| l.strip_prefix(&format!("${n} = 0x")))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
            .unwrap_or_else(|| panic!("${n} printed\n{said}"))
    };
    let after_stores = pcs_after_stores(
        demo_trace(),
        demo_symbol("schedule"),
        demo_symbol("context_switches"),
        2,
    );
    assert_eq!([pc("4"), pc("5")].as_slice(), after_stores, "{said}");
}

/// The demo OS commands gdb ran in the gdb tests (`break schedule`,
/// `continue`, `bt`, `p ntasks`, `p/x $pc`, `stepi`, `p/x $pc`, `delete`,
/// `continue`), checked in what it printed: the breakpoint hit, the
/// interrupt entry as the caller, the global, one instruction stepped, the
/// guest's clean end.
pub fn assert_gdb_debugged_the_demo(said: &str) {
    let schedule = demo_symbol("schedule");
    assert!(said.contains("Breakpoint 1, schedule"), "{said}");
    assert!(
        said.contains("in isr_common"),
        "bt names the interrupt entry\n{said}"
    );
    // main.c creates three tasks before the first timer interrupt.
    assert!(said.contains("$1 = 3"), "ntasks\n{said}");
    assert!(said.contains(&format!("$2 = {schedule:#x}")), "{said}");
    let stepped = said
        .lines()
        .find_map(|l| l.strip_prefix("$3 = 0x"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .expect("the pc after stepi");
    assert!(
        stepped > schedule && stepped < schedule + 16,
        "one instruction on from {schedule:#x}: {stepped:#x}\n{said}"
    );
    assert!(
        said.contains("[Inferior 1 (process 1) exited normally]"),
        "{said}"
    );
}
