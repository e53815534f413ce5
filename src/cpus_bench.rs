//! `vtrace bench --cpus N`: what a traced CPU of an SMP guest gets, and
//! what N CPUs give untraced. The demo OS's SMP mode, every CPU working
//! from the start to the end (`smp_only`: CPU 0 skips the one-CPU demo's
//! timer-paced tasks, during which the others would run alone, and the
//! queue gives its largest items first, so that no CPU works the last
//! one alone while the others idle), is traced on one CPU
//! and on N (and stepped bare, as `vtrace bench` does); the first figure
//! is the steps per second each of the N CPUs got against the one CPU's,
//! the same work on both. The CPUs take turns, an instruction a turn, and
//! two CPUs' steps run at once where neither writes memory (see
//! `run --serial-steps`); the goal is 0.8 (with `--runs`, the best of
//! them, as the step benchmark's). What the host allows that figure is
//! measured next: N one-CPU traces of the same work at once, each in a
//! process of its own (one VM a process), against one alone. Nothing
//! passes between them, so what each loses is the host's doing (its
//! cores, caches and hypervisor shared by N threads that run `KVM_RUN`
//! flat out), and the per-CPU ratio can come near that but not above it.
//! Then the SMP demo with a larger work queue (`smp_work=`) runs untraced
//! on one CPU and on N, each CPU on a thread of its own: the last figure
//! is how much faster N are (the goal is near N, as far as the host has
//! cores).

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use vtrace_session::SessionBuilder;
use vtrace_vmm::{stop_signals, BootSource};

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

/// One round of the comparison: the same work traced on one CPU, then
/// on N.
struct Round {
    one: BenchReport,
    many: BenchReport,
}

impl Round {
    /// Steps per second each of the N CPUs got.
    fn per_cpu_steps_per_s(&self, cpus: u8) -> f64 {
        self.many.traced_steps_per_s() / f64::from(cpus)
    }

    /// What each of the N CPUs got against the one CPU.
    fn ratio(&self, cpus: u8) -> f64 {
        self.per_cpu_steps_per_s(cpus) / self.one.traced_steps_per_s()
    }

    fn json(&self, cpus: u8) -> serde_json::Value {
        serde_json::json!({
            "one_cpu_steps_per_s": self.one.traced_steps_per_s(),
            "steps_per_s": self.many.traced_steps_per_s(),
            "per_cpu_steps_per_s": self.per_cpu_steps_per_s(cpus),
            "per_cpu_ratio": self.ratio(cpus),
            "traced_steps": self.many.traced_steps,
            "step_pairs": self.many.step_pairs,
            "pair_pauses": self.many.pair_pauses,
        })
    }
}

