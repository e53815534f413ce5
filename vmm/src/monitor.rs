//! The hook through which a tracer observes and steers the VM. The VMM calls
//! it at the points a tracer needs and otherwise knows nothing of tracing.

use crate::devices::hypercall::Hypercall;
use vtrace_x86::{PhysicalMemory, Registers, SpecialRegisters};

/// What the VMM saw at an exit, as the monitor needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitView {
    /// Single-step or breakpoint exit: one instruction ran (or a
    /// breakpoint was hit before one did).
    Debug {
        /// A breakpoint was hit (the instruction at it has not run).
        breakpoint: bool,
    },
    /// `OUT`. Where KVM's emulator ran it (a paravirtual KVM) it has
    /// completed; on KVM's fast path (VT-x/AMD-V) RIP is still at it, and
    /// it completes on the next entry with a debug exit of its own.
    IoOut {
        /// The port.
        port: u16,
        /// Bytes written (1, 2 or 4).
        size: u8,
        /// The value written.
        value: u32,
        /// The instruction has completed (RIP is past it).
        completed: bool,
    },
    /// `IN`: the instruction completes on the next entry with `value`.
    IoIn {
        /// The port.
        port: u16,
        /// Bytes read (1, 2 or 4).
        size: u8,
        /// The value the device answered.
        value: u32,
    },
    /// A hypercall (an `IN` on the hypercall port) with its result.
    Hypercall {
        /// The call, as the guest made it.
        call: Hypercall,
        /// What the VMM answered in EAX.
        result: i32,
    },
    /// MMIO access (nothing is mapped there; reads return all ones). A
    /// read completes on the next entry, like `IN`.
    Mmio {
        /// The guest-physical address.
        addr: u64,
        /// Bytes accessed (1 to 8).
        size: u8,
        /// A write (else a read).
        write: bool,
        /// The value written or read.
        value: u64,
    },
    /// KVM exited for HLT, with RIP past it: outside single-stepping, or
    /// where the trap did not stop before it (a STI shadow on VT-x/AMD-V).
    /// While stepping, the VMM waits only if the monitor answers
    /// [`Directive::Halt`]: an emulating host may report a HLT it already
    /// stepped once more after an interrupt woke the guest.
    Halt,
    /// `KVM_RUN` returned without running anything (a kick).
    Interrupted,
    /// The VMM completed an instruction the emulator refused (INT3,
    /// LDMXCSR...); `vector` is set when that was an interrupt delivery.
    CompletedByVmm {
        /// The interrupt delivered, where the instruction was one (INT n,
        /// INT3, INTO).
        vector: Option<u8>,
    },
    /// The VMM delivered the fault the monitor foresaw
    /// ([`Monitor::exception_before_entry`]): the faulting instruction did
    /// not run, and the vCPU stands at the handler's first instruction.
    FaultDelivered {
        /// The exception.
        vector: u8,
        /// The error code pushed, for vectors that have one.
        error_code: Option<u32>,
    },
}

/// An exception or software interrupt a monitor asks the VMM to deliver
/// through the guest's IDT before the next instruction runs (see
/// [`Monitor::exception_before_entry`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exception {
    /// The vector.
    pub vector: u8,
    /// Pushed below the frame, for vectors that have one.
    pub error_code: Option<u32>,
    /// Loaded into CR2 first (page faults).
    pub cr2: Option<u64>,
    /// The RIP the frame saves: the faulting instruction's, or the one
    /// after a software interrupt.
    pub return_rip: u64,
    /// Whether the instruction completed.
    pub kind: ExceptionKind,
}

/// Whether the instruction completes (software interrupt) or not (fault).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExceptionKind {
    /// The instruction did not run; the frame saves its address.
    Fault,
    /// INT n, INT3 or INTO: the instruction ran; the frame saves the next.
    SoftwareInterrupt,
}

/// What the monitor asks of the VMM after an exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Directive {
    /// Go on as the VMM would.
    Continue,
    /// The instruction just stepped was HLT (which does not halt under
    /// single-step on every host): wait for the next interrupt as HLT would.
    Halt,
    /// Arm single-stepping again: on hosts that step with TF, the
    /// instruction just stepped may have cleared it (SYSCALL, SYSENTER,
    /// POPF, IRET), or KVM handled it itself and rewrote RFLAGS without it
    /// (control-register and MSR accesses, CPUID, string I/O...).
    ReArm,
}

