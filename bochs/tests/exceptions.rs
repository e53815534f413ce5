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
    fn port_in(&mut self, _cpu: u32, _port: u16, _len: u32) -> u32 {
        u32::MAX
    }
    fn port_out(&mut self, _cpu: u32, _port: u16, _len: u32, _value: u32) {}
    fn mmio_read(&mut self, _cpu: u32, _gpa: u64, _len: u32) -> u64 {
        u64::MAX
    }
    fn mmio_write(&mut self, _cpu: u32, _gpa: u64, _len: u32, _value: u64) {}
    fn step(&mut self, _cpu: u32) -> Wants {
        self.steps += 1;
        Wants::default()
    }
    fn acknowledge(&mut self, _cpu: u32) -> u8 {
        panic!("no interrupt was raised")
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