/// One round's two benchmark runs, one CPU first.
fn measure(dir: &Path, args: &BenchArgs) -> Result<Round> {
    let mut one_then_many = Vec::new();
    let boot = smp_demo(TRACED_WORK);
    for cpus in [1, args.cpus] {
        if !args.json {
            say!("vtrace bench: stepping and tracing the demo OS on {cpus} CPU(s)...");
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
        (Some(one), Some(many)) => Ok(Round { one, many }),
        _ => bail!("a benchmark run is missing"),
    }
}

/// The hidden `bench --host-limit-part`: one traced run of the work
/// [`measure`] traces, on one CPU, as one of the processes
/// [`host_limit`] starts; prints what it measured as JSON.
pub fn host_limit_part(dir: &Path, args: &BenchArgs) -> Result<i32> {
    let run = step_bench::traced(
        &smp_demo(TRACED_WORK),
        dir,
        args.max_steps,
        1,
        args.record_values,
        vtrace_vmm::EngineKind::Step,
    )?;
    let json = serde_json::json!({
        "steps": run.steps,
        "seconds": run.time.as_secs_f64(),
    });
    println!("{json}");
    Ok(0)
}

/// Starts a `bench --host-limit-part` process with `args`' work.
fn start_part(args: &BenchArgs) -> Result<Child> {
    let exe = std::env::current_exe().context("find vtrace's own executable")?;
    let mut command = Command::new(exe);
    command.args(["bench", "--host-limit-part"]);
    if let Some(n) = args.max_steps {
        command.arg("--max-steps").arg(n.to_string());
    }
    if args.record_values {
        command.arg("--record-values");
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("start a benchmark process")
}

/// A process [`start_part`] started, its output read as it comes (so
/// that a full pipe never holds it up).
struct Part {
    child: Child,
    stdout: JoinHandle<Vec<u8>>,
    stderr: JoinHandle<Vec<u8>>,
    status: Option<ExitStatus>,
}

/// Reads `pipe` to its end on a thread of its own.
fn read_all(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

/// How often [`finish_parts`] looks at its processes and at the stop
/// signals.
const PART_POLL: Duration = Duration::from_millis(10);

/// Waits for the processes [`start_part`] started: the steps per second
/// each traced. A
/// Ctrl-C reaches every process of the terminal's job, these included; a
/// stop signal sent to this process alone (`kill`) is passed on to them,
/// so that none runs on to its end for nothing.
fn finish_parts(children: Vec<Child>) -> Result<Vec<f64>> {
    let mut parts: Vec<Part> = children
        .into_iter()
        .map(|mut child| Part {
            stdout: read_all(child.stdout.take()),
            stderr: read_all(child.stderr.take()),
            child,
            status: None,
        })
        .collect();
    let mut passed_on = false;
    loop {
        for part in parts.iter_mut().filter(|p| p.status.is_none()) {
            part.status = part
                .child
                .try_wait()
                .context("wait for a benchmark process")?;
        }
        if parts.iter().all(|p| p.status.is_some()) {
            break;
        }
        if let (false, Some(signal)) = (passed_on, stop_signals::caught()) {
            for part in parts.iter().filter(|p| p.status.is_none()) {
                let pid = i32::try_from(part.child.id()).unwrap_or(i32::MAX);
                // SAFETY: the pid is our own child's, not yet waited for.
                unsafe { libc::kill(pid, signal) };
            }
            passed_on = true;
        }
        std::thread::sleep(PART_POLL);
    }
    step_bench::not_stopped()?;
    parts.into_iter().map(part_figures).collect()
}

/// The steps per second a finished [`Part`] traced.
fn part_figures(part: Part) -> Result<f64> {
    let join = |reader: JoinHandle<Vec<u8>>| reader.join().unwrap_or_default();
    let (stdout, stderr) = (join(part.stdout), join(part.stderr));
    match part.status {
        Some(status) if status.success() => {}
        status => bail!(
            "a benchmark process failed ({}): {}",
            status.map_or("no status".to_string(), |s| s.to_string()),
            String::from_utf8_lossy(&stderr).trim()
        ),
    }
    let json: serde_json::Value =
        serde_json::from_slice(&stdout).context("read what a benchmark process measured")?;
    let steps = json["steps"]
        .as_u64()
        .context("a benchmark process gave no steps")?;
    let seconds = json["seconds"]
        .as_f64()
        .filter(|s| s.is_finite() && *s > 0.0)
        .context("a benchmark process gave no time")?;
    Ok(steps as f64 / seconds)
}

/// N one-CPU traces at once against one alone (see the module's
/// documentation), in steps per second.
struct HostLimit {
    alone: f64,
    together: Vec<f64>,
}

impl HostLimit {
    /// Steps per second each of the traces run at once got, on average.
    fn together_steps_per_s(&self) -> f64 {
        self.together.iter().sum::<f64>() / self.together.len().max(1) as f64
    }

    /// What each trace run at once got against the one alone.
    fn ratio(&self) -> f64 {
        self.together_steps_per_s() / self.alone
    }
}

/// Measures [`HostLimit`]: one process alone, then `args.cpus` at once.
fn host_limit(args: &BenchArgs) -> Result<HostLimit> {
    if !args.json {
        say!(
            "vtrace bench: what the host allows: {} one-CPU traces at once against one alone...",
            args.cpus
        );
    }
    step_bench::not_stopped()?;
    let alone = finish_parts(vec![start_part(args)?])?
        .pop()
        .context("a benchmark process is missing")?;
    let children = (0..args.cpus)
        .map(|_| start_part(args))
        .collect::<Result<Vec<_>>>()?;
    let together = finish_parts(children)?;
    Ok(HostLimit { alone, together })
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
        say!(
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
    let runs = args.runs;
    let mut rounds = Vec::new();
    for round in 1..=runs {
        if !args.json && runs > 1 {
            say!("vtrace bench: round {round} of {runs}");
        }
        let measured = measure(dir, args)?;
        if !args.json {
            print_round(&measured, args.cpus);
        }
        rounds.push(measured);
    }
    let limit = host_limit(args)?;
    let (alone, together) = measure_untraced(args)?;
    let speedup = alone.as_secs_f64() / together.as_secs_f64().max(1e-9);
    let cpus = args.cpus;
    let ratios: Vec<f64> = rounds.iter().map(|r| r.ratio(cpus)).collect();
    let median = step_bench::median(&ratios);
    let best = rounds
        .iter()
        .max_by(|a, b| a.ratio(cpus).total_cmp(&b.ratio(cpus)))
        .context("no benchmark run")?;
    if args.json {
        let mut json = best.json(cpus);
        json["cpus"] = cpus.into();
        json["bare_exits_per_s"] = best.many.bare_exits_per_s().into();
        json["one_cpu_bare_exits_per_s"] = best.one.bare_exits_per_s().into();
        json["bytes_per_step"] = best.many.bytes_per_step().into();
        json["host_limit_alone_steps_per_s"] = limit.alone.into();
        json["host_limit_steps_per_s"] = limit.together_steps_per_s().into();
        json["host_limit_ratio"] = limit.ratio().into();
        json["untraced_one_cpu_s"] = alone.as_secs_f64().into();
        json["untraced_s"] = together.as_secs_f64().into();
        json["untraced_speedup"] = speedup.into();
        if runs > 1 {
            json["per_cpu_ratio_median"] = median.into();
            json["runs"] = rounds.iter().map(|r| r.json(cpus)).collect();
        }
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(0);
    }
    if runs > 1 {
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "per-CPU ratio, best of {runs}: {:.2}, median {median:.2} (each: {}; goal: best of three >= 0.8)",
            best.ratio(cpus),
            each.join(", ")
        );
    }
    println!(
        "host's limit:      {cpus} one-CPU traces at once, a process each: {:.0} steps/s each \
         against {:.0} alone = {:.2} (the per-CPU ratio's ceiling on this host)",
        limit.together_steps_per_s(),
        limit.alone,
        limit.ratio()
    );
    println!(
        "untraced:          the SMP demo's work in {:.2} s on one CPU, {:.2} s on {}: \
         {speedup:.2}x (goal near {}x, as far as the host has cores)",
        alone.as_secs_f64(),
        together.as_secs_f64(),
        cpus,
        cpus
    );
    Ok(0)
}

/// A round's figures, as text.
fn print_round(round: &Round, cpus: u8) {
    let (one, many) = (&round.one, &round.many);
    println!(
        "one CPU:           {} steps traced in {:.2} s = {:.0} steps/s",
        one.traced_steps,
        one.traced_time.as_secs_f64(),
        one.traced_steps_per_s()
    );
    println!(
        "{cpus} CPUs:            {} steps traced in {:.2} s = {:.0} steps/s, {:.0} a CPU",
        many.traced_steps,
        many.traced_time.as_secs_f64(),
        many.traced_steps_per_s(),
        round.per_cpu_steps_per_s(cpus)
    );
    let paused = match many.pair_pauses {
        0 => String::new(),
        n => format!("; pairing {}", crate::run::pair_pauses_words(n)),
    };
    println!(
        "per-CPU ratio:     {:.2} (goal >= 0.8; {} of the {} steps ran two at once{paused})",
        round.ratio(cpus),
        many.step_pairs * 2,
        many.traced_steps
    );
    println!("bytes per step:    {:.2}", many.bytes_per_step());
}
