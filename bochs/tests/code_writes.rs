//! Code the CPU ran once and that is then written again runs as written:
//! by the guest itself (a store through a mapping not yet in its TLB, as
//! Linux's text_poke makes) and by the host. Bochs keeps decoded
//! instructions; both writes must drop them. Needs the engine's library
//! (see long_mode.rs).

mod common;

use vtrace_bochs::{Machine, Stop};

/// At 0x10ffe, across a page boundary: mov eax, 1; hlt.
const OLD: [u8; 6] = [0xb8, 0x01, 0x00, 0x00, 0x00, 0xf4];

#[test]
fn code_the_guest_writes_again_runs_as_written() {
    if !common::in_own_process("code_the_guest_writes_again_runs_as_written") {
        return;
    }
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    ram[0x10ffe..0x10ffe + OLD.len()].copy_from_slice(&OLD);
    // At 0x20000: mov dword [0x10ffe], 0x000002b8 (mov eax, 2); jmp 0x10ffe
    let patch = [
        0xc7, 0x04, 0x25, 0xfe, 0x0f, 0x01, 0x00, 0xb8, 0x02, 0x00, 0x00, 0xe9, 0xee, 0x0f, 0xff,
        0xff,
    ];
    ram[0x20000..0x20000 + patch.len()].copy_from_slice(&patch);
    let mut host = common::Quiet;
    let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
    let state = common::long_mode(machine.state(0), 0x10ffe, 0x80000);
    machine.set_state(0, &state);
    assert_eq!(machine.run(&mut host, 0, 10), (Stop::Halt, 2));
    assert_eq!(machine.state(0).gpr[0], 1, "the code as it was");

    // A fresh TLB: the store's first write takes the slow path.
    let mut state = common::long_mode(machine.state(0), 0x20000, 0x80000);
    state.activity = 0;
    machine.set_state(0, &state);
    assert_eq!(machine.run(&mut host, 0, 10), (Stop::Halt, 4));
    assert_eq!(machine.state(0).gpr[0], 2, "the code as the guest wrote it");
}

#[test]
fn code_the_host_writes_again_runs_as_written() {
    if !common::in_own_process("code_the_host_writes_again_runs_as_written") {
        return;
    }
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    ram[0x10ffe..0x10ffe + OLD.len()].copy_from_slice(&OLD);
    let mut host = common::Quiet;
    let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
    let state = common::long_mode(machine.state(0), 0x10ffe, 0x80000);
    machine.set_state(0, &state);
    assert_eq!(machine.run(&mut host, 0, 10), (Stop::Halt, 2));
    assert_eq!(machine.state(0).gpr[0], 1);

    assert!(machine.write_ram(0x10fff, &[0x03]), "mov eax, 3");
    assert!(!machine.write_ram(64 << 20, &[0]), "past RAM");
    machine.set_state(0, &state);
    assert_eq!(machine.run(&mut host, 0, 10), (Stop::Halt, 2));
    assert_eq!(machine.state(0).gpr[0], 3, "the code as the host wrote it");
}
