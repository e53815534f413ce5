//! External interrupts through the host: the INTR line the host raises
//! after a step, the vector its acknowledge gives, the guest's IDT; and a
//! halted CPU woken by the line. Needs the engine's library (see
//! long_mode.rs).

mod common;

use vtrace_bochs::{Event, Host, Machine, Stop, Wants};

/// Raises INTR after step `at` until the CPU acknowledges.
struct Timer {
    at: u64,
    steps: u64,
    waiting: bool,
    acknowledged_after: Vec<u64>,
    events: Vec<(u64, Event)>,
    complaints: Vec<String>,
}

impl Host for Timer {
    fn step(&mut self, _cpu: u32) -> Wants {
        self.steps += 1;
        if self.steps == self.at {
            self.waiting = true;
        }
        Wants {
            end_run: false,
            interrupt: self.waiting,
        }
    }
    fn acknowledge(&mut self, _cpu: u32) -> u8 {
        self.waiting = false;
        self.acknowledged_after.push(self.steps);
        0x30
    }
    fn event(&mut self, _cpu: u32, event: Event) -> Wants {
        self.events.push((self.steps, event));
        Wants::default()
    }
    fn log(&mut self, level: i32, text: &str) {
        if level >= 2 {
            self.complaints.push(text.to_string());
        }
    }
}

const IDT: u64 = 0x5000;
const HANDLER: u64 = 0x11000;

#[test]
fn an_interrupt_lands_after_the_step_the_host_raised_it_and_wakes_a_halted_cpu() {
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    // sti; 1: inc rax; cmp rbx, 1; jne 1b; hlt; hlt
    let main = [
        0xfb, 0x48, 0xff, 0xc0, 0x48, 0x83, 0xfb, 0x01, 0x75, 0xf7, 0xf4, 0xf4,
    ];
    ram[0x10000..0x10000 + main.len()].copy_from_slice(&main);
    // inc rbx; iretq
    let handler = [0x48, 0xff, 0xc3, 0x48, 0xcf];
    let at = HANDLER as usize;
    ram[at..at + handler.len()].copy_from_slice(&handler);
    common::gate(&mut ram, IDT, 0x30, HANDLER);

    let timer = Timer {
        at: 100,
        steps: 0,
        waiting: false,
        acknowledged_after: Vec::new(),
        events: Vec::new(),
        complaints: Vec::new(),
    };
    let mut host = timer;
    let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
    let mut state = common::long_mode(machine.state(0), 0x10000, 0x80000);
    state.idt_base = IDT;
    state.idt_limit = 16 * 0x31 - 1;
    machine.set_state(0, &state);
    let set = machine.state(0);
    assert_eq!(
        (set.gdt_base, set.gdt_limit, set.idt_base),
        (common::GDT, 23, IDT),
        "{set:x?}"
    );

    let (stop, ran) = machine.run(&mut host, 0, 1_000_000);
    assert_eq!(stop, Stop::Halt);
    assert!(host.complaints.is_empty(), "{:?}", host.complaints);
    // Taken right after the step that raised it, before another.
    assert_eq!(host.acknowledged_after, [100]);
    let after = machine.state(0);
    assert_eq!(after.gpr[3], 1, "the handler ran once");
    // sti and 33 loops of three make the 100 steps before it; the
    // handler's two; back at the loop's head, its inc, cmp and jne (not
    // taken), and the hlt.
    assert_eq!((ran, host.steps), (100 + 2 + 4, 106));
    assert_eq!(after.rip, 0x1000b, "halted at the first hlt");

    // Halted, with the line low, it does not run; raised, it wakes into
    // the handler, returns and halts at the second hlt.
    assert_eq!(machine.run(&mut host, 0, 10), (Stop::Halt, 0));
    machine.set_interrupt_line(0, true);
    let (stop, ran) = machine.run(&mut host, 0, 10);
    assert_eq!(stop, Stop::Halt);
    assert_eq!(ran, 3, "inc rbx, iretq, hlt");
    assert_eq!(machine.state(0).gpr[3], 2);
    assert_eq!(host.acknowledged_after, [100, 106]);
    // Each delivery told to the host, after the step it followed.
    assert_eq!(
        host.events,
        [(100, Event::External(0x30)), (106, Event::External(0x30))]
    );
    assert!(host.complaints.is_empty(), "{:?}", host.complaints);
}
