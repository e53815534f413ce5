//! Builds the demo OS and the small test guests with gcc, so that the
//! `vtrace` binary can embed them. Only gcc and binutils are needed: they are
//! on every machine that builds Rust crates with C parts.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Flags that keep gcc to instructions every vtrace host can run at CPL 0
/// (see PLATFORM.md: no SSE state, no POPCNT, no red zone under interrupts).
const GUEST_CFLAGS: &[&str] = &[
    "-ffreestanding",
    "-fno-pic",
    "-fno-pie",
    "-mno-red-zone",
    "-mgeneral-regs-only",
    "-mno-popcnt",
    "-fno-stack-protector",
    "-fcf-protection=none",
    "-fno-asynchronous-unwind-tables",
    "-fno-builtin",
    "-O2",
    "-g",
    "-Wall",
    "-Wextra",
    "-Werror",
];

const DEMO_SOURCES: &[&str] = &[
    "boot.S",
    "entry.S",
    "main.c",
    "interrupts.c",
    "mm.c",
    "sched.c",
    "syscall.c",
    "serial.c",
    "tasks.c",
    "lib.c",
];

fn run(cmd: &mut Command) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e} (is gcc installed?)"));
    assert!(status.success(), "{cmd:?} failed with {status}");
}

fn cc() -> String {
    env::var("VTRACE_GUEST_CC").unwrap_or_else(|_| "gcc".to_string())
}

/// Keeps the checkout's path out of the debug info, so the same sources
/// build the same image wherever they are checked out: traces identify
/// the demo OS by a hash of its bytes, and a path in them would make
/// `vtrace analyze` warn that another build ran.
fn prefix_map() -> String {
    let manifest = env::var("CARGO_MANIFEST_DIR").expect("cargo sets this");
    format!("-ffile-prefix-map={manifest}=guest-kit/demo")
}

/// What the SMP build adds (and it defines `DEMO_SMP`).
const DEMO_SMP_SOURCES: &[&str] = &["smp.c", "smp_entry.S"];

/// Builds `name`.elf from the demo's sources; `smp` builds its SMP mode.
fn build_demo_os(src: &Path, include: &Path, out: &Path, name: &str, smp: bool) {
    let mut objects = Vec::new();
    let extra = if smp { DEMO_SMP_SOURCES } else { &[] };
    for file in DEMO_SOURCES.iter().chain(extra) {
        // The one-CPU build's objects keep their plain names: gas writes
        // the object's name into the image's debug info, and traces name
        // the demo OS by a hash of the image.
        let obj = match smp {
            false => out.join(format!("{file}.o")),
            true => out.join(format!("{name}-{file}.o")),
        };
        run(Command::new(cc())
            .args(GUEST_CFLAGS)
            .args(smp.then_some("-DDEMO_SMP"))
            .arg(prefix_map())
            .arg("-I")
            .arg(include)
            .arg("-c")
            .arg(src.join(file))
            .arg("-o")
            .arg(&obj));
        objects.push(obj);
    }
    run(Command::new(cc())
        .args(["-nostdlib", "-static", "-no-pie"])
        .arg(format!("-Wl,-T,{}", src.join("linker.ld").display()))
        .args([
            "-Wl,--build-id=none",
            "-Wl,-z,max-page-size=4096",
            "-Wl,-z,noexecstack",
        ])
        .args(&objects)
        .arg("-o")
        .arg(out.join(format!("{name}.elf"))));
}

/// Assembles one source file of a small guest; returns the object.
fn assemble(source: &Path, include: &Path, out: &Path, name: &str) -> PathBuf {
    let obj = out.join(format!("{name}.o"));
    run(Command::new(cc())
        .arg("-I")
        .arg(include)
        .arg("-c")
        .arg(source)
        .arg("-o")
        .arg(&obj));
    obj
}

fn build_flat_binary(source: &Path, include: &Path, out: &Path, name: &str) {
    let obj = assemble(source, include, out, name);
    run(Command::new("objcopy")
        .args(["-O", "binary", "-j", ".text"])
        .arg(&obj)
        .arg(out.join(format!("{name}.bin"))));
}

/// A PVH test guest from one assembly file, linked at 1 MiB.
fn build_pvh_test_guest(source: &Path, script: &Path, include: &Path, out: &Path, name: &str) {
    let obj = assemble(source, include, out, name);
    run(Command::new(cc())
        .args(["-nostdlib", "-static", "-no-pie"])
        .arg(format!("-Wl,-T,{}", script.display()))
        .args([
            "-Wl,--build-id=none",
            "-Wl,-z,max-page-size=4096",
            "-Wl,-z,noexecstack",
        ])
        .arg(&obj)
        .arg("-o")
        .arg(out.join(format!("{name}.elf"))));
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets this"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets this"));
    let include = manifest.join("../include");
    let os = manifest.join("os");
    build_demo_os(&os, &include, &out, "demo-os", false);
    build_demo_os(&os, &include, &out, "demo-os-smp", true);
    build_flat_binary(
        &manifest.join("realmode/hello.S"),
        &include,
        &out,
        "realmode-hello",
    );
    let tests = manifest.join("testguests");
    build_flat_binary(&tests.join("count.S"), &include, &out, "count");
    build_flat_binary(&tests.join("region.S"), &include, &out, "region");
    build_flat_binary(&tests.join("debugregs.S"), &include, &out, "debugregs");
    build_flat_binary(&tests.join("flood.S"), &include, &out, "flood");
    build_flat_binary(&tests.join("idle.S"), &include, &out, "idle");
    build_flat_binary(&tests.join("fences.S"), &include, &out, "fences");
    for name in [
        "triple-fault",
        "exception",
        "unemulated",
        "sysenter",
        "msr-fault",
        "mmio",
        "mmio-flood",
    ] {
        let source = tests.join(format!("{name}.S"));
        build_pvh_test_guest(&source, &tests.join("pvh.ld"), &include, &out, name);
    }
    println!("cargo:rerun-if-changed=os");
    println!("cargo:rerun-if-changed=testguests");
    println!("cargo:rerun-if-changed=realmode");
    println!("cargo:rerun-if-changed=../include");
    println!("cargo:rerun-if-env-changed=VTRACE_GUEST_CC");
}
