//! An instruction that faults is no step: its exception is an event the
//! host is told of, then the handler's instructions are steps. Needs the
//! engine's library (see long_mode.rs).

mod common;

use vtrace_bochs::{Event, Host, Machine, Stop, Wants};

#[derive(Default)]
struct Seen {
    steps: u64,
    events: Vec<(u64, Event)>,
}

impl Host for Seen {
    fn step(&mut self, _cpu: u32) -> Wants {
        self.steps += 1;
        Wants::default()
    }
    fn event(&mut self, _cpu: u32, event: Event) {
        self.events.push((self.steps, event));
    }
}

const IDT: u64 = 0x5000;

#[test]
fn a_faulting_instruction_is_an_event_not_a_step() {
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    // inc rax; ud2; inc rax; hlt
    let main = [0x48, 0xff, 0xc0, 0x0f, 0x0b, 0x48, 0xff, 0xc0, 0xf4];
    ram[0x10000..0x10000 + main.len()].copy_from_slice(&main);
    // #UD's handler steps over the ud2: add qword [rsp], 2; iretq
    let handler = [0x48, 0x83, 0x04, 0x24, 0x02, 0x48, 0xcf];
    ram[0x12000..0x12000 + handler.len()].copy_from_slice(&handler);
    common::gate(&mut ram, IDT, 6, 0x12000);

    let mut machine = Machine::new(&library, &mut ram, 1, Seen::default()).unwrap();
    let mut state = common::long_mode(machine.state(0), 0x10000, 0x80000);
    state.idt_base = IDT;
    state.idt_limit = 16 * 7 - 1;
    machine.set_state(0, &state);

    let (stop, ran) = machine.run(0, 100);
    assert_eq!(stop, Stop::Halt);
    // inc, the handler's add and iretq, inc, hlt: the ud2 is not one.
    assert_eq!(ran, 5);
    assert_eq!(
        machine.host().events,
        [(
            1,
            Event::Exception {
                vector: 6,
                error: 0
            }
        )]
    );
    assert_eq!(machine.state(0).gpr[0], 2);
}

#[test]
fn a_triple_fault_shuts_the_cpu_down_and_says_so() {
    // The library holds one machine a process: this test runs alone in
    // its own (cargo runs each test file as a process, its tests as
    // threads), so it forks off the first machine's run by re-running
    // this file's binary for itself.
    if std::env::var_os("VTRACE_BOCHS_TRIPLE_FAULT").is_none() {
        let me = std::env::current_exe().unwrap();
        let out = std::process::Command::new(me)
            .args([
                "--exact",
                "a_triple_fault_shuts_the_cpu_down_and_says_so",
                "--nocapture",
            ])
            .env("VTRACE_BOCHS_TRIPLE_FAULT", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    ram[0x10000..0x10002].copy_from_slice(&[0x0f, 0x0b]); // ud2, no IDT
    let mut machine = Machine::new(&library, &mut ram, 1, Seen::default()).unwrap();
    let state = common::long_mode(machine.state(0), 0x10000, 0x80000);
    machine.set_state(0, &state);
    assert_eq!(machine.run(0, 100), (Stop::Shutdown, 0));
    let vectors: Vec<u8> = machine
        .host()
        .events
        .iter()
        .map(|(_, e)| match e {
            Event::Exception { vector, .. } => *vector,
            Event::External(v) => *v,
        })
        .collect();
    // #UD; its gate is past the IDT's limit: #GP; so is #GP's: a second
    // #GP while delivering the first, which makes #DF; #DF's gate is
    // missing too: a #GP while delivering #DF, the triple fault.
    assert_eq!(vectors, [6, 13, 13, 8, 13]);
    assert_eq!(machine.run(0, 100), (Stop::Shutdown, 0), "it stays down");
}
