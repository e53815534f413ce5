//! A process makes Bochs's CPUs once, but may make machines one after
//! another: each runs on its own RAM from the reset state; two at once,
//! or one of another CPU count, are refused. Needs the engine's library
//! (see long_mode.rs).

mod common;

use vtrace_bochs::{Machine, MachineError, Stop};

#[test]
fn machines_one_after_another_each_run_on_their_own_ram() {
    let Some(library) = common::library() else {
        return;
    };
    let mut host = common::Quiet;
    for value in [1u8, 2, 3] {
        let mut ram = common::ram();
        // mov eax, VALUE; hlt
        ram[0x10000..0x10006].copy_from_slice(&[0xb8, value, 0, 0, 0, 0xf4]);
        let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
        let mut other = common::ram();
        assert!(
            matches!(
                Machine::new(&library, &mut other, 1),
                Err(MachineError::Taken)
            ),
            "one at a time"
        );
        let state = common::long_mode(machine.state(0), 0x10000, 0x80000);
        machine.set_state(0, &state);
        assert_eq!(machine.run(&mut host, 0, 10), (Stop::Halt, 2));
        assert_eq!(machine.state(0).gpr[0], u64::from(value), "its own RAM");
    }
    let mut ram = common::ram();
    assert!(
        matches!(
            Machine::new(&library, &mut ram, 2),
            Err(MachineError::Cpus(2))
        ),
        "as many CPUs as the first"
    );
    assert!(
        Machine::new(&library, &mut ram, 1).is_ok(),
        "a refusal frees it"
    );
}
