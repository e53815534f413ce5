//! What this host's KVM can show a tracer, found by running tiny guests
//! (`vtrace doctor`): whether kernel code runs natively or emulated,
//! whether single-stepping reaches the VMM at CPL 0 and CPL 3, whether
//! hardware breakpoints do, which instructions KVM's emulator lacks,
//! which CPUID bits reach the guest though vtrace's baseline hides them,
//! and the bare single-step rate. Nothing here trusts a CPU flag where a
//! guest can be asked instead.

mod machine;

use std::time::{Duration, Instant};

use kvm_ioctls::Kvm;

use crate::cpu::cpuid::{self, CpuProfile};
use crate::error::Result;
use machine::{Ending, Machine, DONE_PORT, SCRATCH, USER_CODE, USER_CS, USER_DS, USER_STACK};

pub use machine::Ending as ProbeEnding;

/// Loop rounds of the stepping probes.
const ROUNDS: u32 = 500;

/// Everything `vtrace doctor` found.
#[derive(Clone, Debug)]
pub struct Findings {
    /// The host CPU's vendor ("AuthenticAMD", "GenuineIntel"...).
    pub cpu_vendor: String,
    /// The CPU advertises VT-x (`vmx`) or AMD-V (`svm`) to this kernel.
    pub cpu_virtualization: Option<&'static str>,
    /// A paravirtual KVM module is loaded (`kvm_pvm`).
    pub paravirtual_module: bool,
    /// Guest instructions per second of a CPL 0 loop, not stepped.
    pub kernel_code_rate: f64,
    /// Single-stepping a CPL 0 loop of [`Stepping::expected`] instructions.
    pub kernel_stepping: Stepping,
    /// The same at CPL 3.
    pub user_stepping: Stepping,
    /// SYSCALL from CPL 3 entered the kernel's entry at CPL 0 (`None`:
    /// the probe could not tell).
    pub syscall_enters_kernel: Option<bool>,
    /// A hardware execution breakpoint made the VMM stop at it.
    pub breakpoints_exit: bool,
    /// A hardware data breakpoint (writes of eight bytes) made the VMM
    /// stop right after the store, at CPL 0.
    pub watchpoints_exit: bool,
    /// How each probed instruction (by name) fared at CPL 0.
    pub instructions: Vec<(&'static str, Ending)>,
    /// CPUID bits the guest saw set though vtrace's baseline table clears
    /// them: (leaf, register, bit).
    pub cpuid_leaks: Vec<(u32, char, u8)>,
    /// Features of the baseline CPU this host's KVM does not offer, left
    /// out of its table here: (leaf, register, bit).
    pub baseline_dropped: Vec<cpuid::Dropped>,
    /// Debug exits per second single-stepping a CPL 0 loop.
    pub step_rate: f64,
}

/// One stepping probe.
#[derive(Clone, Debug)]
pub struct Stepping {
    /// Instructions the loop runs before its OUT.
    pub expected: u64,
    /// Debug exits seen at the probe's privilege level, armed once.
    pub seen: u64,
    /// The same with stepping armed again after every exit.
    pub seen_rearmed: u64,
    /// Debug exits, armed once, after which no instruction had run: KVM on
    /// VT-x reports the trap of an instruction it completed itself twice.
    /// Not counted in `seen`; the run loop passes over them too.
    pub echoes: u64,
    /// How the armed-once run ended: [`Ending::Done`] at CPL 0,
    /// `Vector(6)` (its closing UD2) at CPL 3; a `Vector(1)`: the guest
    /// received the #DB itself.
    pub ending: Ending,
}

impl Stepping {
    /// Every instruction gave a debug exit, at least when re-armed.
    pub fn works(&self) -> bool {
        self.seen_rearmed == self.expected
    }
}

/// The instructions the probe tries, with their bytes (64-bit mode).
pub const INSTRUCTIONS: &[(&str, &[u8])] = &[
    ("int3", &[0xcc]),
    ("int 0x80", &[0xcd, 0x80]),
    // cmpxchg16b [SCRATCH]
    (
        "cmpxchg16b",
        &[0x48, 0x0f, 0xc7, 0x0c, 0x25, 0x00, 0x70, 0x00, 0x00],
    ),
    // xor ecx, ecx; xgetbv
    ("xgetbv", &[0x31, 0xc9, 0x0f, 0x01, 0xd0]),
    // xor eax, eax; xor edx, edx; xsave [SCRATCH]
    (
        "xsave",
        &[
            0x31, 0xc0, 0x31, 0xd2, 0x0f, 0xae, 0x24, 0x25, 0x00, 0x70, 0x00, 0x00,
        ],
    ),
    // xor eax, eax; xor edx, edx; xrstor [SCRATCH] (a zero header: init state)
    (
        "xrstor",
        &[
            0x31, 0xc0, 0x31, 0xd2, 0x0f, 0xae, 0x2c, 0x25, 0x00, 0x70, 0x00, 0x00,
        ],
    ),
    ("popcnt", &[0xf3, 0x0f, 0xb8, 0xc1]),
    ("rdtscp", &[0x0f, 0x01, 0xf9]),
    ("rdpid", &[0xf3, 0x0f, 0xc7, 0xf8]),
    // movbe eax, [SCRATCH]
    (
        "movbe",
        &[0x0f, 0x38, 0xf0, 0x04, 0x25, 0x00, 0x70, 0x00, 0x00],
    ),
    ("rdrand", &[0x0f, 0xc7, 0xf0]),
    // Linux runs it on every return to user mode on an AMD CPU without
    // XSAVEERPTR (its workaround for the FXSAVE leak): the baseline's case.
    ("fnclex", &[0xdb, 0xe2]),
];

/// CPUID leaves (leaf, subleaf) compared against the baseline table.
const CPUID_LEAVES: [(u32, u32); 3] = [(1, 0), (7, 0), (0x8000_0001, 0)];

/// `mov dx, DONE_PORT; out dx, al`
fn done() -> Vec<u8> {
    let [p0, p1] = DONE_PORT.to_le_bytes();
    vec![0x66, 0xba, p0, p1, 0xee]
}

/// `mov ecx, rounds; L: dec ecx; jnz L` then [`done`]: 2 × rounds + 2
/// instructions before the OUT.
fn counted_loop(rounds: u32) -> Vec<u8> {
    let mut code = vec![0xb9];
    code.extend(rounds.to_le_bytes());
    code.extend([0xff, 0xc9, 0x75, 0xfc]);
    code.extend(done());
    code
}

/// [`counted_loop`] for CPL 3: it ends with UD2 instead of the OUT (a
/// paravirtual KVM may not honour IOPL 3), 2 × rounds + 1 instructions
/// before it; the #UD's stub reports vector 6.
fn user_loop(rounds: u32) -> Vec<u8> {
    let mut code = vec![0xb9];
    code.extend(rounds.to_le_bytes());
    code.extend([0xff, 0xc9, 0x75, 0xfc, 0x0f, 0x0b]);
    code
}

/// Kernel code that drops to CPL 3 at [`USER_CODE`] with IOPL 3 (so user
/// code may OUT) and interrupts off.
fn to_user() -> Vec<u8> {
    let mut code = vec![0x6a, USER_DS as u8, 0x68];
    code.extend((USER_STACK as u32).to_le_bytes());
    code.extend([0x68, 0x02, 0x30, 0x00, 0x00, 0x6a, USER_CS as u8, 0x68]);
    code.extend((USER_CODE as u32).to_le_bytes());
    // iretq
    code.extend([0x48, 0xcf]);
    code
}

/// Kernel code that points SYSCALL at an entry of its own (STAR's kernel
/// CS, LSTAR), then drops to CPL 3 ([`to_user`]). The entry stores the CS
/// it runs with at SCRATCH and ends with [`done`]; user code is
/// [`SYSCALL_USER`].
fn syscall_setup() -> Vec<u8> {
    const STAR: u32 = 0xc000_0081;
    const LSTAR: u32 = 0xc000_0082;
    // mov ecx, STAR; xor eax, eax; mov edx, KERNEL_CS; wrmsr
    let mut code = vec![0xb9];
    code.extend(STAR.to_le_bytes());
    code.extend([0x31, 0xc0, 0xba]);
    code.extend(u32::from(machine::KERNEL_CS).to_le_bytes());
    code.extend([0x0f, 0x30]);
    // mov ecx, LSTAR; mov eax, ENTRY; xor edx, edx; wrmsr
    code.push(0xb9);
    code.extend(LSTAR.to_le_bytes());
    let entry_at = code.len() + 1;
    code.extend([0xb8, 0, 0, 0, 0, 0x31, 0xd2, 0x0f, 0x30]);
    code.extend(to_user());
    let entry = (machine::KERNEL_CODE + code.len() as u64) as u32;
    code[entry_at..entry_at + 4].copy_from_slice(&entry.to_le_bytes());
    // mov ecx, cs; mov [SCRATCH], ecx
    code.extend([0x8c, 0xc9, 0x89, 0x0c, 0x25]);
    code.extend((SCRATCH as u32).to_le_bytes());
    code.extend(done());
    code
}

/// User code of the SYSCALL probe.
const SYSCALL_USER: [u8; 2] = [0x0f, 0x05];

/// Whether SYSCALL from CPL 3 enters the kernel at CPL 0, its entry's CS
/// as the guest saw it; `None` where the probe did not get that far.
fn syscall_entry(kvm: &Kvm) -> Result<Option<bool>> {
    let mut m = Machine::new(kvm, CpuProfile::Baseline, &syscall_setup(), &SYSCALL_USER)?;
    // Where the entry ran at CPL 3 its OUT may fault (IOPL aside), and
    // where SYSCALL faulted nothing was stored: the selector tells.
    let _ = m.run(100, PROBE_TIME, false);
    let mut cs = [0u8; 2];
    m.read(SCRATCH, &mut cs)?;
    Ok(match u16::from_le_bytes(cs) {
        0 => None,
        cs => Some(cs & 3 == 0),
    })
}

/// CPUID of each of [`CPUID_LEAVES`], stored at SCRATCH + 16 × i.
fn cpuid_code() -> Vec<u8> {
    let mut code = Vec::new();
    for (i, (leaf, sub)) in CPUID_LEAVES.iter().enumerate() {
        code.push(0xb8);
        code.extend(leaf.to_le_bytes());
        code.push(0xb9);
        code.extend(sub.to_le_bytes());
        code.extend([0x0f, 0xa2]);
        let at = (SCRATCH + 16 * i as u64) as u32;
        // mov [at + 4k], eax / ebx / ecx / edx
        for (k, modrm) in [0x04u8, 0x1c, 0x0c, 0x14].iter().enumerate() {
            code.extend([0x89, *modrm, 0x25]);
            code.extend((at + 4 * k as u32).to_le_bytes());
        }
    }
    code.extend(done());
    code
}

const PROBE_TIME: Duration = Duration::from_secs(20);

fn stepping(kvm: &Kvm, kernel: &[u8], user: &[u8], level: usize) -> Result<Stepping> {
    let expected = 2 * u64::from(ROUNDS) + if level == 0 { 2 } else { 1 };
    let budget = 4 * expected + 100;
    let mut m = Machine::new(kvm, CpuProfile::Baseline, kernel, user)?;
    m.debug(true, None)?;
    let once = m.run(budget, PROBE_TIME, false);
    let mut m = Machine::new(kvm, CpuProfile::Baseline, kernel, user)?;
    m.debug(true, None)?;
    let rearmed = m.run(budget, PROBE_TIME, true);
    Ok(Stepping {
        expected,
        seen: once.steps[level],
        seen_rearmed: rearmed.steps[level],
        echoes: once.echoes,
        ending: once.ending,
    })
}

/// Opens the KVM device at `device` and runs every probe. Takes a few
/// seconds (stepping is slow where kernel code is emulated or nested).
pub fn examine(device: &std::path::Path) -> Result<Findings> {
    let kvm = crate::vm::open_kvm(device)?;
    let kvm = &kvm;
    let (cpu_vendor, cpu_virtualization) = host_cpu();

    // Untraced speed of kernel code: emulated or not.
    let rounds = 200_000u32;
    let mut m = Machine::new(kvm, CpuProfile::Baseline, &counted_loop(rounds), &[])?;
    let t = Instant::now();
    let run = m.run(1_000, PROBE_TIME, false);
    let kernel_code_rate = match run.ending {
        Ending::Done => (2.0 * f64::from(rounds) + 2.0) / t.elapsed().as_secs_f64(),
        _ => 0.0,
    };

    let kernel_stepping = stepping(kvm, &counted_loop(ROUNDS), &[], 0)?;
    let user_stepping = stepping(kvm, &to_user(), &user_loop(ROUNDS), 1)?;
    let syscall_enters_kernel = syscall_entry(kvm)?;

    // A breakpoint on the loop's OUT.
    let code = counted_loop(ROUNDS);
    let out_at = machine::KERNEL_CODE + code.len() as u64 - 1;
    let mut m = Machine::new(kvm, CpuProfile::Baseline, &code, &[])?;
    m.debug(false, Some(out_at))?;
    let breakpoints_exit = m.run(1_000, PROBE_TIME, false).ending == Ending::Breakpoint(out_at);

    // A data breakpoint on the store of `mov rax, SCRATCH; mov [rax], rcx`.
    let mut code = vec![0x48, 0xb8];
    code.extend(SCRATCH.to_le_bytes());
    code.extend([0x48, 0x89, 0x08]);
    let after_store = machine::KERNEL_CODE + code.len() as u64;
    code.extend(done());
    let mut m = Machine::new(kvm, CpuProfile::Baseline, &code, &[])?;
    m.watch(SCRATCH)?;
    let watchpoints_exit =
        m.run(1_000, PROBE_TIME, false).ending == Ending::Breakpoint(after_store);

    let mut instructions = Vec::new();
    for (name, bytes) in INSTRUCTIONS {
        let mut code = bytes.to_vec();
        code.extend(done());
        let mut m = Machine::new(kvm, CpuProfile::Host, &code, &[])?;
        instructions.push((*name, m.run(100, PROBE_TIME, false).ending));
    }

    let mut m = Machine::new(kvm, CpuProfile::Baseline, &cpuid_code(), &[])?;
    let mut cpuid_leaks = Vec::new();
    let table = cpuid::build(kvm, CpuProfile::Baseline)?;
    if m.run(100, PROBE_TIME, false).ending == Ending::Done {
        for (i, (leaf, sub)) in CPUID_LEAVES.iter().enumerate() {
            let mut seen = [0u8; 16];
            m.read(SCRATCH + 16 * i as u64, &mut seen)?;
            // The baseline's answer does not depend on what the CPU said.
            let given = table.as_given(*leaf, *sub, [0; 4]);
            for (k, reg) in ['a', 'b', 'c', 'd'].iter().enumerate() {
                let got = u32::from_le_bytes([
                    seen[4 * k],
                    seen[4 * k + 1],
                    seen[4 * k + 2],
                    seen[4 * k + 3],
                ]);
                // Leaf 1's EBX holds the APIC ID and CLFLUSH size, not
                // features; leaf 1's ECX bit 27 (OSXSAVE) mirrors CR4.
                let ignore: u32 = match (leaf, reg) {
                    (1, 'b') => u32::MAX,
                    (1, 'c') => 1 << 27,
                    _ => 0,
                };
                let extra = got & !given[k] & !ignore;
                for bit in 0..32u8 {
                    if extra & (1 << bit) != 0 {
                        cpuid_leaks.push((*leaf, *reg, bit));
                    }
                }
            }
        }
    }

    let mut m = Machine::new(kvm, CpuProfile::Baseline, &counted_loop(u32::MAX), &[])?;
    m.debug(true, None)?;
    let t = Instant::now();
    let run = m.run(u64::MAX, Duration::from_millis(500), false);
    let step_rate = (run.steps[0] + run.steps[1]) as f64 / t.elapsed().as_secs_f64();

    Ok(Findings {
        cpu_vendor,
        cpu_virtualization,
        paravirtual_module: std::path::Path::new("/sys/module/kvm_pvm").exists(),
        kernel_code_rate,
        kernel_stepping,
        user_stepping,
        syscall_enters_kernel,
        breakpoints_exit,
        watchpoints_exit,
        instructions,
        cpuid_leaks,
        baseline_dropped: table.dropped().to_vec(),
        step_rate,
    })
}

fn host_cpu() -> (String, Option<&'static str>) {
    let leaf0 = std::arch::x86_64::__cpuid(0);
    let vendor: Vec<u8> = [leaf0.ebx, leaf0.edx, leaf0.ecx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect();
    (
        String::from_utf8_lossy(&vendor).into_owned(),
        crate::host::virtualization(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};

    fn mnemonics(code: &[u8]) -> Vec<Mnemonic> {
        let mut d = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
        let mut out = Vec::new();
        while d.can_decode() {
            out.push(d.decode().mnemonic());
        }
        out
    }

    #[test]
    fn probe_code_decodes_as_meant() {
        use Mnemonic::*;
        assert_eq!(mnemonics(&counted_loop(3)), [Mov, Dec, Jne, Mov, Out]);
        assert_eq!(mnemonics(&user_loop(3)), [Mov, Dec, Jne, Ud2]);
        assert_eq!(mnemonics(&to_user()), [Push, Push, Push, Push, Push, Iretq]);
        let setup = syscall_setup();
        assert_eq!(
            mnemonics(&setup),
            [
                Mov, Xor, Mov, Wrmsr, Mov, Mov, Xor, Wrmsr, Push, Push, Push, Push, Push, Iretq,
                Mov, Mov, Mov, Out
            ]
        );
        // LSTAR is the entry: the code after the IRETQ.
        let entry = u32::from_le_bytes(setup[20..24].try_into().unwrap());
        let iretq_end = setup.windows(2).position(|w| w == [0x48, 0xcf]).unwrap() + 2;
        assert_eq!(u64::from(entry), machine::KERNEL_CODE + iretq_end as u64);
        assert_eq!(mnemonics(&SYSCALL_USER), [Syscall]);
        for (name, bytes) in INSTRUCTIONS {
            let m = mnemonics(bytes);
            let last = format!("{:?}", m.last().unwrap()).to_lowercase();
            assert!(name.starts_with(&last), "{name}: {m:?}");
        }
        let c = mnemonics(&cpuid_code());
        assert_eq!(
            c.iter().filter(|m| **m == Cpuid).count(),
            CPUID_LEAVES.len()
        );
    }
}
