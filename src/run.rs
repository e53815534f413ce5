//! `vtrace run`.

use std::path::PathBuf;

use anyhow::Result;
use vtrace_session::{PeepRequest, SessionBuilder, SessionOutcome, TraceRequest, DEFAULT_TRACE};
use vtrace_trap::{CaptureCount, ProbeCount, ProbeTroubles, WindowCount};
use vtrace_vmm::user_message;
use vtrace_vmm::{default_linux_cmdline, BootSource, Image, Initrd};
use vtrace_vmm::{stop_signals as signals, ConsoleMode, CpuProfile, GuestExit, RunOutcome};

use crate::cli::{CpuArg, RunArgs};
use crate::exit_status::BadArgument;

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
            initrd: args.initrd.as_ref().map(Initrd::from_file).transpose()?,
            cmdline: command_line(
                args.cmdline
                    .clone()
                    .unwrap_or_else(|| default_linux_cmdline(cpu_profile(args), args.cpus)),
                args.append.as_deref(),
            ),
        },
        None if args.cpus > vtrace_demo::DEMO_OS_MAX_CPUS => {
            return Err(BadArgument(format!(
                "--cpus {}: the built-in demo OS starts at most {} CPUs (the others would wait \
                 for it forever); boot a kernel of your own with --kernel for more",
                args.cpus,
                vtrace_demo::DEMO_OS_MAX_CPUS
            ))
            .into())
        }
        None => BootSource::Kernel {
            kernel: match args.cpus {
                1 => Image::embedded("built-in demo OS", vtrace_demo::DEMO_OS_ELF),
                _ => Image::embedded("built-in demo OS (SMP)", vtrace_demo::DEMO_OS_SMP_ELF),
            },
            initrd: None,
            cmdline: command_line(
                args.cmdline.clone().unwrap_or_default(),
                args.append.as_deref(),
            ),
        },
    })
}

/// The kernel command line: `base` (the default or --cmdline's), then
/// --append's words.
fn command_line(base: String, append: Option<&str>) -> String {
    match append.map(str::trim).filter(|a| !a.is_empty()) {
        Some(more) if base.is_empty() => more.to_string(),
        Some(more) => format!("{base} {more}"),
        None => base,
    }
}

/// Peak resident memory of this process, from /proc.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The run's last line; `gdb`: gdb could end it (`kill`).
fn summary(outcome: &RunOutcome, gdb: bool, exit_after_trace: bool) -> String {
    let how = match outcome.exit {
        GuestExit::Status(s) => format!("guest exited with status {s}"),
        GuestExit::Reset => "guest rebooted (reset the machine)".to_string(),
        GuestExit::PowerOff => "guest powered off".to_string(),
        GuestExit::UserQuit => "quit by the user".to_string(),
        GuestExit::MonitorDone => match (gdb, exit_after_trace) {
            (true, false) => "run ended by gdb (kill)",
            (true, true) => "run ended by gdb (kill), or when tracing stopped (--exit-after-trace)",
            (false, _) => "run ended when tracing stopped (--exit-after-trace)",
        }
        .to_string(),
        GuestExit::Signal(signal) => format!("stopped by {}", signals::name(signal)),
    };
    let rss = peak_rss_bytes()
        .map(|b| format!(", peak RSS {} MiB", b >> 20))
        .unwrap_or_default();
    let hidden = match outcome.guest_lines_not_shown {
        0 => String::new(),
        n => format!(", {n} guest lines not shown (rate limit)"),
    };
    let apic = match outcome.local_apic_interrupts {
        0 => String::new(),
        n => format!(", {n} local APIC interrupts (timers, IPIs)"),
    };
    let paused = match outcome.pair_pauses {
        0 => String::new(),
        n => format!(" ({})", pair_pauses_words(n)),
    };
    let paired = match outcome.step_pairs {
        0 => String::new(),
        n => format!(", {n} step pairs run at once{paused}"),
    };
    format!(
        "vtrace: {how} after {:.2} s (virtual time {:.3} s): {} timer interrupts{apic}, {} \
         exits{paired}{rss}{hidden}",
        outcome.host_time.as_secs_f64(),
        outcome.virtual_time.as_secs_f64(),
        outcome.timer_interrupts(),
        outcome.exits,
    )
}

/// How often pairing paused, and why: "paused once: ...", "paused 3
/// times: ...".
pub fn pair_pauses_words(pauses: u32) -> String {
    let times = match pauses {
        1 => "once".to_string(),
        n => format!("{n} times"),
    };
    format!("paused {times}: the host's cores were busy")
}

/// Whether the run traces at all: from the start, on a trigger, or on a
/// disk that `vtrace ctl` or the guest may start; captures need a disk.
fn tracing_asked(args: &RunArgs) -> bool {
    args.trace
        || args.disk.is_some()
        || args.start_at.is_some()
        || !args.captures.is_empty()
        || !args.trace_functions.is_empty()
        || !args.probes.is_empty()
        || args.peep.is_some()
}