/// How an external interrupt reached the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Injection {
    /// Queued with `KVM_INTERRUPT`: KVM delivers it on the next entry.
    Queued,
    /// Delivered by the VMM through the guest's IDT: the vCPU now stands
    /// at the handler's first instruction, with the frame pushed.
    Delivered {
        /// The handler's linear address.
        handler: u64,
    },
}

/// What the monitor wants of the next entry: the state it steers, read in
/// one question (see [`Monitor::plan_entry`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryPlan {
    /// The vCPU single-steps from the next entry on.
    pub stepping: bool,
    /// Where the guest must stop with a debug exit.
    pub breakpoints: Breakpoints,
    /// The monitor is done with the guest: the run ends
    /// ([`crate::GuestExit::MonitorDone`]).
    pub done: bool,
    /// The VMM delivers interrupts through the guest's IDT itself (so
    /// that a stepped guest enters the handler under stepping on every
    /// host) rather than queue them with `KVM_INTERRUPT`.
    pub deliver_interrupts: bool,
    /// An interrupt may be delivered before the next instruction. A tracer
    /// says no between the iterations of a REP string instruction, so that
    /// interrupts land at the same steps on hosts that run iterations one
    /// at a time and on hosts that batch them.
    pub interruptible: bool,
    /// On a machine of several CPUs, while stepping: two CPUs' steps may
    /// run at the same time where the monitor says each may
    /// ([`Monitor::runs_beside`]). The VMM then enters CPUs 1, 2... from
    /// threads of their own.
    pub pairing: bool,
}

impl Default for EntryPlan {
    /// The VM without a monitor: runs freely, takes interrupts.
    fn default() -> Self {
        EntryPlan {
            stepping: false,
            breakpoints: Breakpoints::default(),
            done: false,
            deliver_interrupts: false,
            interruptible: true,
            pairing: false,
        }
    }
}

/// Linear addresses of hardware breakpoints, as many as the debug
/// registers hold ([`vtrace_x86::dr::BREAKPOINTS`]). A value, not a
/// borrow, so a plan outlives the question that gave it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Breakpoints {
    /// The addresses; past `len`, zero (so that equal sets compare equal).
    addrs: [u64; vtrace_x86::dr::BREAKPOINTS],
    len: u8,
}

impl Breakpoints {
    /// Adds `addr` unless it is there already; false where the debug
    /// registers are all taken (it is not added).
    pub fn push(&mut self, addr: u64) -> bool {
        if self.contains(addr) {
            return true;
        }
        let Some(slot) = self.addrs.get_mut(usize::from(self.len)) else {
            return false;
        };
        *slot = addr;
        self.len += 1;
        true
    }

    /// Whether `addr` is one of them.
    pub fn contains(&self, addr: u64) -> bool {
        self.as_slice().contains(&addr)
    }

    /// The addresses, in the order they were added.
    pub fn as_slice(&self) -> &[u64] {
        &self.addrs[..usize::from(self.len)]
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many free debug registers are left.
    pub fn room(&self) -> usize {
        self.addrs.len() - usize::from(self.len)
    }
}

/// What the monitor answers to an exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitAnswer {
    /// What the VMM does next.
    pub directive: Directive,
    /// How many instructions a single-step or HLT exit covered, for the
    /// step clock: one, except where the host ran REP iterations in a
    /// batch, held the trap back (STI shadow) or exited once more only to
    /// move past a finished REP. At an MMIO exit, the instructions that ran
    /// before the access without a trap of their own (REP iterations, a
    /// store the host ran on from): usually none. The same guest then sees
    /// the same virtual time at the same instruction on every host.
    pub instructions: u64,
}

impl ExitAnswer {
    /// Go on as the VMM would; the exit covered one instruction.
    pub const CONTINUE: ExitAnswer = ExitAnswer {
        directive: Directive::Continue,
        instructions: 1,
    };

    /// `directive`, the exit covering one instruction.
    pub fn new(directive: Directive) -> ExitAnswer {
        ExitAnswer {
            directive,
            instructions: 1,
        }
    }
}

/// What a monitor offers the user, for the console's and `vtrace ctl`'s
/// help.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Help {
    /// Console hotkeys, as `(key, meaning)`.
    pub hotkeys: Vec<(char, &'static str)>,
    /// `vtrace ctl` commands, as their usage (`mark [ID]`).
    pub commands: Vec<&'static str>,
}

