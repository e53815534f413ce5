//! `vtrace doctor`: what this host's KVM lets a tracer see, and what that
//! means for a trace taken here.

use anyhow::Result;
use serde_json::json;
use vtrace_vmm::{examine_host as examine, Findings, ProbeEnding, Stepping};

use crate::cli::DoctorArgs;

/// Kernel code slower than this runs in KVM's instruction emulator (about
/// 1.1 M instructions/s measured here, 4 M on a faster CPU of the same
/// kind); hardware runs hundreds of millions, and nested binary translation
/// (the AMD-V test machine) 9 M to 30 M. Speed is only the fallback: see
/// [`kernel_code_emulated`].
const EMULATED_BELOW: f64 = 4e6;

/// Whether KVM emulates kernel code here. An instruction that ends in an
/// emulation failure at CPL 0 is proof that KVM's emulator ran it; hardware
/// virtualization runs every probed instruction itself. The speed alone
/// misjudged a fast host of the emulating kind (4.03 M/s, just over any line
/// that keeps nested hosts clear), so it decides only where no probe failed.
fn kernel_code_emulated(f: &Findings) -> bool {
    !lacking(f).is_empty() || f.kernel_code_rate < EMULATED_BELOW
}

fn ending(e: &ProbeEnding) -> String {
    match e {
        ProbeEnding::Done => "runs".into(),
        ProbeEnding::Vector(6) => "#UD (the CPU or its CPUID does not offer it)".into(),
        ProbeEnding::Vector(v) => format!("the guest took vector {v} through its IDT"),
        ProbeEnding::EmulationFailure => "KVM's emulator lacks it".into(),
        ProbeEnding::Breakpoint(at) => format!("breakpoint exit at {at:#x}"),
        ProbeEnding::Budget => "did not finish".into(),
        ProbeEnding::Other(what) => what.clone(),
    }
}

/// The host's kind, from what the probes saw first and flags second.
fn kind(f: &Findings) -> &'static str {
    let emulated = kernel_code_emulated(f);
    if f.paravirtual_module || (emulated && !f.user_stepping.works()) {
        "paravirtual"
    } else {
        f.cpu_virtualization.unwrap_or("hardware virtualization")
    }
}

fn stepping_line(s: &Stepping) -> String {
    let mut line = format!(
        "{} of {} instructions armed once, {} re-armed after each exit",
        s.seen, s.expected, s.seen_rearmed
    );
    match &s.ending {
        ProbeEnding::Vector(1) => line.push_str("; the guest received the #DB itself"),
        ProbeEnding::Done | ProbeEnding::Vector(6) => {
            if s.seen_rearmed == 0 {
                line.push_str("; the code ran to its end without a debug exit");
            } else if s.seen < s.expected && s.works() {
                line.push_str(
                    "; armed once, the trap flag was lost to an instruction that loads \
                     RFLAGS (the probe's IRETQ into user mode)",
                );
            }
        }
        other => line.push_str(&format!("; the probe ended with: {}", ending(other))),
    }
    if s.echoes > 0 {
        line.push_str(&format!(
            "; {} more exits ran nothing (KVM reports the trap of an instruction it \
             completed itself twice) and are passed over",
            s.echoes
        ));
    }
    line
}

fn rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.1} M", r / 1e6)
    } else {
        format!("{:.0} k", r / 1e3)
    }
}

/// What a trace taken here shows, row by row: (what, verdict).
fn consequences(f: &Findings) -> Vec<(&'static str, String)> {
    let mut rows = Vec::new();
    let trap_flag = f.user_stepping.works();
    rows.push((
        "kernel code (CPL 0)",
        if f.kernel_stepping.works() {
            if trap_flag {
                "every instruction; stepping rides on the trap flag, so vtrace re-arms it \
                 after instructions KVM handles and delivers interrupts and faults itself"
                    .to_string()
            } else {
                "every instruction, interrupt and exception handlers included (KVM \
                 emulates each one)"
                    .to_string()
            }
        } else {
            "NOT every instruction: expect gaps".to_string()
        },
    ));
    rows.push((
        "user code (CPL 3)",
        if trap_flag {
            "every instruction, system calls followed into the kernel and back".to_string()
        } else {
            "not shown: KVM does not intercept single-steps there; a trace marks each \
             stretch of user code with a gap"
                .to_string()
        },
    ));
    rows.push((
        "--start-at, --stop-at",
        if f.breakpoints_exit {
            "work (hardware breakpoints reach the VMM)".to_string()
        } else {
            "do not fire: breakpoints do not reach the VMM here; start tracing from the \
             host (vtrace ctl, Ctrl-A t), with a hypercall, or from the first instruction"
                .to_string()
        },
    ));
    rows.push(("a Linux kernel", linux_verdict(f)));
    let lacks: Vec<&str> = lacking(f);
    rows.push((
        "guest instructions",
        if lacks.is_empty() {
            "all probed instructions run".to_string()
        } else {
            format!(
                "a guest that runs {} at CPL 0 stops with exit status 81; --cpu baseline \
                 hides the CPUID bits of the ones a kernel checks for",
                lacks.join(", ")
            )
        },
    ));
    rows
}

