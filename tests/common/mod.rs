//! Helpers shared by the end-to-end tests: they run the real `vtrace`
//! binary on real guests under KVM.
#![allow(dead_code)]

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

/// Runs vtrace with `args` and no stdin; returns its output.
pub fn run(args: &[&str]) -> Output {
    vtrace()
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("start vtrace")
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

/// Virtual seconds from the run summary ("virtual time 1.064 s").
pub fn virtual_seconds(text: &str) -> Option<f64> {
    let at = text.find("virtual time ")? + "virtual time ".len();
    text[at..].split_whitespace().next()?.parse().ok()
}

pub mod amdv;
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
    use vtrace_storage::{Event, Record};
    let expected = straight_line_pcs(vtrace_demo::test_guests::FENCES, 0x7c00);
    let recs = records(trace);
    let gaps: Vec<_> = recs
        .iter()
        .filter(|r| matches!(r, Record::Event(Event::Gap { .. })))
        .collect();
    assert!(gaps.is_empty(), "{gaps:?}");
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
