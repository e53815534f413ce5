//! `vtrace bench --cpus N`: what a traced CPU of an SMP guest gets, and
//! what N CPUs give untraced. The demo OS's SMP mode, every CPU working
//! from the start (`smp_only`: CPU 0 skips the one-CPU demo's timer-paced
//! tasks, during which the others would run alone), is traced on one CPU
//! and on N (and stepped bare, as `vtrace bench` does); the first figure
//! is the steps per second each of the N CPUs got against the one CPU's,
//! the same work on both. The CPUs take turns, an instruction a turn, and
//! two CPUs' steps run at once where neither writes memory (see
//! `run --serial-steps`); the goal is 0.8. Then the SMP demo with a larger
//! work queue (`smp_work=`) runs untraced on one CPU and on N, each CPU on
//! a thread of its own: the second figure is how much faster N are (the
//! goal is near N, as far as the host has cores).

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use vtrace_session::SessionBuilder;
use vtrace_vmm::BootSource;

use crate::cli::BenchArgs;
use crate::step_bench::{self, BenchReport, TRACE_NAME};

/// The SMP demo with `options` on its command line.
fn smp_demo(options: &str) -> BootSource {
    match SessionBuilder::demo_smp() {
        BootSource::Kernel { kernel, initrd, .. } => BootSource::Kernel {
            kernel,
            initrd,
            cmdline: options.to_string(),
        },
        other => other,
    }
}

/// The traced work: every CPU busy from the wake IPI on, about 2 M steps
/// in all on any number of CPUs.
const TRACED_WORK: &str = "smp_only smp_work=2";

/// The two benchmark runs, one CPU first.
fn measure(dir: &Path, args: &BenchArgs) -> Result<(BenchReport, BenchReport)> {
    let mut one_then_many = Vec::new();
    let boot = smp_demo(TRACED_WORK);
    for cpus in [1, args.cpus] {
        if !args.json {
            eprintln!("vtrace bench: stepping and tracing the demo OS on {cpus} CPU(s)...");
        }
        one_then_many.push(step_bench::run(
            &boot,
            dir,
            args.max_steps,
            cpus,
            args.record_values,
        )?);
        // A gigabyte, preallocated: gone before the next run makes its own.
        let _ = std::fs::remove_file(dir.join(TRACE_NAME));
    }
    let many = one_then_many.pop();
    let one = one_then_many.pop();
    match (one, many) {
        (Some(one), Some(many)) => Ok((one, many)),
        _ => anyhow::bail!("a benchmark run is missing"),
    }
}

/// The SMP demo's work queue, scaled up so that the work outweighs the
/// demo's timer-paced tasks (about 4 s of work on one CPU of a 2-core
/// host whose KVM emulates kernel code; the work grows as the scale to
/// the power 1.5).
const UNTRACED_WORK: u32 = 6;

/// The SMP demo with its work scaled up, untraced on one CPU and on
/// `cpus`: the host time of each.
fn measure_untraced(args: &BenchArgs) -> Result<(Duration, Duration)> {
    let boot = smp_demo(&format!("smp_work={UNTRACED_WORK}"));
    if !args.json {
        eprintln!(
            "vtrace bench: the SMP demo's work untraced, on 1 CPU and on {}...",
            args.cpus
        );
    }
    Ok((
        step_bench::untraced(&boot, 1)?,
        step_bench::untraced(&boot, args.cpus)?,
    ))
}

/// Runs the comparison and prints it; the exit status.
pub fn run(dir: &Path, args: &BenchArgs) -> Result<i32> {
    let (one, many) = measure(dir, args)?;
    let (alone, together) = measure_untraced(args)?;
    let speedup = alone.as_secs_f64() / together.as_secs_f64().max(1e-9);
    let cpus = f64::from(args.cpus);
    let per_cpu = many.traced_steps_per_s() / cpus;
    let ratio = per_cpu / one.traced_steps_per_s();
    if args.json {
        let json = serde_json::json!({
            "cpus": args.cpus,
            "one_cpu_steps_per_s": one.traced_steps_per_s(),
            "steps_per_s": many.traced_steps_per_s(),
            "per_cpu_steps_per_s": per_cpu,
            "per_cpu_ratio": ratio,
            "bare_exits_per_s": many.bare_exits_per_s(),
            "one_cpu_bare_exits_per_s": one.bare_exits_per_s(),
            "traced_steps": many.traced_steps,
            "step_pairs": many.step_pairs,
            "pair_pauses": many.pair_pauses,
            "bytes_per_step": many.bytes_per_step(),
            "untraced_one_cpu_s": alone.as_secs_f64(),
            "untraced_s": together.as_secs_f64(),
            "untraced_speedup": speedup,
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(0);
    }
    println!(
        "one CPU:           {} steps traced in {:.2} s = {:.0} steps/s",
        one.traced_steps,
        one.traced_time.as_secs_f64(),
        one.traced_steps_per_s()
    );
    println!(
        "{} CPUs:            {} steps traced in {:.2} s = {:.0} steps/s, {per_cpu:.0} a CPU",
        args.cpus,
        many.traced_steps,
        many.traced_time.as_secs_f64(),
        many.traced_steps_per_s()
    );
    let paused = match many.pair_pauses {
        0 => String::new(),
        n => format!("; pairing {}", crate::run::pair_pauses_words(n)),
    };
    println!(
        "per-CPU ratio:     {ratio:.2} (goal >= 0.8; {} of the {} steps ran two at once{paused})",
        many.step_pairs * 2,
        many.traced_steps
    );
    println!("bytes per step:    {:.2}", many.bytes_per_step());
    println!(
        "untraced:          the SMP demo's work in {:.2} s on one CPU, {:.2} s on {}: \
         {speedup:.2}x (goal near {}x, as far as the host has cores)",
        alone.as_secs_f64(),
        together.as_secs_f64(),
        args.cpus,
        args.cpus
    );
    Ok(0)
}