/// A write to the vCPU or guest memory that did not happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// Some byte of the range is not guest RAM.
    #[error("guest-physical {0:#x} is not RAM")]
    NotRam(u64),
    /// KVM refused to set the registers.
    #[error("KVM did not set the registers")]
    Registers,
    /// KVM refused to set the model-specific register.
    #[error("KVM did not set MSR {0:#x}")]
    Msr(u32),
    /// The view cannot write at all (a read-only view).
    #[error("this view of the vCPU cannot write")]
    ReadOnly,
}

/// Read access to the vCPU and guest memory for the monitor (guest RAM
/// is read through [`PhysicalMemory`], as a page walk reads it). The VMM
/// implements it over KVM; tests implement it over plain data.
pub trait CpuView: PhysicalMemory {
    /// General registers as of this exit.
    fn regs(&mut self) -> Registers;
    /// System registers as of this exit.
    fn sregs(&mut self) -> SpecialRegisters;
    /// Writes guest-physical memory. Only for undoing what stepping
    /// itself left in guest memory, and for the semaphores of the guest's
    /// static probes.
    fn write_physical(&mut self, _gpa: u64, _data: &[u8]) -> Result<(), WriteError> {
        Err(WriteError::ReadOnly)
    }
    /// Writes the general registers. Only for what stepping with the trap
    /// flag needs (carrying TF across a return to user mode, hiding it
    /// from SYSCALL's R11).
    fn write_regs(&mut self, _regs: &Registers) -> Result<(), WriteError> {
        Err(WriteError::ReadOnly)
    }
    /// What a CPUID of `function`/`index` that returned `seen` (EAX, EBX,
    /// ECX, EDX) should have returned with the vCPU's table, where the
    /// host leaks its own bits.
    fn cpuid_as_given(&self, _function: u32, _index: u32, seen: [u32; 4]) -> [u32; 4] {
        seen
    }
    /// Reads a model-specific register; `None` if it cannot.
    fn read_msr(&mut self, _index: u32) -> Option<u64> {
        None
    }
    /// Writes a model-specific register. Only for keeping SYSCALL from
    /// clearing the tracer's TF.
    fn write_msr(&mut self, _index: u32, _value: u64) -> Result<(), WriteError> {
        Err(WriteError::ReadOnly)
    }
}

/// Observer of a running VM, asked one question at a time. Every method
/// has a default that does nothing, so [`NoMonitor`] is the VM without a
/// tracer.
///
/// Each pass of the run loop asks [`Monitor::plan_entry`] before it
/// delivers interrupts and again before it enters the guest, then
/// [`Monitor::before_entry`], and tells the exit with [`Monitor::on_exit`].
/// What the user asks of a run ([`Monitor::hotkey`], [`Monitor::control`])
/// is the monitor's to interpret: the VMM names none of its commands.
pub trait Monitor {
    /// What the monitor wants of the next entry. Cheap: asked twice a
    /// pass, so it must be a reading of state, not a change of it.
    fn plan_entry(&self) -> EntryPlan {
        EntryPlan::default()
    }

    /// An exception the instruction about to run will raise, for the VMM
    /// to deliver itself: where stepping rides on TF, one the CPU delivers
    /// runs its handler unstepped. Asked before every entry while
    /// stepping, after interrupts were delivered.
    fn exception_before_entry(&mut self) -> Option<Exception> {
        None
    }

    /// Called between exits, before the next entry is planned: a debugger
    /// holds the guest here while its user looks (registers and memory
    /// through `cpu`) and decides what it plans next (a single step,
    /// breakpoints). The VM stands still until it returns; it returns the
    /// host time it held the guest, which the guest's clock does not count.
    fn pause(&mut self, _cpu: &mut dyn CpuView) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// Called right before every `KVM_RUN` (after stepping was armed for
    /// it): a tracer that just started notes the instruction about to run.
    fn before_entry(&mut self, _cpu: &mut dyn CpuView) {}

    /// Called after every exit, before the VMM serves it further.
    fn on_exit(&mut self, _exit: &ExitView, _cpu: &mut dyn CpuView) -> ExitAnswer {
        ExitAnswer::CONTINUE
    }

    /// The steps the monitor is told of come from `engine` from now on:
    /// [`crate::EngineKind::Bochs`] where the CPU moved to the engine
    /// (nothing rides on the trap flag there: no fault needs foreseeing,
    /// no TF carrying or hiding), [`crate::EngineKind::Step`] where it
    /// moved back to KVM. Never called where the run has no engine.
    fn on_engine(&mut self, _engine: crate::EngineKind) {}

