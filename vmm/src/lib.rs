//! `vtrace-vmm`: the thin KVM virtual machine monitor under vtrace.
//!
//! One vCPU, guest RAM through vm-memory, images loaded with linux-loader,
//! and every device in user space (no in-kernel irqchip or PIT) so that the
//! VMM decides when interrupts reach the guest. A [`Monitor`] observes and
//! steers the run; the tracer is one.
//!
//! ```no_run
//! use vtrace_vmm::{boot::{BootSource, Image}, ConsoleMode, CpuProfile, NoMonitor, Vm, VmConfig};
//! let config = VmConfig {
//!     boot: BootSource::RealMode { image: Image::from_file("image", "boot.bin")?, load_addr: 0x7c00 },
//!     memory: 16 << 20,
//!     cpu: CpuProfile::Baseline,
//!     console: ConsoleMode::OutputOnly,
//!     kvm_device: vtrace_vmm::KVM_DEVICE.into(),
//!     serial_out: Box::new(std::io::stdout()),
//!     clock: vtrace_vmm::clock::ClockMode::Wall,
//!     control: None,
//! };
//! let outcome = Vm::new(config)?.run(&mut NoMonitor)?;
//! println!("{:?}", outcome.exit);
//! # Ok::<(), vtrace_vmm::Error>(())
//! ```

pub mod boot;
pub mod clock;
pub mod console;
pub mod control;
pub mod cpu;
pub mod devices;
pub mod diagnostics;
mod error;
mod guest_text;
pub mod host;
mod kick;
pub mod memory;
pub mod monitor;
pub mod peep;
pub mod probe;
mod run_loop;
pub mod signals;
mod vcpu;
mod vm;
pub mod x86;

pub use cpu::cpuid::CpuProfile;
pub use error::{Error, Result};
pub use monitor::{
    CpuView, Directive, Exception, ExceptionKind, ExitView, Injection, Monitor, NoMonitor,
};
pub use run_loop::{Finish, GuestExit, RunOutcome};
pub use vm::{ConsoleMode, Vm, VmConfig, KVM_DEVICE};