/// "vtrace: captures: kprintf 41, fault 3 (3 with bytes not present)".
fn capture_summary(counts: &[CaptureCount]) -> String {
    let each: Vec<String> = counts
        .iter()
        .map(|c| match c.short {
            0 => format!("{} {}", c.name, c.taken),
            n => format!("{} {} ({n} with bytes not present)", c.name, c.taken),
        })
        .collect();
    format!(
        "vtrace: captures: {} (`vtrace analyze captures` lists them)",
        each.join(", ")
    )
}

/// Probes that did not fire named one by one in the run's summary, at
/// most: a glob such as `'tp:syscalls:*'` enables hundreds.
const SILENT_PROBES_NAMED: usize = 8;

/// "vtrace: probes: sched:switch 42, fn:schedule 90": those enabled at the
/// end or that fired (past [`SILENT_PROBES_NAMED`] that did not, a count).
fn probe_summary(counts: &[ProbeCount], troubles: ProbeTroubles) -> Option<String> {
    let shown: Vec<&ProbeCount> = counts.iter().filter(|c| c.shown()).collect();
    let silent = shown.iter().filter(|c| c.count == 0).count();
    let mut each: Vec<String> = shown
        .iter()
        .filter(|c| c.count > 0 || silent <= SILENT_PROBES_NAMED)
        .map(|c| format!("{} {}", c.probe, c.count))
        .collect();
    if silent > SILENT_PROBES_NAMED {
        each.push(format!("{silent} more enabled that did not fire"));
    }
    let mut trouble = String::new();
    if troubles.unknown_sites > 0 {
        trouble += &format!(
            "; {} probe hypercalls came from sites no note of the kernel describes",
            troubles.unknown_sites
        );
    }
    if troubles.unwatched_returns > 0 {
        trouble += &format!(
            "; {} fnret: calls entered while tracing was off returned unseen (no debug \
             register was left for their return address)",
            troubles.unwatched_returns
        );
    }
    if troubles.unwritable_semaphores > 0 {
        trouble += &format!(
            "; {} semaphore writes found no guest RAM (those sites did not switch)",
            troubles.unwritable_semaphores
        );
    }
    (!each.is_empty() || !trouble.is_empty()).then(|| {
        format!(
            "vtrace: probes: {}{trouble} (`vtrace analyze probes` counts them in the trace)",
            each.join(", ")
        )
    })
}

/// "vtrace: --trace-function page_fault: 9 calls, 9 returned" and what
/// else the windows came to.
fn window_summary(c: &WindowCount) -> String {
    let plural = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let mut parts = vec![
        plural(c.calls, "call", "calls"),
        format!("{} returned", c.returned),
    ];
    if c.unfinished > 0 {
        parts.push(format!(
            "{} still running when tracing stopped (a routine that never returns, such as a \
             task's entry, or the run ended)",
            c.unfinished
        ));
    }
    if c.recursive > 0 {
        parts.push(plural(c.recursive, "recursive call", "recursive calls"));
    }
    if c.elsewhere > 0 {
        parts.push(format!(
            "{} on other CPUs while a call was traced (not traced: one call at a time)",
            plural(c.elsewhere, "call", "calls")
        ));
    }
    if c.switched_out > 0 {
        parts.push(format!(
            "its task switched out {} (not recorded meanwhile)",
            plural(c.switched_out, "time", "times")
        ));
    }
    format!("vtrace: --trace-function {}: {}", c.name, parts.join(", "))
}

/// What `args` ask to trace, if anything.
fn trace_request(args: &RunArgs) -> Result<Option<TraceRequest>> {
    if !tracing_asked(args) {
        if args.exit_after_trace {
            return Err(BadArgument(
                "--exit-after-trace needs tracing: add --trace, --disk or --start-at".into(),
            )
            .into());
        }
        return Ok(None);
    }
    Ok(Some(TraceRequest {
        disk: args.disk.clone().unwrap_or_else(|| DEFAULT_TRACE.into()),
        replace: args.force,
        disk_size: args.disk_size,
        segment_size: args.segment_size as u32,
        wrap: args.wrap,
        from_start: args.trace,
        engine: args.engine.into(),
        max_steps: args.max_steps,
        record_values: args.record_values,
        start_at: args.start_at.clone(),
        stop_at: args.stop_at.clone(),
        exit_after_trace: args.exit_after_trace,
        serial_steps: args.serial_steps,
        obey_guest: !args.ignore_guest_tracing,
        autostop: args.autostop.0.clone(),
        captures: args.captures.clone(),
        functions: args.trace_functions.clone(),
        probes: args.probes.clone(),
        peep: args.peep.map(|interval| PeepRequest {
            interval,
            samples: args.samples.clone(),
            pc: args.sample_pc,
        }),
    }))
}

