//! The monitor's view of the vCPU over KVM: sync registers, guest RAM,
//! and the few writes stepping with the trap flag needs.

use crate::engine::EngineView;
use crate::memory::{GuestRam, LowRam};
use crate::monitor::{CpuView, WriteError};
use crate::vcpu::Vcpu;
use crate::vm::Vm;
use vtrace_x86::{PhysicalMemory, Registers, SpecialRegisters};

impl Vm {
    /// The monitor's view of the CPU on stage: KVM's, or the engine's
    /// while it holds the CPU.
    pub(crate) fn cpu_view(&mut self) -> OnStageView<'_> {
        let machine = &mut self.machine;
        if let Some(engine) = self.engine.as_mut().filter(|e| e.holds()) {
            return OnStageView::Engine(EngineView {
                library: engine.library(),
                core: &mut engine.core,
                machine: Some(&mut engine.machine),
                wrote: false,
                low: machine.low_ram,
                ram: &machine.ram,
            });
        }
        OnStageView::Kvm(KvmCpuView {
            low: machine.low_ram,
            vcpu: &mut machine.vcpu,
            ram: &machine.ram,
            cpuid: &machine.cpuid,
            apic_id: u8::try_from(machine.cpus.on_stage()).unwrap_or(u8::MAX),
        })
    }
}

/// The view of whichever holds the CPU on stage.
pub(crate) enum OnStageView<'a> {
    Kvm(KvmCpuView<'a>),
    Engine(EngineView<'a>),
}

impl PhysicalMemory for OnStageView<'_> {
    #[inline]
    fn read_physical(&self, gpa: u64, buf: &mut [u8]) -> bool {
        match self {
            OnStageView::Kvm(v) => v.read_physical(gpa, buf),
            OnStageView::Engine(v) => v.read_physical(gpa, buf),
        }
    }
}

/// Each of `CpuView`'s methods, to the view that holds the CPU.
macro_rules! to_holder {
    ($self:ident, $v:ident => $call:expr) => {
        match $self {
            OnStageView::Kvm($v) => $call,
            OnStageView::Engine($v) => $call,
        }
    };
}

impl CpuView for OnStageView<'_> {
    #[inline]
    fn regs(&mut self) -> Registers {
        to_holder!(self, v => v.regs())
    }
    #[inline]
    fn sregs(&mut self) -> SpecialRegisters {
        to_holder!(self, v => v.sregs())
    }
    fn write_physical(&mut self, gpa: u64, data: &[u8]) -> Result<(), WriteError> {
        to_holder!(self, v => v.write_physical(gpa, data))
    }
    fn write_regs(&mut self, regs: &Registers) -> Result<(), WriteError> {
        to_holder!(self, v => v.write_regs(regs))
    }
    fn cpuid_as_given(&self, function: u32, index: u32, seen: [u32; 4]) -> [u32; 4] {
        to_holder!(self, v => v.cpuid_as_given(function, index, seen))
    }
    fn read_msr(&mut self, index: u32) -> Option<u64> {
        to_holder!(self, v => v.read_msr(index))
    }
    fn write_msr(&mut self, index: u32, value: u64) -> Result<(), WriteError> {
        to_holder!(self, v => v.write_msr(index, value))
    }
}

impl Vm {
    /// The monitor's view of CPU `cpu`, off stage.
    pub(crate) fn parked_cpu_view(&mut self, cpu: usize) -> Option<KvmCpuView<'_>> {
        let machine = &mut self.machine;
        let (vcpu, _) = machine.cpus.parked(cpu)?;
        Some(KvmCpuView {
            low: machine.low_ram,
            vcpu,
            ram: &machine.ram,
            cpuid: &machine.cpuid,
            apic_id: u8::try_from(cpu).unwrap_or(u8::MAX),
        })
    }
}

/// The monitor's view of the vCPU: sync registers and guest RAM.
pub(crate) struct KvmCpuView<'a> {
    /// `ram`'s region at 0 (see [`LowRam`]).
    low: Option<LowRam>,
    vcpu: &'a mut Vcpu,
    ram: &'a GuestRam,
    cpuid: &'a crate::cpu::cpuid::CpuidTable,
    /// The CPU's APIC ID (its number), which its CPUID gives.
    apic_id: u8,
}

impl PhysicalMemory for KvmCpuView<'_> {
    fn read_physical(&self, gpa: u64, buf: &mut [u8]) -> bool {
        use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};
        // SAFETY: `low` was taken from `ram`, which this view borrows.
        if self.low.is_some_and(|low| unsafe { low.read(gpa, buf) }) {
            return true;
        }
        // Elsewhere a slice of one region still costs a fraction of
        // read_slice's walk over regions.
        if let Ok(slice) = self.ram.get_slice(GuestAddress(gpa), buf.len()) {
            return slice.copy_to(buf) == buf.len();
        }
        self.ram.read_slice(buf, GuestAddress(gpa)).is_ok()
    }
}

impl CpuView for KvmCpuView<'_> {
    fn regs(&mut self) -> Registers {
        (&self.vcpu.regs()).into()
    }

    fn sregs(&mut self) -> SpecialRegisters {
        self.vcpu.special_registers()
    }

    fn write_physical(&mut self, gpa: u64, data: &[u8]) -> Result<(), WriteError> {
        use vm_memory::{Bytes, GuestAddress};
        self.ram
            .write_slice(data, GuestAddress(gpa))
            .map_err(|_| WriteError::NotRam(gpa))
    }

    fn write_regs(&mut self, regs: &Registers) -> Result<(), WriteError> {
        self.vcpu
            .set_regs(&regs.into())
            .map_err(|_| WriteError::Registers)
    }

    fn cpuid_as_given(&self, function: u32, index: u32, seen: [u32; 4]) -> [u32; 4] {
        self.cpuid.as_given_on(self.apic_id, function, index, seen)
    }

    fn read_msr(&mut self, index: u32) -> Option<u64> {
        self.vcpu.msr(index)
    }

    fn write_msr(&mut self, index: u32, value: u64) -> Result<(), WriteError> {
        match self.vcpu.set_msr(index, value) {
            true => Ok(()),
            false => Err(WriteError::Msr(index)),
        }
    }
}
