//! CPUID answers from the host where it has an answer (its CPU profile),
//! and from Bochs's model where it has none; the step is told after the
//! answer is in the registers. Needs the engine's library (see
//! long_mode.rs).

mod common;

use vtrace_bochs::{Host, Machine, Stop};

#[derive(Default)]
struct Profile {
    asked: Vec<(u32, u32)>,
}

impl Host for Profile {
    fn cpuid(&mut self, _cpu: u32, leaf: u32, subleaf: u32) -> Option<[u32; 4]> {
        self.asked.push((leaf, subleaf));
        (leaf == 7).then_some([0x11, 0x22, 0x33, 0x44])
    }
}

#[test]
fn cpuid_answers_from_the_host_where_it_has_an_answer() {
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    #[rustfmt::skip]
    let code = [
        0xb8, 0x07, 0x00, 0x00, 0x00, // mov eax, 7
        0xb9, 0x01, 0x00, 0x00, 0x00, // mov ecx, 1
        0x0f, 0xa2,                   // cpuid
        0x49, 0x89, 0xd8,             // mov r8, rbx
        0x31, 0xc0,                   // xor eax, eax
        0x31, 0xc9,                   // xor ecx, ecx
        0x0f, 0xa2,                   // cpuid
        0xf4,                         // hlt
    ];
    ram[0x10000..0x10000 + code.len()].copy_from_slice(&code);
    let mut host = Profile::default();
    let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
    let state = common::long_mode(machine.state(0), 0x10000, 0x80000);
    machine.set_state(0, &state);
    assert_eq!(machine.run(&mut host, 0, 100), (Stop::Halt, 8));
    assert_eq!(host.asked, [(7, 1), (0, 0)]);
    let after = machine.state(0);
    // Leaf 7 is the host's: its EBX went to r8.
    assert_eq!(after.gpr[8], 0x22);
    // Leaf 0 is Bochs's model's: an Intel CPU's vendor in EBX, EDX, ECX.
    assert_eq!(
        (after.gpr[3], after.gpr[2], after.gpr[1]),
        (0x756e_6547, 0x4965_6e69, 0x6c65_746e),
        "GenuineIntel"
    );
}
