//! Kernel images as `vtrace run --kernel` loads them (PVH ELF, 64-bit
//! vmlinux, bzImage with its compressed payload) and real-mode images,
//! into guest memory.
#![no_main]

use std::borrow::Cow;
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use vtrace_vmm::fuzzing::load;
use vtrace_vmm::fuzzing::{create_guest_ram, GuestRam};
use vtrace_vmm::{BootSource, Image, Initrd};

static RAM: LazyLock<GuestRam> =
    LazyLock::new(|| create_guest_ram(64 << 20).expect("64 MiB of guest memory"));

fn image(data: &[u8]) -> Image {
    Image {
        name: "fuzz".into(),
        path: None,
        bytes: Cow::Owned(data.to_vec()),
    }
}

/// Where the initrd goes: an initrd is read from its file into guest
/// memory, so the fuzzed bytes are written there first.
static INITRD: LazyLock<std::path::PathBuf> = LazyLock::new(|| {
    std::env::temp_dir().join(format!("vtrace-fuzz-initrd-{}", std::process::id()))
});

fn initrd(data: &[u8]) -> Initrd {
    std::fs::write(&*INITRD, data).expect("write the fuzzed initrd");
    Initrd::from_file(&*INITRD).expect("the initrd just written")
}

fuzz_target!(|data: &[u8]| {
    let kernel = BootSource::Kernel {
        kernel: image(data),
        initrd: Some(initrd(&data[..data.len().min(64)])),
        cmdline: "console=ttyS0".into(),
    };
    let _ = load(&RAM, &kernel, 1);
    let _ = load(&RAM, &kernel, 4);
    let real = BootSource::RealMode {
        image: image(data),
        load_addr: 0x7c00,
    };
    let _ = load(&RAM, &real, 1);
});