/// What a Linux boot reaches here, from the findings: how fast its kernel
/// code runs, and whether its user space can run at all.
fn linux_verdict(f: &Findings) -> String {
    let mut verdict = if kernel_code_emulated(f) {
        format!(
            "boots with every kernel instruction emulated ({} instructions/s): a distribution \
             kernel takes tens of minutes to reach user space (add --clock prescale:200, or \
             timer interrupts take the time over)",
            rate(f.kernel_code_rate)
        )
    } else {
        "boots at the CPU's speed".to_string()
    };
    let mut stops = Vec::new();
    if lacking(f).contains(&"fnclex") {
        stops.push(
            "its first return to user mode stops at FNCLEX, an x87 instruction KVM's emulator \
             lacks (Linux's workaround for AMD's FXSAVE leak, taken on the baseline CPU; exit \
             status 81)",
        );
    }
    if f.syscall_enters_kernel == Some(false) {
        stops.push("SYSCALL from user mode enters the kernel at CPL 3 here");
    }
    if !stops.is_empty() {
        verdict += &format!(
            "; its user space cannot run: {}; trace Linux user space on a host with VT-x or \
             AMD-V",
            stops.join("; and ")
        );
    } else if f.syscall_enters_kernel == Some(true) {
        verdict += if f.user_stepping.works() {
            "; its user space runs and is traced, system calls followed into the kernel"
        } else {
            "; its user space runs, not stepped"
        };
    }
    verdict
}

fn lacking(f: &Findings) -> Vec<&'static str> {
    f.instructions
        .iter()
        .filter(|(_, e)| *e == ProbeEnding::EmulationFailure)
        .map(|(n, _)| *n)
        .collect()
}

fn stepping_json(s: &Stepping) -> serde_json::Value {
    json!({
        "expected": s.expected,
        "seen": s.seen,
        "seen_rearmed": s.seen_rearmed,
        "echoes": s.echoes,
        "works": s.works(),
        "ending": ending(&s.ending),
    })
}

/// Whether the second engine's library is there and loads: where it is,
/// or what is wrong and how to get it.
fn engine() -> std::result::Result<std::path::PathBuf, String> {
    let path = vtrace_bochs::Library::find().map_err(|e| e.to_string())?;
    vtrace_bochs::Library::load(&path)
        .map(|library| library.path().to_path_buf())
        .map_err(|e| e.to_string())
}

pub fn doctor(args: DoctorArgs) -> Result<i32> {
    if !args.json {
        say!(
            "vtrace doctor: running probe guests on {}...",
            vtrace_vmm::KVM_DEVICE
        );
    }
    let f = examine(std::path::Path::new(vtrace_vmm::KVM_DEVICE))?;
    let rows = consequences(&f);
    let engine = engine();
    if args.json {
        let mut findings = findings_json(&f, &rows);
        findings["engine"] = match &engine {
            Ok(path) => json!({ "library": path, "problem": null }),
            Err(why) => json!({ "library": null, "problem": why }),
        };
        println!("{}", serde_json::to_string_pretty(&findings)?);
    } else {
        print_findings(&f, &rows);
        match &engine {
            Ok(path) => println!(
                "engine:       Bochs's CPU is built ({}): `vtrace run --engine bochs` traces on \
                 it (with --cpus, in stepping's order of turns; the traced stretches only, KVM \
                 runs the rest)",
                path.display()
            ),
            Err(why) => println!("engine:       {why}"),
        }
    }
    Ok(0)
}

/// The findings and what they mean for a trace, as `--json` prints them.
fn findings_json(f: &Findings, rows: &[(&str, String)]) -> serde_json::Value {
    json!({
        "kind": kind(f),
        "cpu_vendor": f.cpu_vendor,
        "cpu_virtualization": f.cpu_virtualization,
        "paravirtual_module": f.paravirtual_module,
        "kernel_code_emulated": kernel_code_emulated(f),
        "kernel_code_rate": f.kernel_code_rate,
        "kernel_stepping": stepping_json(&f.kernel_stepping),
        "user_stepping": stepping_json(&f.user_stepping),
        "trap_flag_stepping": f.user_stepping.works(),
        "syscall_enters_kernel": f.syscall_enters_kernel,
        "breakpoints_exit": f.breakpoints_exit,
        "watchpoints_exit": f.watchpoints_exit,
        "instructions": f.instructions.iter().map(|(n, e)| json!({
            "name": n,
            "result": ending(e),
        })).collect::<Vec<_>>(),
        "emulator_lacks": lacking(f),
        "cpuid_leaks": f.cpuid_leaks.iter().map(|(leaf, reg, bit)| json!({
            "leaf": leaf,
            "register": format!("e{reg}x"),
            "bit": bit,
        })).collect::<Vec<_>>(),
        "baseline_dropped": f.baseline_dropped.iter().map(|(leaf, reg, bit)| json!({
            "leaf": leaf,
            "register": format!("e{reg}x"),
            "bit": bit,
        })).collect::<Vec<_>>(),
        "step_rate": f.step_rate,
        "trace_shows": rows.iter().map(|(what, verdict)| json!({
            "what": what,
            "verdict": verdict,
        })).collect::<Vec<_>>(),
    })
}

