//! Building a VM: KVM, memory, the loaded image, the vCPU and devices.

use std::io::Write;
use std::path::{Path, PathBuf};

use kvm_ioctls::{Cap, Kvm, VmFd};

use crate::boot::{self, BootPlan, BootSource};
use crate::clock::{ClockMode, VirtualClock};
use crate::cpu::{cpuid, cpuid::CpuProfile, entry};
use crate::cpus::{Cpus, StepState};
use crate::devices::hypercall::HypercallPort;
use crate::devices::Devices;
use crate::diagnostics::ExitHistory;
use crate::error::KvmLack;
use crate::error::{Error, Result};
use crate::frontends::{ConsoleMode, Frontends, ProgressLine};
use crate::memory::{create_guest_ram, GuestRam, LowRam};
use crate::vcpu::Vcpu;

/// Default KVM device.
pub const KVM_DEVICE: &str = "/dev/kvm";

/// Everything that defines a VM.
pub struct VmConfig {
    /// What to boot.
    pub boot: BootSource,
    /// Guest RAM in bytes.
    pub memory: u64,
    /// The CPUID profile.
    pub cpu: CpuProfile,
    /// Whether the VM owns the terminal.
    pub console: ConsoleMode,
    /// Path of the KVM device (normally /dev/kvm).
    pub kvm_device: PathBuf,
    /// Where the guest's serial output goes.
    pub serial_out: Box<dyn Write + Send>,
    /// How virtual time follows host time.
    pub clock: ClockMode,
    /// Control socket for `vtrace ctl`, if any.
    pub control: Option<crate::control::ControlServer>,
    /// CPUs, 1 to [`MAX_CPUS`]. With more than one, the machine has a local
    /// APIC per CPU and ACPI tables that list them, and CPU 0 starts the
    /// others with INIT and STARTUP IPIs.
    pub cpus: u8,
}

/// The most CPUs a VM may have: the local APIC IDs of the xAPIC that
/// vtrace models are 8 bits, and 0xff means "every CPU".
pub const MAX_CPUS: u8 = 254;

impl std::fmt::Debug for VmConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmConfig").finish_non_exhaustive()
    }
}

/// A VM ready to run.
pub struct Vm {
    /// KVM's handles: the vCPU and the memory slots live as long as they.
    _kvm: Kvm,
    _vm: VmFd,
    /// Bochs's CPU, where the guest is traced on it
    /// ([`Vm::set_engine`]). Before `machine`: it runs on the RAM the
    /// machine owns, so it goes first.
    pub(crate) engine: Option<crate::engine::BochsCpu>,
    /// What the guest sees: the vCPU, its memory and devices, its clock.
    pub(crate) machine: Machine,
    /// Where single-stepping and the exit in flight stand.
    pub(crate) step: StepState,
    /// Single-step exits that ran nothing (see `cpu::echo`): whether the
    /// host echoes is the host's, not one CPU's, so an application
    /// processor's first, ambiguous echo is judged by what CPU 0 saw.
    pub(crate) echo: crate::cpu::echo::EchoWatch,
    /// The threads that enter CPUs 1, 2... while several CPUs are
    /// traced (see `crate::steppers`).
    pub(crate) steppers: crate::steppers::Steppers,
    /// What stands around the loop for the user: the console, the control
    /// socket, the peeper and the progress line.
    pub(crate) frontends: Frontends,
    boot: BootPlan,
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm").finish_non_exhaustive()
    }
}

/// The guest's machine, and what the VMM counts of it.
pub(crate) struct Machine {
    /// The vCPU on stage: the one the run loop enters (see `crate::cpus`).
    pub(crate) vcpu: Vcpu,
    /// The machine's CPUs: those off stage, and whose turn it is.
    pub(crate) cpus: Cpus,
    pub(crate) ram: GuestRam,
    /// `ram`'s region at 0, for the monitor's reads.
    pub(crate) low_ram: Option<LowRam>,
    /// The vCPU's CPUID table, for correcting CPUID results where the
    /// host leaks its own (see `CpuidTable::as_given`).
    pub(crate) cpuid: cpuid::CpuidTable,
    pub(crate) devices: Devices,
    pub(crate) hypercalls: HypercallPort,
    pub(crate) clock: VirtualClock,
    /// The last exits, for crash reports, and their count.
    pub(crate) history: ExitHistory,
    /// Instructions the VMM completed for KVM's emulator.
    pub(crate) completed_by_vmm: u64,
}

impl Machine {
    /// CPU `cpu`'s vCPU, on stage or parked.
    pub(crate) fn vcpu_of(&mut self, cpu: usize) -> Option<&mut Vcpu> {
        match cpu == self.cpus.on_stage() {
            true => Some(&mut self.vcpu),
            false => self.cpus.parked_vcpu(cpu),
        }
    }
}

