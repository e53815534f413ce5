//! An instruction that faults is no step: its exception is an event the
//! host is told of, then the handler's instructions are steps. Needs the
//! engine's library (see long_mode.rs).

mod common;

use vtrace_bochs::{Event, Host, Machine, Stop, Wants};

#[derive(Default)]
struct Seen {
    steps: u64,
    events: Vec<(u64, Event)>,
    /// Asks the run to end once an exception is delivered.
    end_at_exceptions: bool,
    /// Keeps the INTR line high; the interrupt is vector 0x20.
    line_high: bool,
}

impl Host for Seen {
    fn step(&mut self, _cpu: u32) -> Wants {
        self.steps += 1;
        Wants {
            end_run: false,
            interrupt: self.line_high,
        }
    }
    fn acknowledge(&mut self, _cpu: u32) -> u8 {
        self.line_high = false;
        0x20
    }
    fn event(&mut self, _cpu: u32, event: Event) -> Wants {
        self.events.push((self.steps, event));
        Wants {
            end_run: self.end_at_exceptions && matches!(event, Event::Exception { .. }),
            interrupt: false,
        }
    }
}

const IDT: u64 = 0x5000;

#[test]
fn a_faulting_instruction_is_an_event_not_a_step() {
    if !common::in_own_process("a_faulting_instruction_is_an_event_not_a_step") {
        return;
    }
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

    let mut host = Seen::default();
    let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
    let mut state = common::long_mode(machine.state(0), 0x10000, 0x80000);
    state.idt_base = IDT;
    state.idt_limit = 16 * 7 - 1;
    machine.set_state(0, &state);

    let (stop, ran) = machine.run(&mut host, 0, 100);
    assert_eq!(stop, Stop::Halt);
    // inc, the handler's add and iretq, inc, hlt: the ud2 is not one.
    assert_eq!(ran, 5);
    assert_eq!(
        host.events,
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
fn a_run_may_end_at_the_handler_of_an_exception_and_a_software_interrupt_is_its_steps() {
    if !common::in_own_process(
        "a_run_may_end_at_the_handler_of_an_exception_and_a_software_interrupt_is_its_steps",
    ) {
        return;
    }
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    // ud2; int3; hlt
    let main = [0x0f, 0x0b, 0xcc, 0xf4];
    ram[0x10000..0x10000 + main.len()].copy_from_slice(&main);
    // #UD's handler: add qword [rsp], 2; iretq. #BP's: iretq.
    let ud = [0x48, 0x83, 0x04, 0x24, 0x02, 0x48, 0xcf];
    ram[0x12000..0x12000 + ud.len()].copy_from_slice(&ud);
    ram[0x13000..0x13002].copy_from_slice(&[0x48, 0xcf]);
    common::gate(&mut ram, IDT, 6, 0x12000);
    common::gate(&mut ram, IDT, 3, 0x13000);

    let mut host = Seen {
        end_at_exceptions: true,
        ..Seen::default()
    };
    let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
    let mut state = common::long_mode(machine.state(0), 0x10000, 0x80000);
    state.idt_base = IDT;
    state.idt_limit = 16 * 7 - 1;
    machine.set_state(0, &state);

    assert_eq!(machine.run(&mut host, 0, 100), (Stop::Asked, 0));
    let at = machine.state(0);
    assert_eq!(
        at.rip, 0x12000,
        "delivered: at the handler, which has not run"
    );
    assert_eq!(at.gpr[4], 0x80000 - 40, "the frame is pushed");
    // The handler's two, then int3 (one step, at its handler), its iretq
    // and hlt.
    assert_eq!(machine.run(&mut host, 0, 100), (Stop::Halt, 5));
    assert_eq!(
        host.events,
        [
            (
                0,
                Event::Exception {
                    vector: 6,
                    error: 0
                }
            ),
            (2, Event::Software(3))
        ]
    );
}

#[test]
fn a_shadow_handed_over_holds_an_interrupt_back_for_one_instruction() {
    if !common::in_own_process("a_shadow_handed_over_holds_an_interrupt_back_for_one_instruction") {
        return;
    }
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    // nop; nop; hlt
    ram[0x10000..0x10003].copy_from_slice(&[0x90, 0x90, 0xf4]);
    ram[0x12000..0x12001].copy_from_slice(&[0xf4]);
    common::gate(&mut ram, IDT, 0x20, 0x12000);
    let mut host = Seen {
        line_high: true,
        ..Seen::default()
    };
    let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
    let mut state = common::long_mode(machine.state(0), 0x10000, 0x80000);
    state.idt_base = IDT;
    state.idt_limit = 16 * 0x21 - 1;
    state.rflags |= 0x200;
    state.interruptibility = vtrace_bochs::BLOCKED_BY_STI;
    machine.set_state(0, &state);
    assert_eq!(
        machine.state(0).interruptibility,
        vtrace_bochs::BLOCKED_BY_STI
    );
    machine.set_interrupt_line(0, true);
    // The first nop runs in the shadow, then the interrupt comes: its
    // handler's hlt is the second step.
    assert_eq!(machine.run(&mut host, 0, 10), (Stop::Halt, 2));
    assert_eq!(host.events, [(1, Event::External(0x20))]);
    assert_eq!(machine.state(0).interruptibility, 0, "the shadow is spent");
}

#[test]
fn a_triple_fault_shuts_the_cpu_down_and_says_so() {
    if !common::in_own_process("a_triple_fault_shuts_the_cpu_down_and_says_so") {
        return;
    }
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    ram[0x10000..0x10002].copy_from_slice(&[0x0f, 0x0b]); // ud2, no IDT
    let mut host = Seen::default();
    let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
    let state = common::long_mode(machine.state(0), 0x10000, 0x80000);
    machine.set_state(0, &state);
    assert_eq!(machine.run(&mut host, 0, 100), (Stop::Shutdown, 0));
    let vectors: Vec<u8> = host
        .events
        .iter()
        .map(|(_, e)| match e {
            Event::Exception { vector, .. } => *vector,
            Event::External(v) | Event::Software(v) => *v,
        })
        .collect();
    // #UD; its gate is past the IDT's limit: #GP; so is #GP's: a second
    // #GP while delivering the first, which makes #DF; #DF's gate is
    // missing too: a #GP while delivering #DF, the triple fault.
    assert_eq!(vectors, [6, 13, 13, 8, 13]);
    assert_eq!(
        machine.run(&mut host, 0, 100),
        (Stop::Shutdown, 0),
        "it stays down"
    );
}
