//! The time stamp counter a guest reads (RDTSC, RDTSCP, RDMSR of
//! IA32_TSC) is the host's, by its step clock, and in the registers before
//! the step is told. Needs the engine's library (see long_mode.rs).

mod common;

use vtrace_bochs::{Host, Machine, Stop, Wants};

#[derive(Default)]
struct StepClock {
    steps: u64,
}

impl StepClock {
    /// 1,000 ticks a step, from 2^32 + 7.
    fn now(&self) -> u64 {
        (1 << 32) + 1000 * self.steps + 7
    }
}

impl Host for StepClock {
    fn step(&mut self, _cpu: u32) -> Wants {
        self.steps += 1;
        Wants::default()
    }
    fn tsc(&mut self, _cpu: u32) -> Option<u64> {
        Some(self.now())
    }
}

#[test]
fn the_guests_time_stamp_counter_is_the_hosts_step_clock() {
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    #[rustfmt::skip]
    let code = [
        0x0f, 0x31,                   // rdtsc (step 1)
        0x48, 0xc1, 0xe2, 0x20,       // shl rdx, 32
        0x48, 0x09, 0xd0,             // or rax, rdx
        0x49, 0x89, 0xc0,             // mov r8, rax
        0x0f, 0x01, 0xf9,             // rdtscp (step 5)
        0x49, 0x89, 0xc1,             // mov r9, rax
        0xb9, 0x10, 0x00, 0x00, 0x00, // mov ecx, 0x10 (IA32_TSC)
        0x0f, 0x32,                   // rdmsr (step 8)
        0x49, 0x89, 0xc2,             // mov r10, rax
        0xf4,                         // hlt
    ];
    ram[0x10000..0x10000 + code.len()].copy_from_slice(&code);
    let mut host = StepClock::default();
    let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
    let state = common::long_mode(machine.state(0), 0x10000, 0x80000);
    machine.set_state(0, &state);
    assert_eq!(machine.run(&mut host, 0, 100), (Stop::Halt, 10));
    let after = machine.state(0);
    // Each read is the clock after the steps before it.
    assert_eq!(after.gpr[8], (1 << 32) + 7, "rdtsc: EDX:EAX");
    assert_eq!(after.gpr[9], 4007, "rdtscp: EAX");
    assert_eq!((after.gpr[10], after.gpr[2]), (7007, 1), "rdmsr: EAX, EDX");
}