/// Gives KVM the guest's RAM, one memory slot per region. The caller keeps
/// `ram` alive as long as `vm`.
pub(crate) fn register_ram(vm: &VmFd, ram: &GuestRam) -> Result<()> {
    for (slot, region) in vm_memory::GuestMemoryBackend::iter(ram).enumerate() {
        use vm_memory::{Address, GuestMemoryRegion};
        let mem_region = kvm_bindings::kvm_userspace_memory_region {
            slot: slot as u32,
            flags: 0,
            guest_phys_addr: region.start_addr().raw_value(),
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
        };
        // SAFETY: the region is a live mapping owned by `ram`, which the
        // caller keeps for as long as the VM fd exists.
        unsafe { vm.set_user_memory_region(mem_region) }
            .map_err(Error::kvm("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(())
}

pub(crate) fn open_kvm(path: &Path) -> Result<Kvm> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::KvmUnsupported(KvmLack::BadPath(path.to_path_buf())))?;
    let kvm = Kvm::new_with_path(&c_path).map_err(|e| Error::KvmUnavailable {
        path: path.to_path_buf(),
        source: std::io::Error::from_raw_os_error(e.errno()),
    })?;
    let version = kvm.get_api_version();
    if version != 12 {
        return Err(Error::KvmUnsupported(KvmLack::ApiVersion {
            path: path.to_path_buf(),
            version,
        }));
    }
    for (cap, name) in [
        (Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
        (Cap::SetGuestDebug, "KVM_CAP_SET_GUEST_DEBUG"),
        (Cap::SyncRegs, "KVM_CAP_SYNC_REGS"),
        (Cap::ImmediateExit, "KVM_CAP_IMMEDIATE_EXIT"),
    ] {
        if !kvm.check_extension(cap) {
            return Err(Error::KvmUnsupported(KvmLack::Capability(name)));
        }
    }
    Ok(kvm)
}

fn host_unix_time() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Vm {
    /// Opens KVM, reserves memory, loads the guest and prepares the vCPU.
    pub fn new(config: VmConfig) -> Result<Vm> {
        let kvm = open_kvm(&config.kvm_device)?;
        let vm = kvm.create_vm().map_err(Error::kvm("KVM_CREATE_VM"))?;
        // Needed by Intel hosts for real mode and the TSS of big real mode;
        // harmless elsewhere. Placed just below the BIOS area at 4 GiB.
        let _ = vm.set_tss_address(0xfffb_d000);
        let _ = vm.set_identity_map_address(0xfffb_c000);

        if !(1..=MAX_CPUS).contains(&config.cpus) {
            return Err(Error::CpuCount {
                asked: config.cpus,
                most: MAX_CPUS,
            });
        }
        let ram = create_guest_ram(config.memory)?;
        register_ram(&vm, &ram)?;

        let boot = boot::load(&ram, &config.boot, config.cpus)?;
        let cpuid = match config.cpus {
            1 => cpuid::build(&kvm, config.cpu)?,
            _ => cpuid::build(&kvm, config.cpu)?.with_local_apics()?,
        };
        let mut vcpu = Vcpu::new(&vm, 0)?;
        vcpu.set_cpuid(cpuid.entries())?;
        entry::apply(&mut vcpu, &ram, boot.entry)?;
        let mut others = Vec::new();
        for id in 1..config.cpus {
            let ap = Vcpu::new(&vm, id)?;
            ap.set_cpuid(&cpuid.for_cpu(id)?)?;
            others.push(ap);
        }

        Ok(Vm {
            _kvm: kvm,
            _vm: vm,
            engine: None,
            machine: Machine {
                vcpu,
                cpus: Cpus::new(others),
                low_ram: LowRam::of(&ram),
                ram,
                cpuid,
                devices: Devices::new(config.serial_out, host_unix_time(), config.cpus),
                hypercalls: HypercallPort::new(),
                clock: VirtualClock::new(config.clock),
                history: ExitHistory::default(),
                completed_by_vmm: 0,
            },
            step: StepState::default(),
            echo: crate::cpu::echo::EchoWatch::default(),
            steppers: crate::steppers::Steppers::default(),
            frontends: Frontends::new(config.console, config.control),
            boot,
        })
    }

    /// Samples guest memory as `plan` says from a host thread while the
    /// guest runs (see [`crate::PeepPlan`]); the monitor gets the samples
    /// through [`crate::Monitor::peeped`].
    pub fn peep(&mut self, plan: crate::peep::PeepPlan) -> Result<()> {
        crate::peep::check(&plan, &self.machine.ram)?;
        self.frontends.peep = Some(plan);
        Ok(())
    }

    /// Prints a status line (what `Ctrl-A s` shows) on the console every
    /// `every` of host time while the guest is single-stepped: progress
    /// for runs without a terminal to press keys on.
    pub fn report_progress(&mut self, every: std::time::Duration) {
        self.frontends.progress = Some(ProgressLine::new(every));
    }

    /// Traces the guest on `engine`: with [`crate::EngineKind::Bochs`], Bochs's
    /// CPU runs it while the monitor steps it (loaded now: the library
    /// may be missing), and KVM the rest.
    pub fn set_engine(&mut self, engine: crate::EngineKind) -> Result<()> {
        self.engine = match engine {
            crate::EngineKind::Step => None,
            crate::EngineKind::Bochs => Some(crate::engine::BochsCpu::open(
                &self.machine.ram,
                u8::try_from(self.machine.cpus.count()).unwrap_or(u8::MAX),
            )?),
        };
        Ok(())
    }

    /// The engine that runs the guest while it is traced.
    pub fn engine(&self) -> crate::EngineKind {
        match self.engine {
            Some(_) => crate::EngineKind::Bochs,
            None => crate::EngineKind::Step,
        }
    }

    /// Whether the engine holds the CPU on stage now (KVM's state of it is
    /// stale).
    pub(crate) fn on_engine(&self) -> bool {
        self.engine.as_ref().is_some_and(|e| e.holds())
    }

    /// How the guest was loaded, for the user.
    pub fn boot_description(&self) -> &str {
        &self.boot.description
    }
}
