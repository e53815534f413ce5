//! A machine small enough to probe KVM with: 4 MiB of RAM identity-mapped
//! (user-accessible), a GDT with kernel and user segments and a TSS, an IDT
//! whose every vector reports itself on a port, and one long-mode vCPU that
//! starts at CPL 0 with the code it is given.

use kvm_bindings::{kvm_guest_debug, kvm_regs, kvm_sregs, KVM_GUESTDBG_ENABLE};
use kvm_ioctls::{Kvm, VcpuExit, VmFd};
use vm_memory::{Bytes, GuestAddress};

use crate::cpu::cpuid::{self, CpuProfile};
use crate::cpu::echo::{self, EchoWatch, StepExit};
use crate::cpu::entry::{gdt_entry, segment_of};
use crate::error::{Error, Result};
use crate::memory::{create_guest_ram, GuestRam};
use crate::vcpu::Vcpu;
use vtrace_x86::{cr0, cr4, efer};

/// The port a probe's code writes when it is done.
pub const DONE_PORT: u16 = 0x5f0;
/// The port the IDT's stubs write the vector to.
pub const VECTOR_PORT: u16 = 0x5f1;

const RAM: u64 = 4 << 20;
const GDT_AT: u64 = 0x500;
const PML4: u64 = 0x1000;
const PDPT: u64 = 0x2000;
const PD: u64 = 0x3000;
const IDT_AT: u64 = 0x4000;
/// 256 stubs of 16 bytes.
const STUBS_AT: u64 = 0x5000;
const TSS_AT: u64 = 0x6000;
/// Scratch memory a probe's code may use (CPUID results, XSAVE area).
pub const SCRATCH: u64 = 0x7000;
const KERNEL_STACK: u64 = 0x9000;
/// Where kernel-mode probe code goes.
pub const KERNEL_CODE: u64 = 0x1_0000;
/// Where user-mode probe code goes.
pub const USER_CODE: u64 = 0x2_0000;
/// Top of the user-mode stack.
pub const USER_STACK: u64 = 0x3_0000;

pub const KERNEL_CS: u16 = 0x08;
const KERNEL_DS: u16 = 0x10;
pub const USER_CS: u16 = 0x18 | 3;
pub const USER_DS: u16 = 0x20 | 3;
const TSS_SEL: u16 = 0x28;

const GDT: [u64; 5] = [
    0,
    gdt_entry(0xa09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0xa0fb, 0, 0xfffff),
    gdt_entry(0xc0f3, 0, 0xfffff),
];

/// How a probe run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The code reached its end (an OUT to `DONE_PORT`).
    Done,
    /// The guest took an exception or interrupt: its IDT stub reported
    /// this vector.
    Vector(u8),
    /// KVM could not emulate an instruction (`KVM_EXIT_INTERNAL_ERROR`).
    EmulationFailure,
    /// A debug exit where stepping was off: a breakpoint, at this RIP.
    Breakpoint(u64),
    /// The exit budget ran out, or the time did.
    Budget,
    /// Something else (triple fault, entry failure...), described.
    Other(String),
}

/// What one run saw.
#[derive(Clone, Debug)]
pub struct Run {
    pub ending: Ending,
    /// Debug exits after an instruction that ran at CPL 0, and at CPL 3.
    pub steps: [u64; 2],
    /// Debug exits that ran nothing, passed over as the run loop does
    /// (see `cpu::echo`).
    pub echoes: u64,
}

/// The probe VM.
pub struct Machine {
    _vm: VmFd,
    vcpu: Vcpu,
    ram: GuestRam,
    stepping: bool,
}

