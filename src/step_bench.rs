//! `vtrace bench`'s step benchmark: the bare single-step loop and full
//! tracing on the same guest, in one process, so the tracer's cost is
//! measured against the ceiling the host sets. It drives a VM and a tracer
//! both, so it lives here, above the two crates.

use std::path::Path;
use std::time::Duration;

use vtrace_storage::{Compression, Recorder};
use vtrace_storage::{DiskWriter, DEFAULT_SEGMENT_SIZE};
use vtrace_vmm::ClockMode;
use vtrace_vmm::{BootSource, EngineKind};
use vtrace_vmm::{
    ConsoleMode, CpuProfile, CpuView, Directive, EntryPlan, ExitAnswer, ExitView, Monitor, Vm,
    VmConfig,
};

use anyhow::Result;
use vtrace_trap::{TraceOptions, Tracer};
use vtrace_vmm::{stop_signals, GuestExit, RunOutcome};

pub use crate::exit_status::Stopped;

/// `outcome`, unless a stop signal ended its run.
fn whole(outcome: RunOutcome) -> Result<RunOutcome> {
    match outcome.exit {
        GuestExit::Signal(signal) => Err(Stopped(signal).into()),
        _ => Ok(outcome),
    }
}

/// Fails with [`Stopped`] where a stop signal was caught (between runs,
/// or while waiting for another process).
pub fn not_stopped() -> Result<()> {
    match stop_signals::caught() {
        Some(signal) => Err(Stopped(signal).into()),
        None => Ok(()),
    }
}

/// Single-steps, recording nothing. Where stepping rides on TF, KVM drops
/// it after instructions it handles itself, so the bare loop re-arms after
/// every exit to step the whole guest (the tracer re-arms only where
/// needed): its rate there is that of stepping with re-arming.
struct BareStepper {
    rearm: bool,
    /// Exits so far, and where to stop.
    exits: u64,
    limit: Option<u64>,
}

impl Monitor for BareStepper {
    fn plan_entry(&self) -> EntryPlan {
        EntryPlan {
            stepping: true,
            done: self.limit.is_some_and(|limit| self.exits >= limit),
            ..EntryPlan::default()
        }
    }

    fn on_exit(&mut self, exit: &ExitView, _cpu: &mut dyn CpuView) -> ExitAnswer {
        self.exits += 1;
        // Without an engine to tell a HLT that ran from one KVM reports
        // again, every HLT exit waits.
        if *exit == ExitView::Halt {
            return ExitAnswer::new(Directive::Halt);
        }
        ExitAnswer::new(match self.rearm {
            true => Directive::ReArm,
            false => Directive::Continue,
        })
    }
}

/// What one benchmark run measured. Rates are VM exits per second: one
/// exit per instruction, except where a host runs several REP iterations
/// before it exits; both runs step the same guest, so they compare.
#[derive(Clone, Debug)]
pub struct BenchReport {
    /// Exits of the two bare single-stepping runs together.
    pub bare_exits: u64,
    pub bare_time: Duration,
    /// Exits of the traced run.
    pub traced_exits: u64,
    /// Steps recorded (every REP iteration is one).
    pub traced_steps: u64,
    pub traced_time: Duration,
    pub trace_bytes: u64,
    pub peak_rss_bytes: Option<u64>,
    /// Times two CPUs stepped at once in the traced run.
    pub step_pairs: u64,
    /// Times pairing paused because the host's cores were busy.
    pub pair_pauses: u32,
    /// The same traced run on the second engine (Bochs's CPU), where its
    /// library is there and the machine has one CPU.
    pub engine: Option<TracedRun>,
}

impl TracedRun {
    /// Steps recorded per second.
    pub fn steps_per_s(&self) -> f64 {
        self.steps as f64 / self.time.as_secs_f64()
    }
    /// Trace bytes per step.
    pub fn bytes_per_step(&self) -> f64 {
        self.bytes as f64 / self.steps.max(1) as f64
    }
}

impl BenchReport {
    pub fn bare_exits_per_s(&self) -> f64 {
        self.bare_exits as f64 / self.bare_time.as_secs_f64()
    }
    pub fn traced_exits_per_s(&self) -> f64 {
        self.traced_exits as f64 / self.traced_time.as_secs_f64()
    }
    /// Traced over bare exit rate: the tracer's share of the host's cost.
    pub fn ratio(&self) -> f64 {
        self.traced_exits_per_s() / self.bare_exits_per_s()
    }
    /// Steps recorded per second of the traced run.
    pub fn traced_steps_per_s(&self) -> f64 {
        self.traced_steps as f64 / self.traced_time.as_secs_f64()
    }
    pub fn bytes_per_step(&self) -> f64 {
        self.trace_bytes as f64 / self.traced_steps.max(1) as f64
    }
}

/// Runs `boot` on `cpus` CPUs untraced, to its end; the host time it took.
pub fn untraced(boot: &BootSource, cpus: u8) -> Result<std::time::Duration> {
    let outcome = whole(Vm::new(config(boot, cpus))?.run(&mut vtrace_vmm::NoMonitor)?)?;
    Ok(outcome.host_time)
}

