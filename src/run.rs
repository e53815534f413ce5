//! `vtrace run`.

use anyhow::{Context, Result};
use vtrace_vmm::user_message;
use vtrace_vmm::{default_linux_cmdline, BootSource, Image};
use vtrace_vmm::{
    stop_signals as signals, ConsoleMode, CpuProfile, GuestExit, NoMonitor, RunOutcome, Vm,
    VmConfig,
};

use std::path::PathBuf;

use vtrace_storage::disk::DiskWriter;
use vtrace_storage::metadata::{
    image_id, SampleVariable, TraceMetadata, BUILTIN_DEMO, LINUX_TASKS,
};
use vtrace_storage::Recorder;
use vtrace_trap::{
    CaptureCount, CaptureSite, FunctionProbe, FunctionSite, ProbeCount, ProbeTroubles, StaticSite,
    TraceOptions, Tracer, WindowCount, MAX_CAPTURES,
};
use vtrace_vmm::ClockMode;

use vtrace_image::linux_tasks::{task_layout, TaskLayout};

use crate::cli::{CpuArg, RunArgs};
use crate::exit_status::BadArgument;
use crate::peep::PeepSetup;
use crate::places::{Place, Places};
use crate::units::Location;

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
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn summary(outcome: &RunOutcome) -> String {
    let how = match outcome.exit {
        GuestExit::Status(s) => format!("guest exited with status {s}"),
        GuestExit::Reset => "guest rebooted (reset the machine)".to_string(),
        GuestExit::PowerOff => "guest powered off".to_string(),
        GuestExit::UserQuit => "quit by the user".to_string(),
        GuestExit::MonitorDone => "run ended when tracing stopped (--exit-after-trace)".to_string(),
        GuestExit::Signal(signal) => format!("stopped by {}", signals::name(signal)),
    };
    let rss = peak_rss_bytes()
        .map(|b| format!(", peak RSS {} MiB", b >> 20))
        .unwrap_or_default();
    let hidden = match outcome.guest_lines_not_shown {
        0 => String::new(),
        n => format!(", {n} guest lines not shown (rate limit)"),
    };
    format!(
        "vtrace: {how} after {:.2} s (virtual time {:.3} s): {} timer interrupts, {} exits{rss}\
         {hidden}",
        outcome.host_time.as_secs_f64(),
        outcome.virtual_time.as_secs_f64(),
        outcome.timer_interrupts(),
        outcome.exits,
    )
}

/// Where a Linux guest keeps its running task, so the trace names tasks;
/// for a bzImage kernel only, and said once where it cannot be found.
fn linux_tasks(boot: &BootSource, quiet: bool) -> Option<TaskLayout> {
    let BootSource::Kernel { kernel, .. } = boot else {
        return None;
    };
    let vmlinux = vtrace_image::bzimage::vmlinux_inside(&kernel.bytes)?;
    match task_layout(&vmlinux) {
        Ok(layout) => {
            if layout.maps.is_none() && !quiet {
                user_message(
                    "vtrace: memory maps of Linux processes are not recorded: the kernel \
                     keeps them in a form vtrace does not read (before 6.1) or its BTF lacks \
                     a field; user code is named by address only",
                );
            }
            Some(layout)
        }
        Err(why) => {
            if !quiet {
                user_message(&format!(
                    "vtrace: Linux tasks are not followed: {why}; the trace names address \
                     spaces only"
                ));
            }
            None
        }
    }
}

/// Which kernel image ran, recorded so `vtrace analyze` finds its symbols.
fn kernel_identity(boot: &BootSource) -> (Option<String>, Option<String>) {
    let image = match boot {
        BootSource::Kernel { kernel, .. } => kernel,
        BootSource::RealMode { image, .. } => image,
    };
    let name = match &image.path {
        Some(path) => std::fs::canonicalize(path)
            .unwrap_or_else(|_| path.clone())
            .display()
            .to_string(),
        None => BUILTIN_DEMO.to_string(),
    };
    (Some(name), Some(image_id(&image.bytes)))
}

