//! Several CPUs, run in turns: each has its own state and activity (an
//! application processor waits for its STARTUP until a hand-over makes it
//! run), and what it does reaches the host under its own number. Needs
//! the engine's library (see long_mode.rs).

mod common;

use vtrace_bochs::{Activity, Host, Machine, Stop, Wants};

#[derive(Default)]
struct Ports {
    outs: Vec<(u32, u16, u32)>,
    steps: [u64; 2],
}

impl Host for Ports {
    fn port_out(&mut self, cpu: u32, port: u16, _len: u32, value: u32) {
        self.outs.push((cpu, port, value));
    }
    fn step(&mut self, cpu: u32) -> Wants {
        self.steps[cpu as usize] += 1;
        Wants::default()
    }
}

#[test]
fn two_cpus_take_turns_each_under_its_own_number() {
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    // mov al, N; out 0x80 + N, al; hlt
    ram[0x10000..0x10005].copy_from_slice(&[0xb0, 0x00, 0xe6, 0x80, 0xf4]);
    ram[0x11000..0x11005].copy_from_slice(&[0xb0, 0x01, 0xe6, 0x81, 0xf4]);
    let mut host = Ports::default();
    let mut machine = Machine::new(&library, &mut ram, 2).unwrap();
    assert_eq!(machine.state(0).activity(), Some(Activity::Active));
    assert_eq!(
        machine.state(1).activity(),
        Some(Activity::WaitingForStartup)
    );
    // Before a STARTUP (or a hand-over) the second CPU does not run.
    assert_eq!(machine.run(&mut host, 1, 10), (Stop::Halt, 0));

    let first = common::long_mode(machine.state(0), 0x10000, 0x80000);
    machine.set_state(0, &first);
    let mut second = common::long_mode(machine.state(1), 0x11000, 0x70000);
    second.activity = Activity::Active as u32;
    machine.set_state(1, &second);
    assert_eq!(machine.run(&mut host, 0, 1), (Stop::Steps, 1));
    assert_eq!(machine.run(&mut host, 1, 10), (Stop::Halt, 3));
    assert_eq!(machine.run(&mut host, 0, 10), (Stop::Halt, 2));
    assert_eq!(host.outs, [(1, 0x81, 1), (0, 0x80, 0)]);
    assert_eq!(host.steps, [3, 3]);
    assert_eq!(machine.state(1).activity(), Some(Activity::Halted));
}