impl Machine {
    /// A fresh machine with `profile`'s CPUID (CR4.OSXSAVE on where it
    /// offers XSAVE), `kernel` at [`KERNEL_CODE`] and `user` at
    /// [`USER_CODE`].
    pub fn new(kvm: &Kvm, profile: CpuProfile, kernel: &[u8], user: &[u8]) -> Result<Machine> {
        let vm = kvm.create_vm().map_err(Error::kvm("KVM_CREATE_VM"))?;
        let _ = vm.set_tss_address(0xfffb_d000);
        let ram = create_guest_ram(RAM)?;
        crate::vm::register_ram(&vm, &ram)?;
        write_tables(&ram)?;
        write(&ram, KERNEL_CODE, kernel)?;
        write(&ram, USER_CODE, user)?;
        let mut vcpu = Vcpu::new(&vm, 0)?;
        let cpuid = cpuid::build(kvm, profile)?;
        let xsave = cpuid
            .entries()
            .as_slice()
            .iter()
            .any(|e| e.function == 1 && e.ecx & (1 << 26) != 0);
        vcpu.set_cpuid(cpuid.entries())?;
        vcpu.set_sregs(&long_mode(xsave))?;
        vcpu.set_regs(&kvm_regs {
            rip: KERNEL_CODE,
            rsp: KERNEL_STACK,
            rflags: 0x2,
            ..Default::default()
        })?;
        Ok(Machine {
            _vm: vm,
            vcpu,
            ram,
            stepping: false,
        })
    }

    /// The bytes a probe left at `at`.
    pub fn read(&self, at: u64, buf: &mut [u8]) -> Result<()> {
        self.ram
            .read_slice(buf, GuestAddress(at))
            .map_err(|source| Error::GuestRead { at, source })
    }

    /// Sets single-stepping and hardware breakpoint 0.
    pub fn debug(&mut self, step: bool, breakpoint: Option<u64>) -> Result<()> {
        let mut d = kvm_guest_debug::default();
        if step || breakpoint.is_some() {
            d.control = KVM_GUESTDBG_ENABLE;
        }
        if step {
            d.control |= kvm_bindings::KVM_GUESTDBG_SINGLESTEP;
        }
        self.stepping = step;
        if let Some(at) = breakpoint {
            d.control |= kvm_bindings::KVM_GUESTDBG_USE_HW_BP;
            d.arch.debugreg[0] = at;
            // L0, execute, one byte; bit 10 reads as one.
            d.arch.debugreg[7] = 0x401;
        }
        self.vcpu.set_guest_debug(&d)
    }

    /// Sets hardware breakpoint 0 on writes of the eight bytes at `at`:
    /// a data breakpoint, which traps after the store.
    pub fn watch(&mut self, at: u64) -> Result<()> {
        let mut d = kvm_guest_debug {
            control: KVM_GUESTDBG_ENABLE | kvm_bindings::KVM_GUESTDBG_USE_HW_BP,
            ..Default::default()
        };
        self.stepping = false;
        d.arch.debugreg[0] = at;
        // L0; R/W 01: data writes; LEN 10: eight bytes.
        d.arch.debugreg[7] = 0x401 | (0b01 << 16) | (0b10 << 18);
        self.vcpu.set_guest_debug(&d)
    }

    /// Runs until the code ends, an exception, a failure, or `max_exits`
    /// exits (or `max_time`). With `rearm`, stepping is armed again after
    /// every debug exit (what vtrace does where stepping rides on TF).
    pub fn run(&mut self, max_exits: u64, max_time: std::time::Duration, rearm: bool) -> Run {
        let started = std::time::Instant::now();
        let mut steps = [0u64; 2];
        let mut cpl = self.vcpu.sregs().cs.dpl;
        let mut watch = EchoWatch::default();
        for _ in 0..max_exits {
            if started.elapsed() > max_time {
                break;
            }
            let before = self.vcpu.echo_witness();
            self.vcpu.clear_debug_report();
            let mut from_cpu = false;
            let ending = match self.vcpu.run() {
                Ok(VcpuExit::IoOut(DONE_PORT, _)) => Some(Ending::Done),
                Ok(VcpuExit::IoOut(VECTOR_PORT, data)) => {
                    Some(Ending::Vector(data.first().copied().unwrap_or(0)))
                }
                Ok(VcpuExit::Debug(arch)) => {
                    from_cpu = echo::raised_by_cpu(arch.dr7);
                    None
                }
                Ok(VcpuExit::InternalError) => Some(Ending::EmulationFailure),
                Ok(VcpuExit::Hlt) => Some(Ending::Other("HLT".into())),
                Ok(VcpuExit::Shutdown) => Some(Ending::Other("triple fault".into())),
                Ok(other) => Some(Ending::Other(format!("{other:?}"))),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => None,
                Err(e) => Some(Ending::Other(format!("KVM_RUN: {e}"))),
            };
            if let Some(ending) = ending {
                return Run {
                    ending,
                    steps,
                    echoes: watch.count,
                };
            }
            if !self.stepping {
                return Run {
                    ending: Ending::Breakpoint(self.vcpu.rip()),
                    steps,
                    echoes: watch.count,
                };
            }
            let step = StepExit {
                from_cpu,
                // The probes' code never branches to itself.
                unchanged: self.vcpu.echo_witness() == before,
            };
            if watch.is_echo(step, || false) {
                continue;
            }
            // The step belongs to the level the instruction ran at (an
            // IRETQ to user mode is a kernel step).
            steps[usize::from(cpl == 3)] += 1;
            cpl = self.vcpu.sregs().cs.dpl;
            if rearm {
                let _ = self.debug(true, None);
            }
        }
        Run {
            ending: Ending::Budget,
            steps,
            echoes: watch.count,
        }
    }
}