/// Creates the trace disk and the tracer, when the user asked for tracing.
fn tracer(
    args: &RunArgs,
    description: &str,
    kernel: (Option<String>, Option<String>),
    linux_tasks: Option<TaskLayout>,
    probe_sites: Vec<StaticSite>,
    peep: Option<&PeepSetup>,
) -> Result<Option<Tracer>> {
    if !tracing_asked(args) {
        if args.exit_after_trace {
            return Err(BadArgument(
                "--exit-after-trace needs tracing: add --trace, --disk or --start-at".into(),
            )
            .into());
        }
        return Ok(None);
    }
    let path = args
        .disk
        .clone()
        .unwrap_or_else(|| PathBuf::from(crate::cli::DEFAULT_TRACE));
    let initrd = args.initrd.as_ref().map(|p| {
        std::fs::canonicalize(p)
            .unwrap_or_else(|_| p.clone())
            .display()
            .to_string()
    });
    let metadata = TraceMetadata {
        guest: description.to_string(),
        kernel: kernel.0,
        kernel_id: kernel.1,
        clock: Some(clock_mode(args).to_string()),
        vtrace_version: Some(env!("VTRACE_LONG_VERSION").to_string()),
        tasks: linux_tasks.is_some().then(|| LINUX_TASKS.to_string()),
        initrd,
        peep: peep.map(|p| p.interval.clone()),
        samples: peep
            .filter(|p| !p.variables.is_empty())
            .map(|p| SampleVariable::list_text(&p.variables)),
        sample_pc: peep.is_some_and(|p| p.plan.pc),
    };
    let mut places = Places::new(&metadata, args.initrd.as_deref(), linux_tasks.is_some());
    let start_at = find_place(&mut places, &args.start_at, "--start-at", args.quiet)?;
    let stop_at = find_place(&mut places, &args.stop_at, "--stop-at", args.quiet)?;
    let captures = capture_sites(args, &mut places)?;
    let functions = function_sites(args, &mut places, start_at.is_some())?;
    let taken = usize::from(start_at.is_some()) + functions.len();
    let function_probes = function_probes(args, &mut places, taken)?;
    // Breakpoints while tracing is off go to the start place first, then
    // the routines' entries, the fn: probes, then the captures.
    let taken = taken + function_probes.len();
    if let (false, Some(note)) = (args.quiet, capture_note(&captures, taken)) {
        user_message(&note);
    }
    if args.force && path.is_file() {
        std::fs::remove_file(&path)
            .with_context(|| format!("cannot remove {} (--force)", path.display()))?;
    }
    let disk = DiskWriter::create(
        &path,
        args.disk_size,
        args.segment_size as u32,
        args.wrap,
        &metadata.to_text(),
    )?;
    let options = TraceOptions {
        from_start: args.trace,
        max_steps: args.max_steps,
        autostop: args.autostop.0.clone(),
        start_at: start_at.as_ref().map(|p| p.address),
        stop_at: stop_at.as_ref().map(|p| p.address),
        start_in: start_at.and_then(|p| p.task),
        stop_in: stop_at.and_then(|p| p.task),
        exit_after_trace: args.exit_after_trace,
        obey_guest: !args.ignore_guest_tracing,
        trap_flag_host: vtrace_vmm::steps_with_trap_flag(),
        linux_tasks,
        captures,
        functions,
        probe_sites,
        function_probes,
        probes_enabled: args.probes.clone(),
    };
    Ok(Some(
        Tracer::new(Recorder::start(disk), options).on_announce(user_message),
    ))
}

/// Finds the place `option` names, if given, and tells the user what
/// they should know of it (unless `quiet`).
fn find_place(
    places: &mut Places<'_>,
    location: &Option<Location>,
    option: &str,
    quiet: bool,
) -> Result<Option<Place>> {
    let place = places.find(location, option)?;
    if let (false, Some(note)) = (quiet, place.as_ref().and_then(|p| p.note.as_deref())) {
        user_message(note);
    }
    Ok(place)
}

/// The `--capture` places, found as triggers' are.
fn capture_sites(args: &RunArgs, places: &mut Places<'_>) -> Result<Vec<CaptureSite>> {
    if args.captures.len() > MAX_CAPTURES {
        return Err(BadArgument(format!(
            "{} captures given; a run takes at most {MAX_CAPTURES}",
            args.captures.len()
        ))
        .into());
    }
    let mut sites = Vec::with_capacity(args.captures.len());
    for capture in &args.captures {
        let option = format!("--capture {}", capture.name);
        let location = Some(capture.place.clone());
        let Some(place) = find_place(places, &location, &option, args.quiet)? else {
            continue;
        };
        sites.push(CaptureSite {
            name: capture.name.clone(),
            at: place.address,
            register: capture.register,
            length: capture.length,
            task: place.task,
        });
    }
    Ok(sites)
}

/// The `--trace-function` routines, found as triggers' are; each takes a
/// breakpoint.
fn function_sites(
    args: &RunArgs,
    places: &mut Places<'_>,
    start_at: bool,
) -> Result<Vec<FunctionSite>> {
    let room = vtrace_vmm::x86::dr::BREAKPOINTS - usize::from(start_at);
    if args.trace_functions.len() > room {
        return Err(BadArgument(format!(
            "{} --trace-function routines given; the CPU's breakpoints watch at most {room}{}",
            args.trace_functions.len(),
            if start_at { " beside --start-at" } else { "" }
        ))
        .into());
    }
    let mut sites = Vec::with_capacity(args.trace_functions.len());
    for location in &args.trace_functions {
        let name = location.to_string();
        let option = format!("--trace-function {name}");
        let location = Some(location.clone());
        let Some(place) = find_place(places, &location, &option, args.quiet)? else {
            continue;
        };
        sites.push(FunctionSite {
            name,
            entry: place.address,
            task: place.task,
        });
    }
    Ok(sites)
}

