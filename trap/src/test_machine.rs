//! A machine for the tracer's unit tests: guest memory as a flat vector
//! behind [`CpuView`], long mode with an IDT, no KVM.

use std::cell::RefCell;
use vtrace_vmm::{CpuView, WriteError};
use vtrace_x86::{PhysicalMemory, Registers, SpecialRegisters};

/// Guest memory as a flat vector, for walker and engine tests.
pub struct FlatCpu {
    pub mem: RefCell<Vec<u8>>,
    pub regs: Registers,
    pub sregs: SpecialRegisters,
    /// IA32_FMASK, the one MSR the engine touches.
    pub fmask: u64,
}

impl FlatCpu {
    pub fn new(size: usize) -> FlatCpu {
        FlatCpu {
            mem: RefCell::new(vec![0; size]),
            regs: Registers::default(),
            sregs: SpecialRegisters::default(),
            fmask: 0,
        }
    }
    pub fn put(&self, gpa: u64, bytes: &[u8]) {
        self.mem.borrow_mut()[gpa as usize..gpa as usize + bytes.len()].copy_from_slice(bytes);
    }
    pub fn put_u64(&self, gpa: u64, v: u64) {
        self.put(gpa, &v.to_le_bytes());
    }
}

impl PhysicalMemory for FlatCpu {
    fn read_physical(&self, gpa: u64, buf: &mut [u8]) -> bool {
        let m = self.mem.borrow();
        match m.get(gpa as usize..gpa as usize + buf.len()) {
            Some(src) => {
                buf.copy_from_slice(src);
                true
            }
            None => false,
        }
    }
}

impl CpuView for FlatCpu {
    fn regs(&mut self) -> Registers {
        self.regs
    }
    fn sregs(&mut self) -> SpecialRegisters {
        self.sregs
    }
    fn write_physical(&mut self, gpa: u64, data: &[u8]) -> Result<(), WriteError> {
        let mut m = self.mem.borrow_mut();
        match m.get_mut(gpa as usize..gpa as usize + data.len()) {
            Some(dst) => {
                dst.copy_from_slice(data);
                Ok(())
            }
            None => Err(WriteError::NotRam(gpa)),
        }
    }
    fn write_regs(&mut self, regs: &Registers) -> Result<(), WriteError> {
        self.regs = *regs;
        Ok(())
    }
    fn read_msr(&mut self, index: u32) -> Option<u64> {
        (index == vtrace_x86::msr::FMASK).then_some(self.fmask)
    }
    fn write_msr(&mut self, index: u32, value: u64) -> Result<(), WriteError> {
        if index != vtrace_x86::msr::FMASK {
            return Err(WriteError::Msr(index));
        }
        self.fmask = value;
        Ok(())
    }
}

pub const CODE: u64 = 0x10000;
const IDT: u64 = 0x20000;
pub const TIMER_HANDLER: u64 = 0x30000;
pub const PF_HANDLER: u64 = 0x31000;
pub const STACK: u64 = 0x80000;

/// Long mode, CPL 0, the first 2 MiB identity-mapped, an IDT with a
/// timer handler (vector 32) and a page-fault handler (vector 14).
pub fn machine(code: &[u8]) -> FlatCpu {
    let mut cpu = FlatCpu::new(0x20_0000);
    cpu.put_u64(0x1000, 0x2000 | 3);
    cpu.put_u64(0x2000, 0x3000 | 3);
    cpu.put_u64(0x3000, 0x83);
    cpu.sregs.cr0 = 0x8000_0011;
    cpu.sregs.cr3 = 0x1000;
    cpu.sregs.cr4 = 0x20;
    cpu.sregs.efer = 0x500;
    cpu.sregs.cs.l = 1;
    cpu.sregs.cs.selector = 0x08;
    cpu.sregs.idt.base = IDT;
    cpu.sregs.idt.limit = 0xfff;
    for (vector, handler) in [(32u64, TIMER_HANDLER), (14, PF_HANDLER)] {
        let lo = (handler & 0xffff) | (0x08 << 16) | (0x8e << 40) | ((handler & 0xffff_0000) << 32);
        cpu.put_u64(IDT + vector * 16, lo);
        cpu.put_u64(IDT + vector * 16 + 8, handler >> 32);
    }
    // Both handlers start with `push 0` (2 bytes), then iretq.
    cpu.put(TIMER_HANDLER, &[0x6a, 0x00, 0x48, 0xcf]);
    cpu.put(PF_HANDLER, &[0x6a, 0x0e, 0x48, 0xcf]);
    cpu.put(CODE, code);
    cpu.regs.rip = CODE;
    cpu.regs.rsp = STACK;
    cpu.regs.rflags = 0x202;
    cpu
}
