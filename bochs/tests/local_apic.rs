//! The local APIC page is the host's: Bochs's own local APIC stays off,
//! even after the guest writes IA32_APIC_BASE to enable it, so loads and
//! stores at 0xfee00000 reach the host's MMIO as any address past RAM
//! does. Needs the engine's library (see long_mode.rs).

mod common;

use vtrace_bochs::{Host, Machine, Stop};

#[derive(Default)]
struct Apic {
    reads: Vec<(u64, u32)>,
    writes: Vec<(u64, u32, u64)>,
    complaints: Vec<String>,
}

impl Host for Apic {
    fn mmio_read(&mut self, _cpu: u32, gpa: u64, len: u32) -> u64 {
        self.reads.push((gpa, len));
        gpa & 0xfff
    }
    fn mmio_write(&mut self, _cpu: u32, gpa: u64, len: u32, value: u64) {
        self.writes.push((gpa, len, value));
    }
    fn log(&mut self, level: i32, text: &str) {
        if level >= 2 {
            self.complaints.push(text.to_string());
        }
    }
}

#[test]
fn the_local_apic_page_is_the_hosts_even_after_the_guest_enables_bochss() {
    let Some(library) = common::library() else {
        return;
    };
    let mut ram = common::ram();
    // 3-4 GiB through a second page directory: 0xfee00000's 2 MiB page.
    let mut put = |at: usize, value: u64| ram[at..at + 8].copy_from_slice(&value.to_le_bytes());
    put(0x2000 + 8 * 3, 0x4003);
    put(0x4000 + 8 * 503, 0xfee0_0000 | 0x83);
    #[rustfmt::skip]
    let code = [
        0xb8, 0xb0, 0x00, 0xe0, 0xfe,       // mov eax, 0xfee000b0 (EOI)
        0xc7, 0x00, 0x00, 0x00, 0x00, 0x00, // mov dword [rax], 0
        0xb8, 0x20, 0x00, 0xe0, 0xfe,       // mov eax, 0xfee00020 (ID)
        0x8b, 0x18,                         // mov ebx, [rax]
        0xb9, 0x1b, 0x00, 0x00, 0x00,       // mov ecx, 0x1b (IA32_APIC_BASE)
        0xb8, 0x00, 0x09, 0xe0, 0xfe,       // mov eax, 0xfee00900 (enabled, BSP)
        0x31, 0xd2,                         // xor edx, edx
        0x0f, 0x30,                         // wrmsr
        0xb8, 0x30, 0x00, 0xe0, 0xfe,       // mov eax, 0xfee00030 (version)
        0x8b, 0x08,                         // mov ecx, [rax]
        0xf4,                               // hlt
    ];
    ram[0x10000..0x10000 + code.len()].copy_from_slice(&code);

    let mut host = Apic::default();
    let mut machine = Machine::new(&library, &mut ram, 1).unwrap();
    let state = common::long_mode(machine.state(0), 0x10000, 0x80000);
    machine.set_state(0, &state);
    let (stop, ran) = machine.run(&mut host, 0, 100);
    assert_eq!(stop, Stop::Halt, "{:?}", host.complaints);
    assert_eq!(ran, 11);
    assert_eq!(host.writes, [(0xfee0_00b0, 4, 0)]);
    assert_eq!(
        host.reads,
        [(0xfee0_0020, 4), (0xfee0_0030, 4)],
        "both loads, before and after the WRMSR, reach the host"
    );
    let after = machine.state(0);
    assert_eq!(
        (after.gpr[3], after.gpr[1]),
        (0x20, 0x30),
        "what the host answered"
    );
    assert!(host.complaints.is_empty(), "{:?}", host.complaints);
}
