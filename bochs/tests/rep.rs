//! A REP string instruction is one step per iteration, as stepping with
//! the trap flag records it; one with a count of zero is one step. Needs
//! the engine's library (see long_mode.rs).

mod common;

use vtrace_bochs::{Host, Machine, Stop, Wants};

#[derive(Default)]
struct Counter {
    /// RCX as each step left it is not visible here; the steps are.
    steps: u64,
}

impl Host for Counter {
    fn step(&mut self, _cpu: u32) -> Wants {
        self.steps += 1;
        Wants::default()
    }
}

#[test]
fn a_rep_string_instruction_is_a_step_per_iteration() {
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    #[rustfmt::skip]
    let code = [
        0xbf, 0x00, 0x00, 0x03, 0x00, // mov edi, 0x30000
        0xb0, 0xaa,                   // mov al, 0xaa
        0xb9, 0x05, 0x00, 0x00, 0x00, // mov ecx, 5
        0xf3, 0xaa,                   // rep stosb (5 iterations)
        0xf3, 0xaa,                   // rep stosb (rcx 0: none)
        0xf4,                         // hlt
    ];
    ram[0x10000..0x10000 + code.len()].copy_from_slice(&code);
    let mut host = Counter::default();
    let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
    let state = common::long_mode(machine.state(0), 0x10000, 0x80000);
    machine.set_state(0, &state);
    // A run that ends between two iterations goes on from the next.
    assert_eq!(machine.run(&mut host, 0, 5), (Stop::Steps, 5));
    let between = machine.state(0);
    assert_eq!(
        (between.gpr[1], between.rip),
        (3, 0x1000c),
        "two done, at the rep"
    );
    // Three movs, five iterations, the empty rep, the hlt.
    let (stop, ran) = machine.run(&mut host, 0, 100);
    assert_eq!(stop, Stop::Halt);
    assert_eq!((5 + ran, host.steps), (3 + 5 + 1 + 1, 10));
    let after = machine.state(0);
    assert_eq!((after.gpr[1], after.gpr[7]), (0, 0x30005));
    drop(machine);
    assert_eq!(&ram[0x30000..0x30006], &[0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0]);
}
