//! The hook through which a tracer observes and steers the VM. The VMM calls
//! it at the points a tracer needs and otherwise knows nothing of tracing.

use crate::devices::hypercall::Hypercall;
use crate::x86::{Registers, SpecialRegisters};

/// What the VMM saw at an exit, as the monitor needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitView {
    /// Single-step or breakpoint exit: one instruction ran (or a
    /// breakpoint was hit before one did).
    Debug {
        /// A breakpoint was hit (the instruction at it has not run).
        breakpoint: bool,
    },
    /// `OUT`. Where KVM's emulator ran it (this project's hosts) it has
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
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// Read access to the vCPU and guest memory for the monitor. The VMM
/// implements it over KVM; tests implement it over plain data.
pub trait CpuView {
    /// General registers as of this exit.
    fn regs(&mut self) -> Registers;
    /// System registers as of this exit.
    fn sregs(&mut self) -> SpecialRegisters;
    /// Reads guest-physical memory; false if any byte is not RAM.
    fn read_physical(&self, gpa: u64, buf: &mut [u8]) -> bool;
    /// Writes guest-physical memory; false if any byte is not RAM. Only
    /// for undoing what stepping itself left in guest memory, and for
    /// the semaphores of the guest's static probes.
    fn write_physical(&mut self, _gpa: u64, _data: &[u8]) -> bool {
        false
    }
    /// Writes the general registers; false if it cannot. Only for what
    /// stepping with the trap flag needs (carrying TF across a return to
    /// user mode, hiding it from SYSCALL's R11).
    fn write_regs(&mut self, _regs: &Registers) -> bool {
        false
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
    /// Writes a model-specific register; false if it cannot. Only for
    /// keeping SYSCALL from clearing the tracer's TF.
    fn write_msr(&mut self, _index: u32, _value: u64) -> bool {
        false
    }
}

/// Observer of a running VM. Every method has a default that does nothing,
/// so [`NoMonitor`] is the VM without a tracer.
pub trait Monitor {
    /// A hypercall the VMM does not serve itself (the tracing commands).
    /// Returns the status for the guest, or `None` if not handled.
    fn hypercall(&mut self, _call: &Hypercall) -> Option<i32> {
        None
    }

    /// A console hotkey other than the VMM's own (`x`, `h`, `r`, `s`).
    /// Returns a line to show the user, or `None` if it means nothing here.
    fn hotkey(&mut self, _key: u8) -> Option<String> {
        None
    }

    /// A `vtrace ctl` command (`start`, `stop`, `mark`, `status`...).
    /// Returns the answer, or `None` if the monitor has no such command.
    fn control(&mut self, _command: &str) -> Option<String> {
        None
    }

    /// Lines for the console help (`Ctrl-A h`), as `(key, meaning)`.
    fn hotkey_help(&self) -> Vec<(char, &'static str)> {
        Vec::new()
    }

    /// Whether the vCPU must single-step from the next entry on. Asked
    /// before every `KVM_RUN`; cheap.
    fn stepping(&self) -> bool {
        false
    }

    /// Whether the monitor is done with the guest and the run should end
    /// ([`crate::GuestExit::MonitorDone`]). Asked before every `KVM_RUN`.
    fn done(&self) -> bool {
        false
    }

    /// Linear addresses where the guest must stop with a debug exit
    /// (hardware breakpoints, at most 4). Asked before every `KVM_RUN`.
    fn breakpoints(&self) -> &[u64] {
        &[]
    }

    /// Called right before every `KVM_RUN` (after stepping was armed for
    /// it): a tracer that just started notes the instruction about to run.
    fn before_entry(&mut self, _cpu: &mut dyn CpuView) {}

    /// Called after every exit, before the VMM serves it further.
    fn on_exit(&mut self, _exit: &ExitView, _cpu: &mut dyn CpuView) -> Directive {
        Directive::Continue
    }

    /// The guest logged `text` with the LOG hypercall (reported right after
    /// the hypercall's exit).
    fn guest_log(&mut self, _text: &str) {}

    /// Whether the VMM should deliver interrupts through the guest's IDT
    /// itself (so that a stepped guest enters the handler under stepping on
    /// every host) rather than queue them with `KVM_INTERRUPT`.
    fn deliver_interrupts(&self) -> bool {
        false
    }

    /// An exception the instruction about to run will raise, for the VMM
    /// to deliver itself: where stepping rides on TF, one the CPU delivers
    /// runs its handler unstepped. Asked before every entry while
    /// stepping, after interrupts were delivered.
    fn exception_before_entry(&mut self) -> Option<Exception> {
        None
    }

    /// How many instructions the last single-step exit covered, for the
    /// step clock: one, except where the host ran REP iterations in a
    /// batch, held the trap back (STI shadow) or exited once more only to
    /// move past a finished REP. The same guest then sees the same virtual
    /// time at the same instruction on every host.
    fn instructions_at_exit(&self) -> u64 {
        1
    }

    /// Whether an interrupt may be delivered before the next instruction.
    /// A tracer says no between the iterations of a REP string
    /// instruction, so that interrupts land at the same steps on hosts that
    /// run iterations one at a time and on hosts that batch them.
    fn interruptible(&self) -> bool {
        true
    }

    /// The VMM injected external interrupt `vector` (from ISA `irq`, or
    /// `u8::MAX` for one it took back from KVM where tracing starts).
    fn on_inject(&mut self, _vector: u8, _irq: u8, _how: Injection, _cpu: &mut dyn CpuView) {}

    /// Samples the peeper took ([`crate::Vm::peep`]), in the order taken;
    /// they reach the monitor at the exit after they were taken.
    fn peeped(&mut self, _samples: &[crate::peep::PeepSample]) {}

    /// The guest stops running: `failure` says why when it did not end
    /// the way a guest may (triple fault, emulation failure...). Last chance
    /// to record.
    fn on_finish(&mut self, _cpu: &mut dyn CpuView, _how: crate::Finish<'_>) {}
}

/// The VM with nothing attached.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoMonitor;

impl Monitor for NoMonitor {}
