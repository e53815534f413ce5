//! Linux guests for the test machines: a busybox initramfs, the shell that
//! boots it under vtrace inside a machine, and userspace that loops on a
//! system call.

use std::path::Path;

use super::{info_json, newc_archive, run, stderr, stdout};

/// A busybox initramfs whose /init mounts /proc, says it is up and runs
/// `body` (shell).
pub fn busybox_initramfs(dir: &std::path::Path, body: &str) -> std::path::PathBuf {
    busybox_initramfs_with(dir, body, &[])
}

/// The same, with `extra` files (host path, path in the initramfs) in it.
/// Its tree stays at `dir/l2`: the sysroot of its traces.
pub fn busybox_initramfs_with(
    dir: &std::path::Path,
    body: &str,
    extra: &[(&std::path::Path, &str)],
) -> std::path::PathBuf {
    let root = dir.join("l2");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("proc")).unwrap();
    std::fs::create_dir_all(root.join("dev")).unwrap();
    let busybox = std::process::Command::new("sh")
        .args(["-c", "command -v busybox"])
        .output()
        .unwrap();
    let busybox = String::from_utf8_lossy(&busybox.stdout).trim().to_string();
    std::fs::copy(&busybox, root.join("bin/busybox")).expect("busybox (static)");
    for (host, name) in extra {
        std::fs::copy(host, root.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let init = format!(
        "#!/bin/busybox sh\n/bin/busybox --install -s /bin\nmount -t proc proc /proc\n\
         echo 'l2: userspace up'\n{body}\n"
    );
    std::fs::write(root.join("init"), init).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("init"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let cpio = dir.join("l2.cpio");
    newc_archive(&root, &cpio);
    cpio
}

/// Shell that starts `vtrace run` on the machine's Linux with the busybox
/// initramfs (`extra` options added, output to /tmp/log, its pid in $pid)
/// and waits until userspace says it is up (at most 300 s: Linux boots in
/// 8 s on the AMD-V machine, in about 80 s on the VT-x one).
pub fn linux_up(extra: &str) -> String {
    format!(
        "vtrace run --no-input --kernel vmlinuz --initrd l2.cpio --memory 256M {extra} \
           > /tmp/log 2>&1 & pid=$!; \
         for i in $(seq 600); do grep -q 'userspace up' /tmp/log && break; sleep 0.5; done; "
    )
}

/// Userspace loops on a system call (open, read and close of
/// /proc/uptime), saying every 100 rounds that it is alive.
pub const SYSCALL_LOOP: &str = "i=0; while :; do read -r up < /proc/uptime; i=$((i+1)); \
                            case $i in *00) echo \"l2: alive $i\";; esac; done";

/// Steps of Linux's boot from its first instruction the hosts must agree
/// on: past `verify_cpu` and the other CPUID checks, into `clear_bss`.
pub const BOOT_PREFIX_STEPS: u64 = 200_000;

/// `vtrace run` options that trace the first [`BOOT_PREFIX_STEPS`] of
/// `kernel`'s boot into `disk` with the baseline CPU: no initramfs, the
/// default command line, the same memory on every host.
pub fn boot_prefix_args(kernel: &str, disk: &str) -> String {
    format!(
        "run --no-input -q --kernel {kernel} --memory 256M --trace --max-steps \
         {BOOT_PREFIX_STEPS} --exit-after-trace --disk {disk} --disk-size 64M"
    )
}

/// Traces that prefix of the installed kernel here, into `dir`.
pub fn boot_prefix_here(dir: &Path) -> std::path::PathBuf {
    let disk = dir.join("prefix.vtd");
    let kernel = super::test_kernel();
    let args = boot_prefix_args(kernel.to_str().unwrap(), disk.to_str().unwrap());
    let o = run(&args.split_whitespace().collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let info = info_json(&disk);
    assert_eq!(info["gaps"], 0, "{info}");
    assert_eq!(info["steps"], BOOT_PREFIX_STEPS, "{info}");
    disk
}

/// Shell for a test machine: the same prefix of the machine's `vmlinuz`,
/// into /out/prefix.vtd.
pub fn boot_prefix_there() -> String {
    format!(
        "vtrace {} > /out/prefix.txt 2>&1",
        boot_prefix_args("vmlinuz", "/out/prefix.vtd")
    )
}

/// Checks what [`boot_prefix_there`] left in machine run `m` (its shell
/// says "prefix status N" after it): it ran, and its trace is the one this
/// host takes (made in `dir`).
pub fn assert_boot_prefix_as_here(m: &super::machine::MachineRun, dir: &Path) {
    assert!(
        m.output.contains("prefix status 0"),
        "{}",
        m.text("prefix.txt")
    );
    assert_same_trace(&boot_prefix_here(dir), &m.file("prefix.vtd"));
}

/// Two traces of the same guest on two hosts are the same trace, digest
/// for digest; if not, says where their listings first differ.
pub fn assert_same_trace(here: &Path, there: &Path) {
    let (h, t) = (info_json(here), info_json(there));
    if h["digest"] != t["digest"] {
        let (a, b) = (listing(here), listing(there));
        let at = a.iter().zip(&b).position(|(x, y)| x != y);
        panic!(
            "the traces differ (digests {} and {}); first at listing line {at:?}:\n{:?}\n{:?}",
            h["digest"],
            t["digest"],
            at.and_then(|i| a.get(i)),
            at.and_then(|i| b.get(i)),
        );
    }
    assert_eq!(h["steps"], t["steps"], "{h}\n{t}");
}

/// The listing of a trace, without the progress bar.
pub fn listing(trace: &Path) -> Vec<String> {
    let o = run(&["analyze", "listing", trace.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o).lines().map(str::to_owned).collect()
}

/// The listing of CPU `cpu`'s steps of a trace of several CPUs.
pub fn listing_of_cpu(trace: &Path, cpu: u32) -> Vec<String> {
    let cpu = cpu.to_string();
    let o = run(&["analyze", "listing", "--cpu", &cpu, trace.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o).lines().map(str::to_owned).collect()
}

/// `vtrace analyze processes --json` of a trace.
pub fn processes(trace: &Path) -> serde_json::Value {
    let o = run(&["analyze", "processes", "--json", trace.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Checks a trace of [`SYSCALL_LOOP`] taken from the host while it ran:
/// user and kernel steps both, no gap, every user-mode SYSCALL followed
/// into the kernel and every SYSRETQ back to user mode, and every user
/// step and system call the shell's (pid 1, "init").
pub fn assert_user_mode_traced_whole(trace: &Path) {
    let o = run(&["analyze", "spaces", "--json", trace.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let spaces: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let sum = |key: &str| -> u64 {
        spaces["spaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s[key].as_u64().unwrap())
            .sum()
    };
    let (user, kernel) = (sum("user_steps"), sum("kernel_steps"));
    // How the window splits between user and kernel code depends on what
    // the guest was doing (about 45,000 of 52,000 steps were user mode on
    // an idle host, 600 of 30,000 under load): both must be there.
    assert!(user > 100 && kernel > 100, "{spaces}");

    let info = info_json(trace);
    assert_eq!(info["gaps"], 0, "{info}");

    let lines = listing(trace);
    let (_, user_syscalls) = assert_system_calls_followed(&lines, 0, "the trace");

    // The only user process is the shell the kernel ran as /init: pid 1,
    // named "init" by its exec. Tracing started in its user mode, where
    // the running task is found through the kernel's saved GS base; every
    // user step and every SYSCALL of the window is its.
    let table = processes(trace);
    let rows = table["processes"].as_array().unwrap();
    let init = rows
        .iter()
        .find(|r| r["tid"] == 1)
        .unwrap_or_else(|| panic!("no task 1: {table}"));
    assert_eq!(
        (&init["pid"], &init["comm"]),
        (&1.into(), &"init".into()),
        "{table}"
    );
    assert_eq!(init["user_steps"], user, "{table}");
    assert_eq!(init["syscalls"], user_syscalls, "{table}");
    assert!(
        rows.iter().all(|r| !r["tid"].is_null()),
        "unnamed steps: {table}"
    );
}

/// Checks a listing of one CPU's steps of a Linux trace (`skip` columns,
/// the CPU's, before the pid): every user-mode SYSCALL followed into the
/// kernel and every SYSRETQ back to user mode, and some of each. Gives
/// the steps and the user-mode SYSCALLs. `what` names the listing in
/// failures.
pub fn assert_system_calls_followed(lines: &[String], skip: usize, what: &str) -> (usize, usize) {
    // Listing columns of a Linux trace: step, (CPU), pid, comm, address
    // space, pc, routine+offset, bytes, mnemonic.
    let steps: Vec<(usize, Vec<&str>)> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            (
                i,
                l.split_whitespace().skip(1).skip(skip).collect::<Vec<_>>(),
            )
        })
        .filter(|(i, f)| {
            f.len() > 6
                && lines[*i]
                    .split_whitespace()
                    .next()
                    .is_some_and(|n| n.parse::<u64>().is_ok())
        })
        .collect();
    let kernel = |f: &[&str]| f[3].starts_with("0xffff");
    let (mut syscalls, mut sysrets) = (0, 0);
    for w in steps.windows(2) {
        let ((at, this), (next_at, next)) = (&w[0], &w[1]);
        // An interrupt may come at the first user instruction: its
        // handler is then the next step, after the interrupt's line.
        let interrupted = lines[at + 1..*next_at]
            .iter()
            .any(|l| l.trim_start().starts_with("-- interrupt"));
        match this[6] {
            "syscall" if !kernel(this) => {
                syscalls += 1;
                assert!(
                    kernel(next),
                    "{what}: SYSCALL not followed into the kernel: {this:?} {next:?}"
                );
            }
            "sysretq" => {
                sysrets += 1;
                assert!(
                    !kernel(next) || interrupted,
                    "{what}: SYSRETQ not followed to user mode: {next:?}"
                );
            }
            _ => {}
        }
    }
    assert!(
        syscalls > 0 && sysrets > 0,
        "{what}: {syscalls} syscalls, {sysrets} sysrets in {} steps",
        steps.len()
    );
    let user_syscalls = steps
        .iter()
        .filter(|(_, f)| f[6] == "syscall" && !kernel(f))
        .count();
    (steps.len(), user_syscalls)
}