fn write(ram: &GuestRam, at: u64, bytes: &[u8]) -> Result<()> {
    ram.write_slice(bytes, GuestAddress(at))
        .map_err(|source| Error::GuestWrite {
            what: "a probe machine's code",
            at,
            source,
        })
}

fn write_tables(ram: &GuestRam) -> Result<()> {
    // 2 MiB pages, present, writable, user.
    write(ram, PML4, &(PDPT | 0x7).to_le_bytes())?;
    write(ram, PDPT, &(PD | 0x7).to_le_bytes())?;
    write(ram, PD, &(0x87u64).to_le_bytes())?;
    write(ram, PD + 8, &((1u64 << 21) | 0x87).to_le_bytes())?;

    let mut gdt: Vec<u8> = GDT.iter().flat_map(|e| e.to_le_bytes()).collect();
    // A 64-bit TSS descriptor takes two slots.
    gdt.extend(gdt_entry(0x0089, TSS_AT as u32, 0x67).to_le_bytes());
    gdt.extend(0u64.to_le_bytes());
    write(ram, GDT_AT, &gdt)?;
    write(ram, TSS_AT + 4, &KERNEL_STACK.to_le_bytes())?;

    let mut idt = Vec::with_capacity(256 * 16);
    let mut stubs = Vec::with_capacity(256 * 16);
    for vector in 0..=255u8 {
        let stub = STUBS_AT + u64::from(vector) * 16;
        let lo = (stub & 0xffff)
            | u64::from(KERNEL_CS) << 16
            | 0x8e00u64 << 32
            | (stub & 0xffff_0000) << 32;
        idt.extend(lo.to_le_bytes());
        idt.extend((stub >> 32).to_le_bytes());
        // mov al, vector; mov dx, VECTOR_PORT; out dx, al; hlt
        let [p0, p1] = VECTOR_PORT.to_le_bytes();
        let mut s = vec![0xb0, vector, 0x66, 0xba, p0, p1, 0xee, 0xf4];
        s.resize(16, 0xf4);
        stubs.extend(s);
    }
    write(ram, IDT_AT, &idt)?;
    write(ram, STUBS_AT, &stubs)
}

fn long_mode(xsave: bool) -> kvm_sregs {
    let mut sregs = kvm_sregs {
        cs: segment_of(GDT[1], KERNEL_CS),
        ..Default::default()
    };
    let data = segment_of(GDT[2], KERNEL_DS);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = kvm_bindings::kvm_segment {
        base: TSS_AT,
        limit: 0x67,
        selector: TSS_SEL,
        type_: 0xb,
        present: 1,
        ..Default::default()
    };
    sregs.ldt.type_ = 2;
    sregs.ldt.present = 1;
    sregs.gdt.base = GDT_AT;
    sregs.gdt.limit = (GDT.len() as u16 + 2) * 8 - 1;
    sregs.idt.base = IDT_AT;
    sregs.idt.limit = 256 * 16 - 1;
    sregs.cr3 = PML4;
    // PAE, OSFXSR, OSXMMEXCPT (and OSXSAVE).
    sregs.cr4 = cr4::PAE | cr4::OSFXSR | cr4::OSXMMEXCPT | if xsave { cr4::OSXSAVE } else { 0 };
    // PE, MP, ET, NE, WP, PG.
    // MP (bit 1) and NE (bit 5) as firmware leaves them.
    sregs.cr0 = cr0::PE | 0x2 | cr0::ET | 0x20 | cr0::WP | cr0::PG;
    // SCE, LME, LMA.
    sregs.efer = efer::SCE | efer::LME | efer::LMA;
    sregs
}