/// What the user needs to know before the guest runs: notes, the boot
/// line, where gdb and `vtrace ctl` connect. gdb's address is said even
/// with --quiet: a port the system chose is known no other way.
fn announce(session: &vtrace_session::Session, args: &RunArgs) {
    if !args.quiet {
        for note in session.notes() {
            user_message(note);
        }
        user_message(&format!("vtrace: booting {}", session.boot_description()));
    }
    if let Some(address) = session.gdb_address() {
        let when = match args.gdb_wait {
            true => "; the guest waits for it before its first instruction",
            false => "",
        };
        user_message(&format!(
            "vtrace: gdb can attach at {address} (in gdb: `target remote {address}`){when}"
        ));
        if let Some((file, what)) = session.gdb_symbols().filter(|_| !args.quiet) {
            user_message(&format!(
                "vtrace: gdb loads the kernel's symbols from {} ({what})",
                file.display()
            ));
        }
    }
    if !args.quiet {
        if let Some(path) = session.control_socket() {
            user_message(&format!(
                "vtrace: control socket {} (vtrace ctl start|stop|mark|status)",
                path.display()
            ));
        }
        if !args.no_input {
            user_message("vtrace: Ctrl-A h for help, Ctrl-A x to quit");
        }
    }
}

pub fn run(args: RunArgs) -> Result<i32> {
    // From the start: a signal while the kernel loads or the disk is made
    // ends the run at its first exit, with the disk in order.
    signals::catch()?;
    let mut builder = SessionBuilder::new(boot_source(&args)?)
        .memory(args.memory)
        .cpus(args.cpus)
        .cpu(cpu_profile(&args))
        .console(match args.no_input {
            true => ConsoleMode::OutputOnly,
            false => ConsoleMode::Interactive,
        })
        .kvm_device(args.kvm_device.clone())
        .clock(args.clock)
        .control_socket(args.control.clone())
        .version(env!("VTRACE_LONG_VERSION"));
    if args.no_input && !args.quiet && !args.progress.is_zero() {
        builder = builder.progress(args.progress);
    }
    if let Some(request) = trace_request(&args)? {
        builder = builder.trace(request);
    }
    if let Some(addr) = &args.gdb {
        let listen = vtrace_gdb::Listen::parse(addr)?;
        builder = builder.gdb(listen, args.gdb_wait);
    }
    let session = builder.build()?;
    announce(&session, &args);
    let disk = session.trace_disk().map(PathBuf::from);
    let peep = session.peeping().cloned();
    let SessionOutcome {
        run: outcome,
        trace: report,
        kernel_panic,
    } = session.run()?;
    if let Some(line) = &kernel_panic {
        user_message(&format!("vtrace: the guest kernel panicked: {line}"));
    }
    if !args.quiet {
        user_message(&summary(
            &outcome,
            args.gdb.is_some(),
            args.exit_after_trace,
        ));
        if let (Some(r), Some(path)) = (&report, disk) {
            let stop = r
                .stop_reason
                .as_ref()
                .map(|s| format!("stopped by {s}"))
                .unwrap_or_else(|| "tracing never started".into());
            user_message(&format!(
                "vtrace: trace {}: {} steps, {} gaps, {} segments, {} bytes ({stop})",
                path.display(),
                r.recorded_steps,
                r.engine.gaps,
                r.writer.segments,
                r.writer.stored_bytes
            ));
            if r.engine.failed_writes > 0 {
                user_message(&format!(
                    "vtrace: {} writes to guest state failed (hiding or giving back the \
                     tracer's trap flag); the guest may have seen the tracer",
                    r.engine.failed_writes
                ));
            }
            if !r.captures.is_empty() {
                user_message(&capture_summary(&r.captures));
            }
            for window in &r.windows {
                user_message(&window_summary(window));
            }
            if let Some(line) = probe_summary(&r.probes, r.probe_troubles) {
                user_message(&line);
            }
            if let Some(p) = &peep {
                user_message(&crate::peep::summary(p, outcome.peeped, r.samples));
            }
        }
    }
    Ok(match outcome.exit {
        // The user ended it: that says more than what the guest did.
        GuestExit::UserQuit => 0,
        GuestExit::Signal(signal) => 128 + signal,
        // However the machine stopped after it (panic=1 reboots).
        _ if kernel_panic.is_some() => crate::exit_status::KERNEL_PANIC,
        GuestExit::Status(s) => i32::from(s),
        // A guest that powers off or reboots ended as it meant to, as under
        // QEMU with -no-reboot.
        GuestExit::Reset | GuestExit::PowerOff | GuestExit::MonitorDone => 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(probe: &str, count: u64) -> ProbeCount {
        ProbeCount {
            probe: probe.into(),
            count,
            enabled: true,
        }
    }

    #[test]
    fn the_summary_counts_probes_that_did_not_fire_past_a_few() {
        let few = [count("fn:a", 2), count("fn:b", 0)];
        assert_eq!(
            probe_summary(&few, ProbeTroubles::default()).as_deref(),
            Some(
                "vtrace: probes: fn:a 2, fn:b 0 (`vtrace analyze probes` counts them in the trace)"
            )
        );
        let mut many = vec![count("fn:a", 2)];
        many.extend((0..20).map(|i| count(&format!("tp:s:e{i}"), 0)));
        let line = probe_summary(&many, ProbeTroubles::default()).unwrap();
        assert!(
            line.starts_with("vtrace: probes: fn:a 2, 20 more enabled that did not fire ("),
            "{line}"
        );
    }
}
