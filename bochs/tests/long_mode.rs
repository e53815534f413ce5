//! Bochs's CPU from the engine's library, run on RAM of this test's own:
//! a counting loop in 64-bit long mode, its port write and its HLT, every
//! step told to the host. Needs the library `scripts/engine.sh` builds
//! (`scripts/test.sh` runs it); without it the test says so and passes,
//! except under CI, where the library must be there.

mod common;

use std::time::Instant;

use vtrace_bochs::{Host, Machine, Stop, Wants};

#[derive(Default)]
struct Recorder {
    steps: u64,
    ports: Vec<(u16, u32, u32)>,
    complaints: Vec<String>,
}

impl Host for Recorder {
    fn port_out(&mut self, _cpu: u32, port: u16, len: u32, value: u32) {
        self.ports.push((port, len, value));
    }
    fn step(&mut self, _cpu: u32) -> Wants {
        self.steps += 1;
        Wants::default()
    }
    fn log(&mut self, level: i32, text: &str) {
        if level >= 2 {
            self.complaints.push(text.to_string());
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

#[test]
fn a_loop_in_long_mode_runs_every_step_through_the_host() {
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    let code = program();
    ram[0x10000..0x10000 + code.len()].copy_from_slice(&code);

    let mut host = Recorder::default();
    let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
    let state = common::long_mode(machine.state(0), 0x10000, 0x80000);
    machine.set_state(0, &state);

    // A run ends after the steps asked for, exactly.
    assert_eq!(machine.run(&mut host, 0, 1000), (Stop::Steps, 1000));
    let started = Instant::now();
    let (stop, ran) = machine.run(&mut host, 0, u64::MAX);
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(stop, Stop::Halt, "{:?}", host.complaints);
    // The mov, three instructions a loop, the mov, the out, the hlt.
    let total = 1 + 3 * u64::from(LOOPS) + 3;
    assert_eq!(ran + 1000, total);
    assert_eq!(host.steps, total, "every step reaches the host");
    let after = machine.state(0);
    assert_eq!(after.gpr[0], u64::from(LOOPS), "rax counted the loops");
    assert_eq!(after.gpr[1], 0, "rcx counted down");
    assert_eq!(after.rip, 0x10000 + code.len() as u64, "past the hlt");
    // AL of 1,000,000 (0xf4240) out to port 0x80, one byte.
    assert_eq!(host.ports, [(0x80, 1, 0x40)]);
    assert!(host.complaints.is_empty(), "{:?}", host.complaints);
    // Halted with no interrupt to take, it does not run.
    assert_eq!(machine.run(&mut host, 0, 10), (Stop::Halt, 0));
    eprintln!(
        "{ran} steps in {seconds:.3} s: {:.1} M steps/s with a host call per step",
        ran as f64 / seconds / 1e6
    );
}
