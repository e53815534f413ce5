//! Every error a user can meet in `vtrace run`, each with a real bad input,
//! its message and its exit status.

mod common;

use common::*;

#[test]
fn missing_kvm_device() {
    let out = run(&["run", "--no-input", "--kvm-device", "/nonexistent/kvm"]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    let log = stderr(&out);
    assert!(log.contains("cannot open /nonexistent/kvm"), "{log}");
    assert!(log.contains("has no KVM"), "advice: {log}");
}

#[test]
fn kvm_device_that_is_not_kvm() {
    let dir = tempfile::tempdir().unwrap();
    let fake = write_guest(dir.path(), "kvm", b"");
    let out = run(&["run", "--no-input", "--kvm-device", fake.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
}

#[test]
fn no_permission_for_kvm() {
    if !kvm_available() {
        return;
    }
    // Run as "nobody" where we are root; otherwise we already lack access or
    // have it through a group, and this case is the one a user sees.
    let is_root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    assert!(is_root, "this test drops from root to nobody with setpriv");
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_vtrace"))
        .args(["run", "--no-input"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("setpriv (util-linux) runs");
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(77), "{log}");
    assert!(log.contains("Permission denied"), "{log}");
    assert!(log.contains("kvm"), "advice names the group: {log}");
}

#[test]
fn kernel_file_missing_or_unreadable() {
    let out = run(&["run", "--no-input", "--kernel", "/nonexistent/bzImage"]);
    assert_eq!(out.status.code(), Some(66), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot read kernel /nonexistent/bzImage"),
        "{}",
        stderr(&out)
    );

    let dir = tempfile::tempdir().unwrap();
    let out = run(&[
        "run",
        "--no-input",
        "--kernel",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(66), "a directory: {}", stderr(&out));

    let kernel = write_guest(dir.path(), "k", vtrace_demo::DEMO_OS_ELF);
    let out = run(&[
        "run",
        "--no-input",
        "--kernel",
        kernel.to_str().unwrap(),
        "--initrd",
        "/nonexistent/initrd",
    ]);
    assert_eq!(out.status.code(), Some(66), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot read initrd"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn kernel_in_no_known_format() {
    let dir = tempfile::tempdir().unwrap();
    let junk = write_guest(dir.path(), "junk", &[0x5au8; 4096]);
    let out = run(&["run", "--no-input", "--kernel", junk.to_str().unwrap()]);
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(65), "{log}");
    assert!(log.contains("is not a kernel vtrace can boot"), "{log}");
    assert!(log.contains("--real-mode"), "advice: {log}");

    // A truncated bzImage: real header magic, nothing behind it.
    let mut bz = vec![0u8; 0x300];
    bz[0x1f1] = 4;
    bz[0x202..0x206].copy_from_slice(b"HdrS");
    bz[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
    bz[0x236..0x238].copy_from_slice(&1u16.to_le_bytes());
    bz[0x248..0x24c].copy_from_slice(&0x100u32.to_le_bytes());
    bz[0x24c..0x250].copy_from_slice(&0x1000u32.to_le_bytes());
    let bz = write_guest(dir.path(), "bz", &bz);
    let out = run(&["run", "--no-input", "--kernel", bz.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(65), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("payload lies outside the file"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn memory_too_small_for_the_image() {
    if !kvm_available() {
        return;
    }
    let out = run(&["run", "--no-input", "--memory", "1M"]);
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{log}");
    assert!(log.contains("too small"), "{log}");
    assert!(log.contains("demo OS (loads at 0x100000"), "{log}");
    assert!(log.contains("--memory"), "advice: {log}");

    let out = run(&["run", "--no-input", "--memory", "lots"]);
    assert_eq!(out.status.code(), Some(2), "bad syntax is a usage error");
}

#[test]
fn guest_triple_fault_is_reported_with_registers() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let guest = write_guest(dir.path(), "tf.elf", vtrace_demo::test_guests::TRIPLE_FAULT);
    let out = run(&["run", "--no-input", "--kernel", guest.to_str().unwrap()]);
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(80), "{log}");
    assert!(log.contains("shut down (triple fault)"), "{log}");
    assert!(log.contains("(ud2)"), "the faulting instruction: {log}");
    // RIP named from the guest's own symbol table: `start` plus the
    // distance the report's RIP is from it.
    let rip = log
        .split("CS:RIP 0008:")
        .nth(1)
        .and_then(|t| u64::from_str_radix(&t[..16], 16).ok())
        .unwrap_or_else(|| panic!("no RIP: {log}"));
    let start = common::guest_symbol(vtrace_demo::test_guests::TRIPLE_FAULT, "start");
    assert!(
        log.contains(&format!("RIP is in: start+{:#x}\n", rip - start)),
        "{log}"
    );
    assert!(
        log.contains("idt 0000000000000000+0"),
        "the empty IDT that caused it: {log}"
    );
    assert!(log.contains("last exits"), "{log}");
}

#[test]
fn emulation_failure_names_the_instruction() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let guest = write_guest(
        dir.path(),
        "popcnt.elf",
        vtrace_demo::test_guests::UNEMULATED,
    );
    let out = run(&["run", "--no-input", "--kernel", guest.to_str().unwrap()]);
    let log = stderr(&out);
    if out.status.code() == Some(vtrace_demo::test_guests::UNEMULATED_NATIVE_STATUS) {
        // A host with hardware virtualization ran POPCNT natively.
        return;
    }
    assert_eq!(out.status.code(), Some(81), "{log}");
    assert!(log.contains("could not emulate"), "{log}");
    assert!(log.contains("f3 0f b8 c1"), "bytes at RIP: {log}");
    assert!(log.contains("(popcnt eax,ecx)"), "decoded: {log}");
    assert!(
        log.contains("hint: the guest ran `popcnt eax,ecx` (POPCNT), which KVM's emulator"),
        "the hint names it: {log}"
    );
}
