//! `vtrace info`.

use std::fmt::Write as _;

use anyhow::Result;
use vtrace_analyzer::{name_address, AddressQuery};
use vtrace_image::symbols::{discover, Symbolizer};
use vtrace_storage::{summarize, TraceReader, TraceSummary};

use crate::cli::InfoArgs;

fn reason(r: Option<&vtrace_storage::TraceReason>) -> String {
    r.map(|r| r.to_string())
        .unwrap_or_else(|| "none recorded".into())
}

fn json(s: &TraceSummary) -> serde_json::Value {
    serde_json::json!({
        "steps": s.steps,
        "steps_by_cpu": s.steps_by_cpu,
        "gaps": s.gaps,
        "events": s.events,
        "first_pc": s.first_pc,
        "last_pc": s.last_pc,
        "start_reasons": s.start_reasons.iter().map(|r| r.token()).collect::<Vec<_>>(),
        "start_cpus": s.start_cpus,
        "stop_reason": s.stop_reason().map(|r| r.token()),
        "disk_size": s.disk_size,
        "disk_used": s.disk_used,
        "bytes_per_step": s.bytes_per_step(),
        "segments": s.segments_good,
        "segments_overwritten": s.segments_overwritten,
        "clean_end": s.clean_end,
        "problems": s.problems,
        "digest": s.digest,
        "metadata": s.metadata,
    })
}

/// The traced kernel's symbols, found as the analyses find them; none
/// (quietly: `info` is about the trace) where they cannot be.
fn kernel_symbols(s: &TraceSummary) -> Symbolizer {
    let mut names = Symbolizer::new();
    let metadata = vtrace_storage::TraceMetadata::parse(&s.metadata);
    discover(&metadata, &vtrace_session::builtin_kernels(), &mut names);
    names
}

/// ` (routine+0xoff)` of a kernel address, or nothing where no symbol
/// names it (a user program's: its address space is not known here).
fn routine_of(names: &Symbolizer, pc: u64) -> String {
    let named = name_address(
        names,
        AddressQuery {
            addr: pc,
            space: None,
        },
    );
    match named.routine {
        Some(_) => format!(" ({})", named.routine_text()),
        None => String::new(),
    }
}

pub fn info(args: InfoArgs) -> Result<i32> {
    crate::cli::check_default_trace(&args.trace)?;
    let reader = TraceReader::open(&args.trace)?;
    let s = summarize(&reader, |_, _| {});
    // Problems fail the command in both forms, so scripts notice damage.
    let status = if s.problems.is_empty() || args.allow_damage {
        0
    } else {
        1
    };
    if args.json {
        let value = json(&s);
        crate::analyze::print_to(Some(&args.to), true, &value, String::new)?;
        return Ok(status);
    }
    let mut out = String::new();
    let _ = writeln!(out, "trace:          {}", args.trace.display());
    for line in s.metadata.lines() {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(out, "steps:          {}", s.steps);
    if s.steps_by_cpu.len() > 1 {
        let by_cpu: Vec<String> = s
            .steps_by_cpu
            .iter()
            .map(|(cpu, n)| format!("CPU {cpu} {n}"))
            .collect();
        let _ = writeln!(out, "steps by CPU:   {}", by_cpu.join(", "));
    }
    let _ = writeln!(out, "gaps:           {}", s.gaps);
    let events: Vec<String> = s.events.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(out, "events:         {}", events.join(", "));
    if let (Some(a), Some(b)) = (s.first_pc, s.last_pc) {
        let names = kernel_symbols(&s);
        let _ = writeln!(out, "first step:     {a:#x}{}", routine_of(&names, a));
        let _ = writeln!(out, "last step:      {b:#x}{}", routine_of(&names, b));
    }
    // On several CPUs, each start names the CPU its trigger fired on.
    let several = s.steps_by_cpu.len() > 1;
    let starts: Vec<String> = s
        .start_reasons
        .iter()
        .enumerate()
        .map(|(i, r)| match s.start_cpus.get(i).filter(|_| several) {
            Some(cpu) => format!("{r} (on CPU {cpu})"),
            None => r.to_string(),
        })
        .collect();
    let _ = writeln!(out, "started by:     {}", starts.join(", "));
    let _ = writeln!(out, "stopped by:     {}", reason(s.stop_reason()));
    let _ = writeln!(
        out,
        "disk:           {} of {} bytes used, {:.2} bytes per step, {} segments{}",
        s.disk_used,
        s.disk_size,
        s.bytes_per_step(),
        s.segments_good,
        if s.segments_overwritten > 0 {
            format!(" ({} overwritten by --wrap)", s.segments_overwritten)
        } else {
            String::new()
        }
    );
    let _ = writeln!(out, "digest:         {}", s.digest);
    for p in &s.problems {
        let _ = writeln!(out, "problem:        {p}");
    }
    // The metadata and the problems quote what the trace holds: a crafted
    // trace must not steer the terminal.
    let out: String = out
        .lines()
        .map(|l| format!("{}\n", vtrace_vmm::escape_within_line(l)))
        .collect();
    crate::analyze::print_to(Some(&args.to), false, &(), || out)?;
    if status != 0 {
        say!(
            "vtrace: {} has the problems above (exit status 1); --allow-damage takes it as it is",
            args.trace.display()
        );
    }
    Ok(status)
}
