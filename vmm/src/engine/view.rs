//! The monitor's view of the CPU while the engine holds it: the engine's
//! state as of the last step, and guest RAM.

use vtrace_x86::{PhysicalMemory, Registers, SpecialRegisters};

use crate::memory::{GuestRam, LowRam};
use crate::monitor::{CpuView, WriteError};

use super::{handover, Core};

/// See the module documentation.
pub(crate) struct EngineView<'a> {
    pub(crate) core: &'a mut Core,
    /// The engine's machine, for writes; `None` inside a run (from a host
    /// callback), where the monitor only reads.
    pub(crate) machine: Option<&'a mut vtrace_bochs::Machine<'static>>,
    pub(crate) library: &'static vtrace_bochs::Library,
    /// Guest memory was written through this view (inside a run, the run
    /// must end for the engine to run the bytes written).
    pub(crate) wrote: bool,
    /// `ram`'s region at 0 (see [`LowRam`]).
    pub(crate) low: Option<LowRam>,
    pub(crate) ram: &'a GuestRam,
}

impl PhysicalMemory for EngineView<'_> {
    fn read_physical(&self, gpa: u64, buf: &mut [u8]) -> bool {
        use vm_memory::{Bytes, GuestAddress};
        // SAFETY: `low` was taken from `ram`, which this view borrows.
        if self.low.is_some_and(|low| unsafe { low.read(gpa, buf) }) {
            return true;
        }
        self.ram.read_slice(buf, GuestAddress(gpa)).is_ok()
    }
}

impl CpuView for EngineView<'_> {
    #[inline]
    fn regs(&mut self) -> Registers {
        self.core.regs
    }

    #[inline]
    fn sregs(&mut self) -> SpecialRegisters {
        self.core.sregs
    }

    fn write_physical(&mut self, gpa: u64, data: &[u8]) -> Result<(), WriteError> {
        use vm_memory::{Bytes, GuestAddress};
        self.ram
            .write_slice(data, GuestAddress(gpa))
            .map_err(|_| WriteError::NotRam(gpa))?;
        // The engine drops what it decoded there.
        self.library.invalidate(gpa, data.len() as u64);
        self.wrote = true;
        Ok(())
    }

    fn write_regs(&mut self, regs: &Registers) -> Result<(), WriteError> {
        let Some(machine) = self.machine.as_mut() else {
            return Err(WriteError::ReadOnly);
        };
        self.core.state = vtrace_bochs::state_of(regs, &self.core.sregs, self.core.state);
        machine.set_core(0, &self.core.state);
        self.core.regs = *regs;
        Ok(())
    }

    /// The engine's CPUID is answered from the table already (see
    /// `on_engine`): what the guest saw is what it was given.
    fn cpuid_as_given(&self, _function: u32, _index: u32, seen: [u32; 4]) -> [u32; 4] {
        seen
    }

    fn read_msr(&mut self, index: u32) -> Option<u64> {
        handover::engine_msr(&self.core.state, index)
    }
}
