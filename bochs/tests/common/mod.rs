//! A machine in 64-bit long mode for the engine's tests: the first 64 MiB
//! mapped one to one, a GDT with a 64-bit code and a data segment, the
//! CPU's state as a 64-bit kernel's.

// Each test file uses part of it.
#![allow(dead_code)]

use vtrace_bochs::{Host, Library, Segment, State};

/// The engine's library, or `None` (said on stderr) where it is not built
/// and this is not CI, where it must be.
pub fn library() -> Option<Library> {
    match Library::find() {
        Ok(path) => Some(Library::load(&path).unwrap()),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// The library holds one machine a process, and cargo runs a test file's
/// tests as threads of one: a test of a file with several calls this
/// first. In the test's own process (this binary run again for `test`
/// alone) it returns true, and the test goes on; elsewhere it runs that
/// process, checks that it passed, and returns false.
pub fn in_own_process(test: &str) -> bool {
    const ALONE: &str = "VTRACE_BOCHS_TEST_ALONE";
    if std::env::var_os(ALONE).is_some_and(|t| t == test) {
        return true;
    }
    let me = std::env::current_exe().unwrap();
    let out = std::process::Command::new(me)
        .args(["--exact", test, "--nocapture"])
        .env(ALONE, test)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

/// A host with nothing: an empty machine around the CPU.
pub struct Quiet;

impl Host for Quiet {}

/// Where the GDT is.
pub const GDT: u64 = 0x6000;

fn put(ram: &mut [u8], at: u64, value: u64) {
    let at = at as usize;
    ram[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// RAM aligned to 4 KiB, as a mapping is: the engine needs it.
pub struct Ram {
    bytes: Vec<u8>,
    at: usize,
}

impl std::ops::Deref for Ram {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[self.at..self.at + RAM]
    }
}

impl std::ops::DerefMut for Ram {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.at..self.at + RAM]
    }
}

const RAM: usize = 64 << 20;

/// 64 MiB of RAM with page tables at 0x1000 mapping the first 64 MiB one
/// to one in 2 MiB pages, and a GDT (null, code 0x08, data 0x10).
pub fn ram() -> Ram {
    let bytes = vec![0u8; RAM + 4096];
    let at = bytes.as_ptr().align_offset(4096);
    let mut ram = Ram { bytes, at };
    put(&mut ram, 0x1000, 0x2003);
    put(&mut ram, 0x2000, 0x3003);
    for i in 0..32u64 {
        put(&mut ram, 0x3000 + 8 * i, (i << 21) | 0x83);
    }
    put(&mut ram, GDT + 8, 0x00af_9a00_0000_ffff);
    put(&mut ram, GDT + 16, 0x00cf_9200_0000_ffff);
    ram
}

/// A 64-bit interrupt gate for `vector` to `handler` in the IDT at `idt`.
pub fn gate(ram: &mut [u8], idt: u64, vector: u8, handler: u64) {
    let at = idt + 16 * u64::from(vector);
    let low = (handler & 0xffff) | (0x08 << 16) | (0x8e00 << 32) | ((handler >> 16) & 0xffff) << 48;
    put(ram, at, low);
    put(ram, at + 8, handler >> 32);
}

/// `state` made a 64-bit kernel's at `rip` with its stack at `rsp`.
pub fn long_mode(mut state: State, rip: u64, rsp: u64) -> State {
    state.gpr = [0; 16];
    state.gpr[4] = rsp;
    state.rip = rip;
    state.rflags = 2;
    let flat = |selector, attributes| Segment {
        base: 0,
        limit: u32::MAX,
        selector,
        attributes,
    };
    // A 64-bit code segment, flat data, no LDT, a busy 64-bit TSS.
    state.seg = [flat(0x10, 0xc093); 8];
    state.seg[1] = flat(0x08, 0xa09b);
    state.seg[6] = Segment::default();
    state.seg[7] = Segment {
        base: 0,
        limit: 0x67,
        selector: 0x18,
        attributes: 0x008b,
    };
    state.gdt_base = GDT;
    state.gdt_limit = 23;
    state.cr0 = 0x8000_0031;
    state.cr3 = 0x1000;
    state.cr4 = 0x20;
    state.efer = 0x500;
    state
}
