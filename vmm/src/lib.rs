//! `vtrace-vmm`: the thin KVM virtual machine monitor under vtrace.
//!
//! One or more vCPUs, guest RAM through vm-memory, images loaded with linux-loader,
//! and every device in user space (no in-kernel irqchip or PIT) so that the
//! VMM decides when interrupts reach the guest. A [`Monitor`] observes and
//! steers the run; the tracer is one.
//!
//! ```no_run
//! use vtrace_vmm::{BootSource, Image, ConsoleMode, CpuProfile, NoMonitor, Vm, VmConfig};
//! let config = VmConfig {
//!     boot: BootSource::RealMode { image: Image::from_file("image", "boot.bin")?, load_addr: 0x7c00 },
//!     memory: 16 << 20,
//!     cpu: CpuProfile::Baseline,
//!     console: ConsoleMode::OutputOnly,
//!     kvm_device: vtrace_vmm::KVM_DEVICE.into(),
//!     serial_out: Box::new(std::io::stdout()),
//!     clock: vtrace_vmm::ClockMode::Wall,
//!     control: None,
//!     cpus: 1,
//! };
//! let outcome = Vm::new(config)?.run(&mut NoMonitor)?;
//! println!("{:?}", outcome.exit);
//! # Ok::<(), vtrace_vmm::Error>(())
//! ```

mod boot;
mod clock;
mod console;
mod control;
mod cpu;
mod cpus;
mod devices;
mod diagnostics;
mod engine;
mod error;
mod frontends;
mod guest_text;
mod host;
mod kick;
mod memory;
mod monitor;
mod peep;
mod probe;
mod run_loop;
mod signals;
mod steppers;
mod vcpu;
mod vm;

// The crate's API. The modules are private: what a user of the VMM needs is
// named here, so a module can be split or moved without breaking callers.

// Building and running a VM.
pub use boot::{default_linux_cmdline, BootSource, Image, Initrd, MAX_IMAGE};
pub use clock::ClockMode;
pub use cpu::cpuid::CpuProfile;
pub use engine::EngineKind;
pub use error::{Error, KvmLack, LayoutFault, PeepError, Result};
pub use frontends::ConsoleMode;
pub use run_loop::{Finish, GuestExit, RunOutcome};
pub use vm::{Vm, VmConfig, KVM_DEVICE, MAX_CPUS};

// The seam to a tracer.
pub use devices::hypercall::Hypercall;
pub use monitor::{
    Breakpoints, CpuView, Directive, EntryPlan, Exception, ExceptionKind, ExitAnswer, ExitView,
    Help, Injection, Monitor, NoMonitor, WriteError,
};
pub use peep::{PeepPlan, PeepRead, PeepReport, PeepSample, MAX_READS as MAX_PEEP_READS};
pub use run_loop::turns::TurnSoFar;

// The host and the process around a run.
pub use console::user_message;
pub use control::{ControlError, ControlServer};
pub use diagnostics::CrashReport;
pub use guest_text::{escape as escape_text, escape_within_line};
pub use host::steps_with_trap_flag;
pub use probe::{examine as examine_host, Findings, ProbeEnding, Stepping};

/// The control socket's client side and where sockets live (`vtrace ctl`).
pub mod control_socket {
    pub use crate::control::{default_dir, default_path, send};
}

/// Stop signals (SIGINT, SIGTERM, SIGHUP) for the life of a run.
pub mod stop_signals {
    pub use crate::signals::{catch_stop_signals as catch, caught, name, STOP_SIGNALS};
}

/// Internals the fuzz targets drive directly; not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::boot::load;
    pub use crate::devices::hypercall::{HypercallOutcome, HypercallPort};
    pub use crate::memory::{create_guest_ram, GuestRam};
    pub use crate::memory::{BadAddress, GuestVirtualMemory};
}