fn config(boot: &BootSource, cpus: u8) -> VmConfig {
    VmConfig {
        boot: boot.clone(),
        memory: 256 << 20,
        cpus,
        cpu: CpuProfile::Baseline,
        console: ConsoleMode::OutputOnly,
        kvm_device: vtrace_vmm::KVM_DEVICE.into(),
        serial_out: Box::new(std::io::sink()),
        clock: ClockMode::Steps(1),
        control: None,
    }
}

/// The middle value (the mean of the two middle ones for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The traced run's disk, in the directory [`run`] is given.
pub const TRACE_NAME: &str = "bench.vtd";

/// Runs `boot` three times: stepping bare, traced to a disk in `dir`, and
/// bare again; each run to the guest's end, or for `max_steps` (exits of
/// the bare runs, steps of the traced one). The bare rate is that of both bare runs together, so a
/// host whose speed drifts during the benchmark (a machine warming up, a
/// neighbour's load; on the AMD-V test machine single runs swung by 5 %)
/// weighs on both sides of the ratio alike.
/// `cpus` CPUs (the guest must be able to use them); `record_values` as
/// `run --record-values`.
pub fn run(
    boot: &BootSource,
    dir: &Path,
    max_steps: Option<u64>,
    cpus: u8,
    record_values: bool,
) -> Result<BenchReport> {
    let trap_flag_host = vtrace_vmm::steps_with_trap_flag();
    let bare = || {
        whole(Vm::new(config(boot, cpus))?.run(&mut BareStepper {
            rearm: trap_flag_host,
            exits: 0,
            limit: max_steps,
        })?)
    };
    let before = bare()?;
    let traced = traced(boot, dir, max_steps, cpus, record_values, EngineKind::Step)?;
    let after = bare()?;
    let engine = match (cpus, vtrace_bochs::Library::find()) {
        (1, Ok(_)) => {
            let _ = std::fs::remove_file(dir.join(TRACE_NAME));
            Some(self::traced(
                boot,
                dir,
                max_steps,
                cpus,
                record_values,
                EngineKind::Bochs,
            )?)
        }
        _ => None,
    };
    Ok(BenchReport {
        bare_exits: before.exits + after.exits,
        bare_time: before.host_time + after.host_time,
        traced_exits: traced.exits,
        traced_steps: traced.steps,
        traced_time: traced.time,
        trace_bytes: traced.bytes,
        step_pairs: traced.step_pairs,
        pair_pauses: traced.pair_pauses,
        peak_rss_bytes: crate::run::peak_rss_bytes(),
        engine,
    })
}

/// What a traced benchmark run measured.
#[derive(Clone, Debug)]
pub struct TracedRun {
    pub exits: u64,
    /// Steps recorded (every REP iteration is one).
    pub steps: u64,
    /// Host time of the run.
    pub time: Duration,
    /// Bytes the trace holds.
    pub bytes: u64,
    pub step_pairs: u64,
    pub pair_pauses: u32,
}

/// Traces `boot` on `cpus` CPUs to a disk in `dir`, to the guest's end or
/// for `max_steps` steps, on `engine`.
pub fn traced(
    boot: &BootSource,
    dir: &Path,
    max_steps: Option<u64>,
    cpus: u8,
    record_values: bool,
    engine: EngineKind,
) -> Result<TracedRun> {
    let trap_flag_host = vtrace_vmm::steps_with_trap_flag();
    // The whole demo fits a gigabyte many times over; a bounded run needs
    // far less (a test machine keeps its files in a RAM of 1 GiB).
    let disk_size = max_steps.map_or(1 << 30, |n| n.saturating_mul(64).clamp(16 << 20, 1 << 30));
    let disk = DiskWriter::create(
        &dir.join(TRACE_NAME),
        disk_size,
        DEFAULT_SEGMENT_SIZE,
        false,
        &vtrace_session::metadata::for_boot("vtrace bench", boot, env!("VTRACE_LONG_VERSION"))
            .to_text(),
    )?;
    // As `vtrace run` compresses (see `Compression::beside_threads`).
    let stepping = if cpus > 1 { 2 } else { 1 };
    let mut tracer = Tracer::new(
        Recorder::start_with(disk, Compression::beside_threads(stepping)),
        TraceOptions {
            from_start: true,
            trap_flag_host,
            max_steps,
            record_values,
            exit_after_trace: max_steps.is_some(),
            ..TraceOptions::default()
        },
    );
    let mut vm = Vm::new(config(boot, cpus))?;
    vm.set_engine(engine)?;
    let outcome = vm.run(&mut tracer);
    let report = tracer.finish()?;
    let outcome = whole(outcome?)?;
    Ok(TracedRun {
        exits: outcome.exits,
        steps: report.engine.steps,
        time: outcome.host_time,
        bytes: report.writer.stored_bytes,
        step_pairs: outcome.step_pairs,
        pair_pauses: outcome.pair_pauses,
    })
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[0.98, 0.92, 0.95]), 0.95);
        assert_eq!(median(&[0.9, 1.0]), 0.95);
        assert_eq!(median(&[0.93]), 0.93);
    }
}
