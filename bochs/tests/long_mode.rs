//! Bochs's CPU from the engine's library, run on RAM of this test's own:
//! a counting loop in 64-bit long mode, its port write and its HLT, every
//! step told to the host. Needs the library `scripts/engine.sh` builds
//! (`scripts/test.sh` runs it); without it the test says so and passes,
//! except under CI, where the library must be there.

use std::time::Instant;

use vtrace_bochs::{Host, Library, Machine, Segment, Stop};

#[derive(Default)]
struct Recorder {
    steps: u64,
    ports: Vec<(u16, u32, u32)>,
    panics: Vec<String>,
}

impl Host for Recorder {
    fn port_in(&mut self, _cpu: u32, _port: u16, _len: u32) -> u32 {
        u32::MAX
    }
    fn port_out(&mut self, _cpu: u32, port: u16, len: u32, value: u32) {
        self.ports.push((port, len, value));
    }
    fn mmio_read(&mut self, _cpu: u32, _gpa: u64, _len: u32) -> u64 {
        u64::MAX
    }
    fn mmio_write(&mut self, _cpu: u32, _gpa: u64, _len: u32, _value: u64) {}
    fn step(&mut self, _cpu: u32) -> bool {
        self.steps += 1;
        false
    }
    fn log(&mut self, level: i32, text: &str) {
        if level >= 2 {
            self.panics.push(text.to_string());
        }
    }
}

const LOOPS: u32 = 1_000_000;

/// `mov ecx, LOOPS; 1: inc rax; dec rcx; jnz 1b; mov dx, 0x80; out dx, al;
/// hlt` at 0x10000.
fn program() -> Vec<u8> {
    let mut code = vec![0xb9];
    code.extend_from_slice(&LOOPS.to_le_bytes());
    code.extend_from_slice(&[0x48, 0xff, 0xc0, 0x48, 0xff, 0xc9, 0x75, 0xf8]);
    code.extend_from_slice(&[0x66, 0xba, 0x80, 0x00, 0xee, 0xf4]);
    code
}

/// Page tables at 0x1000 mapping the first 64 MiB one to one in 2 MiB
/// pages.
fn identity_map(ram: &mut [u8]) {
    let mut put = |at: usize, value: u64| ram[at..at + 8].copy_from_slice(&value.to_le_bytes());
    put(0x1000, 0x2003);
    put(0x2000, 0x3003);
    for i in 0..32u64 {
        put(0x3000 + 8 * i as usize, (i << 21) | 0x83);
    }
}

#[test]
fn a_loop_in_long_mode_runs_every_step_through_the_host() {
    let path = match Library::find() {
        Ok(path) => path,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let library = Library::load(&path).unwrap();
    let mut ram = vec![0u8; 64 << 20];
    identity_map(&mut ram);
    let code = program();
    ram[0x10000..0x10000 + code.len()].copy_from_slice(&code);

    let mut machine = Machine::new(&library, &mut ram, 1, Recorder::default()).unwrap();
    let mut state = machine.state(0);
    state.gpr = [0; 16];
    state.gpr[4] = 0x80000;
    state.rip = 0x10000;
    state.rflags = 2;
    let flat = |selector, attributes| Segment {
        base: 0,
        limit: u32::MAX,
        selector,
        attributes,
    };
    // A 64-bit code segment, flat data, a busy 64-bit TSS.
    state.seg = [flat(0x10, 0xc093); 8];
    state.seg[1] = flat(0x08, 0xa09b);
    state.seg[6] = Segment::default();
    state.seg[7] = Segment {
        base: 0,
        limit: 0x67,
        selector: 0x18,
        attributes: 0x008b,
    };
    state.cr0 = 0x8000_0031;
    state.cr3 = 0x1000;
    state.cr4 = 0x20;
    state.efer = 0x500;
    machine.set_state(0, &state);

    // A run ends after the steps asked for, exactly.
    assert_eq!(machine.run(0, 1000), (Stop::Steps, 1000));
    let started = Instant::now();
    let (stop, ran) = machine.run(0, u64::MAX);
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(stop, Stop::Halt, "{:?}", machine.host().panics);
    // The mov, three instructions a loop, the mov, the out, the hlt.
    let total = 1 + 3 * u64::from(LOOPS) + 3;
    assert_eq!(ran + 1000, total);
    assert_eq!(machine.host().steps, total, "every step reaches the host");
    let after = machine.state(0);
    assert_eq!(after.gpr[0], u64::from(LOOPS), "rax counted the loops");
    assert_eq!(after.gpr[1], 0, "rcx counted down");
    assert_eq!(after.rip, 0x10000 + code.len() as u64, "past the hlt");
    // AL of 1,000,000 (0xf4240) out to port 0x80, one byte.
    assert_eq!(machine.host().ports, [(0x80, 1, 0x40)]);
    assert!(
        machine.host().panics.is_empty(),
        "{:?}",
        machine.host().panics
    );
    eprintln!(
        "{} steps in {seconds:.3} s: {:.1} M steps/s with a host call per step",
        ran,
        ran as f64 / seconds / 1e6
    );
}