    /// On a machine of several CPUs, the run loop turns to CPU `cpu`: the
    /// exits, injections and entries that follow are that CPU's, until the
    /// next call. The turns go round in CPU order (see [`EntryPlan`]: each
    /// CPU gets its own debug configuration when its turn comes). Never
    /// called on a machine of one CPU.
    fn on_cpu(&mut self, _cpu: usize) {}

    /// On a machine of several CPUs, asked after each exit: whether the CPU
    /// on stage may hand the turn on now. A tracer keeps it where the
    /// hosts differ, by [`TurnSoFar::may_end`](crate::TurnSoFar::may_end),
    /// so that the CPUs interleave the same way on every host; the VMM
    /// moves on from a halted CPU anyway (the turn order's rules are in
    /// one room, `run_loop::turns`).
    fn turn_may_end(&self) -> bool {
        true
    }

    /// On a machine of several CPUs, while [`EntryPlan::pairing`]: whether
    /// the next step of CPU `cpu` (`view` shows it) may run at the same
    /// time as the next step of another CPU of which this is also true,
    /// with the same outcome as one after the other. The VMM asks before
    /// the CPU on stage steps, of it and of the CPU whose turn follows,
    /// and where both may, runs the second's step beside the first's and
    /// serves its exit when its turn comes, as if it had run then.
    fn runs_beside(&mut self, _cpu: usize, _view: &mut dyn CpuView) -> bool {
        false
    }

    /// The VMM injected external interrupt `vector` (from ISA `irq`,
    /// 0xfe for one from the CPU's local APIC, or `u8::MAX` for one it
    /// took back from KVM where tracing starts).
    fn on_inject(&mut self, _vector: u8, _irq: u8, _how: Injection, _cpu: &mut dyn CpuView) {}

    /// A hypercall the VMM does not serve itself (the tracing commands).
    /// Returns the status for the guest, or `None` if not handled.
    fn hypercall(&mut self, _call: &Hypercall) -> Option<i32> {
        None
    }

    /// The guest logged `text` with the LOG hypercall (reported right after
    /// the hypercall's exit).
    fn guest_log(&mut self, _text: &str) {}

    /// Samples the peeper took ([`crate::Vm::peep`]), in the order taken;
    /// they reach the monitor at the exit after they were taken.
    fn peeped(&mut self, _samples: &[crate::peep::PeepSample]) {}

    /// The guest stops running: `failure` says why when it did not end
    /// the way a guest may (triple fault, emulation failure...). Last chance
    /// to record.
    fn on_finish(&mut self, _cpu: &mut dyn CpuView, _how: crate::Finish<'_>) {}

    /// A console hotkey other than the VMM's own (`x`, `h`, `r`, `s`).
    /// Returns a line to show the user, or `None` if it means nothing here.
    fn hotkey(&mut self, _key: u8) -> Option<String> {
        None
    }

    /// A `vtrace ctl` command other than the VMM's own (`status`, `help`),
    /// as the user typed it. Returns the answer, or `None` if the monitor
    /// has no such command.
    fn control(&mut self, _command: &str) -> Option<String> {
        None
    }

    /// The monitor's part of the status line (`Ctrl-A s`, `vtrace ctl
    /// status`, the progress line), or `None` if it has nothing to say.
    fn status(&self) -> Option<String> {
        None
    }

    /// The hotkeys and commands the monitor answers.
    fn help(&self) -> Help {
        Help::default()
    }
}

/// The VM with nothing attached.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoMonitor;

impl Monitor for NoMonitor {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breakpoints_hold_four_distinct_addresses_in_order() {
        let mut b = Breakpoints::default();
        assert!(b.is_empty());
        for addr in [0x10, 0x20, 0x10, 0x30, 0x40] {
            assert!(b.push(addr), "{addr:#x} fits");
        }
        assert_eq!(b.as_slice(), &[0x10, 0x20, 0x30, 0x40]);
        assert_eq!(b.room(), 0);
        assert!(!b.push(0x50), "a fifth does not");
        assert!(b.push(0x20), "one already there still is");
        assert_eq!(b.as_slice().len(), 4);
    }

    #[test]
    fn equal_sets_compare_equal_however_they_were_built() {
        let mut a = Breakpoints::default();
        let mut b = Breakpoints::default();
        a.push(1);
        b.push(1);
        b.push(1);
        assert_eq!(a, b);
        assert_ne!(a, Breakpoints::default());
    }
}