/// The findings and what they mean for a trace, for people.
fn print_findings(f: &Findings, rows: &[(&str, String)]) {
    let module = if f.paravirtual_module {
        ", kvm_pvm loaded"
    } else {
        ""
    };
    println!(
        "host:         {} CPU, {} advertised{module}",
        f.cpu_vendor,
        f.cpu_virtualization.unwrap_or("no VT-x or AMD-V")
    );
    println!("KVM:          {}", kind(f));
    println!(
        "kernel code:  {} ({} instructions/s untraced)",
        if kernel_code_emulated(f) {
            "emulated by KVM"
        } else {
            "runs natively"
        },
        rate(f.kernel_code_rate)
    );
    println!("stepping:");
    println!("  CPL 0       {}", stepping_line(&f.kernel_stepping));
    println!("  CPL 3       {}", stepping_line(&f.user_stepping));
    println!(
        "SYSCALL:      {}",
        match f.syscall_enters_kernel {
            Some(true) => "from CPL 3 enters the kernel at CPL 0",
            Some(false) =>
                "from CPL 3 enters the kernel's entry at CPL 3 (its first privileged \
                            instruction faults)",
            None => "the probe could not tell where SYSCALL from CPL 3 lands",
        }
    );
    println!(
        "breakpoints:  {}",
        if f.breakpoints_exit {
            "a hardware breakpoint stops the VMM"
        } else {
            "a hardware breakpoint does not stop the VMM"
        }
    );
    println!(
        "watchpoints:  {}",
        if f.watchpoints_exit {
            "a hardware data breakpoint stops the VMM after the store"
        } else {
            "a hardware data breakpoint does not stop the VMM"
        }
    );
    println!("instructions at CPL 0:");
    for (name, e) in &f.instructions {
        println!("  {name:<12}{}", ending(e));
    }
    if f.cpuid_leaks.is_empty() {
        println!("CPUID:        the guest sees what --cpu baseline gives it");
    } else {
        println!(
            "CPUID:        set in the guest though --cpu baseline clears them (a trace corrects \
             each CPUID it steps):"
        );
        print_bits(&f.cpuid_leaks);
    }
    if f.baseline_dropped.is_empty() {
        println!("baseline CPU: all of it runs here, the same CPU as on every host");
    } else {
        println!(
            "baseline CPU: features this host's KVM lacks, left out (a guest that asks for them \
             traces differently than on other hosts):"
        );
        print_bits(&f.baseline_dropped);
    }
    println!(
        "step rate:    {} steps/s (bare single-step at CPL 0)",
        rate(f.step_rate)
    );
    println!();
    println!("what a trace taken here shows:");
    for (what, verdict) in rows {
        println!("  {what:<22}{verdict}");
    }
}

/// CPUID bits, one line a register: "  leaf 0x1 ecx bits 0 1 9".
fn print_bits(bits: &[(u32, char, u8)]) {
    let mut groups: Vec<(u32, char, Vec<u8>)> = Vec::new();
    for &(leaf, reg, bit) in bits {
        match groups.last_mut() {
            Some((l, r, bits)) if *l == leaf && *r == reg => bits.push(bit),
            _ => groups.push((leaf, reg, vec![bit])),
        }
    }
    for (leaf, reg, bits) in groups {
        let bits: Vec<String> = bits.iter().map(u8::to_string).collect();
        println!("  leaf {leaf:#x} e{reg}x bits {}", bits.join(" "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn findings(rate: f64, int3: ProbeEnding) -> Findings {
        let stepping = Stepping {
            expected: 1002,
            seen: 1002,
            seen_rearmed: 1002,
            echoes: 0,
            ending: ProbeEnding::Done,
        };
        Findings {
            cpu_vendor: "GenuineIntel".into(),
            cpu_virtualization: None,
            paravirtual_module: false,
            kernel_code_rate: rate,
            kernel_stepping: stepping.clone(),
            user_stepping: stepping,
            syscall_enters_kernel: Some(true),
            breakpoints_exit: true,
            watchpoints_exit: false,
            instructions: vec![("int3", int3)],
            cpuid_leaks: Vec::new(),
            baseline_dropped: Vec::new(),
            step_rate: 80_000.0,
        }
    }

    #[test]
    fn an_emulation_failure_proves_emulation_whatever_the_speed() {
        // The CI host of the emulating kind: 4.03 M/s, INT3 beyond the emulator.
        assert!(kernel_code_emulated(&findings(
            4.03e6,
            ProbeEnding::EmulationFailure
        )));
        // Hardware (or nested translation): every probe runs, speed far above.
        assert!(!kernel_code_emulated(&findings(
            2.0e7,
            ProbeEnding::Vector(3)
        )));
        // No probe failed: the speed is all there is to go on.
        assert!(kernel_code_emulated(&findings(
            1.1e6,
            ProbeEnding::Vector(3)
        )));
    }
}
