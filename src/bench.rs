//! `vtrace bench`.

use anyhow::Result;
use vtrace_vmm::boot::{BootSource, Image};

use crate::cli::BenchArgs;

pub fn bench(args: BenchArgs) -> Result<i32> {
    let boot = BootSource::Kernel {
        kernel: Image::embedded("built-in demo OS", vtrace_demo::DEMO_OS_ELF),
        initrd: None,
        cmdline: String::new(),
    };
    let dir = std::env::temp_dir().join(format!("vtrace-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    if !args.json {
        eprintln!("vtrace bench: stepping the demo OS bare, then tracing it...");
    }
    let result = vtrace_trap::bench::run(&boot, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let r = result?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "guest": "demo OS",
                "bare_steps": r.bare_steps,
                "bare_seconds": r.bare_time.as_secs_f64(),
                "bare_steps_per_s": r.bare_steps_per_s(),
                "traced_steps": r.traced_steps,
                "traced_seconds": r.traced_time.as_secs_f64(),
                "traced_steps_per_s": r.traced_steps_per_s(),
                "ratio": r.ratio(),
                "bytes_per_step": r.bytes_per_step(),
                "peak_rss_bytes": r.peak_rss_bytes,
            }))?
        );
    } else {
        println!(
            "bare single-step:  {} steps in {:.2} s = {:.0} steps/s",
            r.bare_steps,
            r.bare_time.as_secs_f64(),
            r.bare_steps_per_s()
        );
        println!(
            "full tracing:      {} steps in {:.2} s = {:.0} steps/s",
            r.traced_steps,
            r.traced_time.as_secs_f64(),
            r.traced_steps_per_s()
        );
        println!("ratio:             {:.2} (goal >= 0.9)", r.ratio());
        println!("bytes per step:    {:.2} (goal <= 2)", r.bytes_per_step());
        if let Some(rss) = r.peak_rss_bytes {
            println!("peak RSS:          {} MiB", rss >> 20);
        }
    }
    Ok(0)
}