/// The static probe sites of the kernel, each by its probe's name (none
/// for a real-mode image, or a bzImage where no --probe asks for them:
/// unpacking it costs time). Every --probe pattern that is not a fn:
/// probe must name one.
fn static_probe_sites(args: &RunArgs, boot: &BootSource) -> Result<Vec<StaticSite>> {
    let patterns: Vec<&String> = args
        .probes
        .iter()
        .filter(|p| !p.starts_with("fn:"))
        .collect();
    let kernel = match boot {
        BootSource::Kernel { kernel, .. } => kernel,
        BootSource::RealMode { .. } => {
            if let Some(p) = patterns.first() {
                return Err(BadArgument(format!(
                    "--probe {p}: a real-mode image has no probes (fn:ROUTINE needs symbols)"
                ))
                .into());
            }
            return Ok(Vec::new());
        }
    };
    let elf = kernel.bytes.starts_with(b"\x7fELF");
    if !elf && patterns.is_empty() {
        return Ok(Vec::new());
    }
    let sites = match crate::probes::kernel_probes(&kernel.bytes, &kernel.name) {
        Ok(sites) => sites,
        Err(e) if patterns.is_empty() => {
            if !args.quiet {
                user_message(&format!("vtrace: static probes are off: {e:#}"));
            }
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    for pattern in patterns {
        if !sites
            .iter()
            .any(|s| vtrace_trap::probes::matches(pattern, &s.probe()))
        {
            let mut names: Vec<String> = sites.iter().map(|s| s.probe()).collect();
            names.sort();
            names.dedup();
            let known = match names.is_empty() {
                true => {
                    "it has none (vtrace-sdt.h makes them); fn:ROUTINE probes need none".to_string()
                }
                false => format!("its probes: {}", names.join(", ")),
            };
            return Err(BadArgument(format!(
                "--probe {pattern} matches no static probe of {}: {known}",
                kernel.name
            ))
            .into());
        }
    }
    Ok(sites
        .into_iter()
        .map(|s| StaticSite {
            probe: s.probe(),
            pc: s.pc,
            semaphore: s.semaphore_physical,
            args: s.arguments.len(),
        })
        .collect())
}

/// The `--probe fn:ROUTINE` probes, found as triggers' places are; each
/// takes a breakpoint while tracing is off, after the `taken` ones.
fn function_probes(
    args: &RunArgs,
    places: &mut Places<'_>,
    taken: usize,
) -> Result<Vec<FunctionProbe>> {
    let wanted: Vec<&str> = args
        .probes
        .iter()
        .filter_map(|p| p.strip_prefix("fn:"))
        .collect();
    let room = vtrace_vmm::x86::dr::BREAKPOINTS.saturating_sub(taken);
    if wanted.len() > room {
        return Err(BadArgument(format!(
            "{} fn: probes given; the CPU's breakpoints watch {room} more beside --start-at \
             and --trace-function",
            wanted.len()
        ))
        .into());
    }
    let mut probes = Vec::with_capacity(wanted.len());
    for routine in wanted {
        if routine.contains(['*', '?']) {
            return Err(BadArgument(format!(
                "--probe fn:{routine}: a fn: probe names one routine (each takes a breakpoint)"
            ))
            .into());
        }
        let option = format!("--probe fn:{routine}");
        let location = crate::units::parse_location(routine)
            .map_err(|e| BadArgument(format!("{option}: {e}")))?;
        let Some(place) = find_place(places, &Some(location), &option, args.quiet)? else {
            continue;
        };
        probes.push(FunctionProbe {
            probe: format!("fn:{routine}"),
            entry: place.address,
            task: place.task,
        });
    }
    Ok(probes)
}

/// What the user should know of captures while tracing is off: only as
/// many places as there are debug registers left (`taken` are not) are
/// watched.
fn capture_note(sites: &[CaptureSite], taken: usize) -> Option<String> {
    let mut places: Vec<u64> = sites.iter().map(|s| s.at).collect();
    places.sort_unstable();
    places.dedup();
    let room = vtrace_vmm::x86::dr::BREAKPOINTS.saturating_sub(taken);
    (places.len() > room).then(|| {
        format!(
            "vtrace: --capture: {} places, and the CPU's breakpoints watch {room} of them \
             while tracing is off (all are taken while tracing)",
            places.len()
        )
    })
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

fn clock_mode(args: &RunArgs) -> ClockMode {
    args.clock.unwrap_or(if tracing_asked(args) {
        ClockMode::Steps(1)
    } else {
        ClockMode::Wall
    })
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

/// "vtrace: probes: sched:switch 42, fn:schedule 90": those enabled at the
/// end or that fired.
fn probe_summary(counts: &[ProbeCount], troubles: ProbeTroubles) -> Option<String> {
    let each: Vec<String> = counts
        .iter()
        .filter(|c| c.shown())
        .map(|c| format!("{} {}", c.probe, c.count))
        .collect();
    let mut trouble = String::new();
    if troubles.unknown_sites > 0 {
        trouble += &format!(
            "; {} probe hypercalls came from sites no note of the kernel describes",
            troubles.unknown_sites
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
    if c.switched_out > 0 {
        parts.push(format!(
            "its task switched out {} (not recorded meanwhile)",
            plural(c.switched_out, "time", "times")
        ));
    }
    format!("vtrace: --trace-function {}: {}", c.name, parts.join(", "))
}

pub fn run(args: RunArgs) -> Result<i32> {
    // From the start: a signal while the kernel loads or the disk is made
    // ends the run at its first exit, with the disk in order.
    signals::catch()?;
    let boot = boot_source(&args)?;
    let kernel = kernel_identity(&boot);
    let traced = tracing_asked(&args);
    let tasks = traced.then(|| linux_tasks(&boot, args.quiet)).flatten();
    let probe_sites = match traced {
        true => static_probe_sites(&args, &boot)?,
        false => Vec::new(),
    };
    let peep = crate::peep::setup(&args, &boot)?;
    let config = VmConfig {
        boot,
        memory: args.memory,
        cpu: cpu_profile(&args),
        console: if args.no_input {
            ConsoleMode::OutputOnly
        } else {
            ConsoleMode::Interactive
        },
        kvm_device: args.kvm_device.clone(),
        serial_out: Box::new(std::io::stdout()),
        clock: clock_mode(&args),
        control: None,
    };
    let control = if traced {
        let path = args
            .control
            .clone()
            .unwrap_or_else(|| vtrace_vmm::control_socket::default_path(std::process::id()));
        Some(vtrace_vmm::ControlServer::bind(&path)?)
    } else {
        None
    };
    let control_line = control.as_ref().map(|c| {
        format!(
            "vtrace: control socket {} (vtrace ctl start|stop|mark|status)",
            c.path().display()
        )
    });
    let config = VmConfig { control, ..config };
    let mut vm = Vm::new(config)?;
    if args.no_input && !args.quiet && !args.progress.is_zero() {
        vm.report_progress(args.progress);
    }
    if let Some(p) = &peep {
        // Before the disk is made: a bad address leaves no file behind.
        vm.peep(p.plan.clone())
            .map_err(|e| BadArgument(format!("--sample: {e}")))?;
    }
    let mut tracer = tracer(
        &args,
        vm.boot_description(),
        kernel,
        tasks,
        probe_sites,
        peep.as_ref(),
    )?;
    if !args.quiet {
        user_message(&format!("vtrace: booting {}", vm.boot_description()));
        if let Some(line) = &control_line {
            user_message(line);
        }
        if !args.no_input {
            user_message("vtrace: Ctrl-A h for help, Ctrl-A x to quit");
        }
    }
    let outcome = match tracer.as_mut() {
        Some(t) => vm.run(t),
        None => vm.run(&mut NoMonitor),
    };
    // The trace is flushed whatever became of the guest.
    let report = tracer.map(Tracer::finish).transpose()?;
    let outcome = outcome?;
    if !args.quiet {
        user_message(&summary(&outcome));
        if let (Some(r), Some(path)) = (
            &report,
            args.disk
                .clone()
                .or(Some(PathBuf::from(crate::cli::DEFAULT_TRACE))),
        ) {
            let stop = r
                .stop_reason
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_else(|| "never started".into());
            user_message(&format!(
                "vtrace: trace {}: {} steps, {} gaps, {} segments, {} bytes (stopped by {stop})",
                path.display(),
                r.recorded_steps,
                r.engine.gaps,
                r.writer.segments,
                r.writer.stored_bytes
            ));
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
        GuestExit::Status(s) => i32::from(s),
        // A guest that powers off or reboots ended as it meant to, as under
        // QEMU with -no-reboot.
        GuestExit::Reset | GuestExit::PowerOff | GuestExit::UserQuit | GuestExit::MonitorDone => 0,
        // What the shell shows for a process the signal ended.
        GuestExit::Signal(signal) => 128 + signal,
    })
}
