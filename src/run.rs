//! `vtrace run`.

use anyhow::Result;
use vtrace_vmm::boot::{default_linux_cmdline, BootSource, Image};
use vtrace_vmm::console::user_message;
use vtrace_vmm::{ConsoleMode, CpuProfile, GuestExit, NoMonitor, RunOutcome, Vm, VmConfig};

use crate::cli::{CpuArg, RunArgs};
use crate::exit_status::GUEST_RESET;

fn cpu_profile(args: &RunArgs) -> CpuProfile {
    match args.cpu {
        CpuArg::Baseline => CpuProfile::Baseline,
        CpuArg::Host => CpuProfile::Host,
    }
}

fn boot_source(args: &RunArgs) -> Result<BootSource> {
    if let Some(path) = &args.real_mode {
        return Ok(BootSource::RealMode {
            image: Image::from_file("real-mode image", path)?,
            load_addr: args.load_addr,
        });
    }
    Ok(match &args.kernel {
        Some(path) => BootSource::Kernel {
            kernel: Image::from_file("kernel", path)?,
            initrd: args
                .initrd
                .as_ref()
                .map(|p| Image::from_file("initrd", p))
                .transpose()?,
            cmdline: args
                .append
                .clone()
                .unwrap_or_else(|| default_linux_cmdline(cpu_profile(args))),
        },
        None => BootSource::Kernel {
            kernel: Image::embedded("built-in demo OS", vtrace_demo::DEMO_OS_ELF),
            initrd: None,
            cmdline: args.append.clone().unwrap_or_default(),
        },
    })
}

/// Peak resident memory of this process, from /proc.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn summary(outcome: &RunOutcome) -> String {
    let how = match outcome.exit {
        GuestExit::Status(s) => format!("guest exited with status {s}"),
        GuestExit::Reset => "guest reset the machine".to_string(),
        GuestExit::UserQuit => "quit by the user".to_string(),
    };
    let rss = peak_rss_bytes()
        .map(|b| format!(", peak RSS {} MiB", b >> 20))
        .unwrap_or_default();
    format!(
        "vtrace: {how} after {:.2} s (virtual time {:.3} s): {} timer interrupts, {} exits{rss}",
        outcome.host_time.as_secs_f64(),
        outcome.virtual_time.as_secs_f64(),
        outcome.timer_interrupts(),
        outcome.exits,
    )
}

pub fn run(args: RunArgs) -> Result<i32> {
    let config = VmConfig {
        boot: boot_source(&args)?,
        memory: args.memory,
        cpu: cpu_profile(&args),
        console: if args.no_input {
            ConsoleMode::OutputOnly
        } else {
            ConsoleMode::Interactive
        },
        kvm_device: args.kvm_device.clone(),
        serial_out: Box::new(std::io::stdout()),
        clock: args.clock,
    };
    let mut vm = Vm::new(config)?;
    if !args.quiet {
        user_message(&format!("vtrace: booting {}", vm.boot_description()));
        if !args.no_input {
            user_message("vtrace: Ctrl-A h for help, Ctrl-A x to quit");
        }
    }
    let outcome = vm.run(&mut NoMonitor)?;
    if !args.quiet {
        user_message(&summary(&outcome));
    }
    Ok(match outcome.exit {
        GuestExit::Status(s) => i32::from(s),
        GuestExit::Reset => GUEST_RESET,
        GuestExit::UserQuit => 0,
    })
}
