//! `vtrace run --peep`: the variables to sample, found in the kernel the
//! run boots, and the summary line.

use std::borrow::Cow;
use std::time::Duration;

use anyhow::Result;
use vtrace_image::symbols::{find_variable, physical_of};
use vtrace_storage::metadata::{SampleType, SampleVariable};
use vtrace_trap::SampleCount;
use vtrace_vmm::BootSource;
use vtrace_vmm::{PeepPlan, PeepRead, PeepReport, MAX_PEEP_READS as MAX_READS};

use crate::cli::RunArgs;
use crate::exit_status::BadArgument;

/// What the run peeps at.
pub struct PeepSetup {
    pub plan: PeepPlan,
    pub variables: Vec<SampleVariable>,
    /// The interval as the trace's metadata says it.
    pub interval: String,
}

/// `interval` in the largest unit that keeps it whole.
pub fn interval_text(interval: Duration) -> String {
    let ns = interval.as_nanos();
    match ns {
        n if n % 1_000_000_000 == 0 => format!("{}s", n / 1_000_000_000),
        n if n % 1_000_000 == 0 => format!("{}ms", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{}us", n / 1_000),
        n => format!("{n}ns"),
    }
}

/// The kernel's ELF image, where the run boots one vtrace loads itself.
fn kernel_elf(boot: &BootSource) -> Option<Cow<'_, [u8]>> {
    let BootSource::Kernel { kernel, .. } = boot else {
        return None;
    };
    if kernel.bytes.starts_with(b"\x7fELF") {
        return Some(Cow::Borrowed(&kernel.bytes));
    }
    vtrace_image::bzimage::vmlinux_inside(&kernel.bytes).map(Cow::Owned)
}

/// Splits `SYMBOL[:TYPE]`.
fn split_type(spec: &str) -> Result<(&str, SampleType), BadArgument> {
    match spec.rsplit_once(':') {
        None => Ok((spec, SampleType::U64)),
        Some((name, kind)) => match SampleType::parse(kind) {
            Some(kind) if !name.is_empty() => Ok((name, kind)),
            _ => Err(BadArgument(format!(
                "--sample {spec}: the type after ':' is one of {}",
                SampleType::ALL.map(SampleType::name).join(", ")
            ))),
        },
    }
}

/// The peeping the run asks for, if any.
pub fn setup(args: &RunArgs, boot: &BootSource) -> Result<Option<PeepSetup>> {
    let Some(interval) = args.peep else {
        return Ok(None);
    };
    if args.samples.is_empty() && !args.sample_pc {
        return Err(BadArgument(
            "--peep needs something to sample: --sample SYMBOL[:TYPE] (repeatable) or \
             --sample-pc"
                .into(),
        )
        .into());
    }
    if args.samples.len() > MAX_READS {
        return Err(BadArgument(format!(
            "{} --sample variables; at most {MAX_READS}",
            args.samples.len()
        ))
        .into());
    }
    let elf = kernel_elf(boot);
    let mut variables = Vec::new();
    for spec in &args.samples {
        let (name, kind) = split_type(spec)?;
        let address = match name.strip_prefix("0x").map(|h| u64::from_str_radix(h, 16)) {
            Some(Ok(address)) => match elf.as_deref().and_then(|e| physical_of(e, address)) {
                Some(Ok(physical)) => physical,
                // Not in the image (or its per-CPU template): physical.
                _ => address,
            },
            Some(Err(_)) => {
                return Err(BadArgument(format!("--sample {spec}: bad hexadecimal address")).into())
            }
            None => {
                let Some(elf) = elf.as_deref() else {
                    return Err(BadArgument(format!(
                        "--sample {spec}: vtrace cannot read this kernel's symbols (not an ELF, \
                         nor a bzImage it unpacks); give a guest-physical address"
                    ))
                    .into());
                };
                find_variable(elf, name)
                    .map_err(|e| BadArgument(format!("--sample {spec}: {e}")))?
                    .physical
            }
        };
        variables.push(SampleVariable {
            name: name.to_string(),
            kind,
            address,
        });
    }
    let plan = PeepPlan {
        interval,
        reads: variables
            .iter()
            .map(|v| PeepRead {
                gpa: v.address,
                size: v.kind.size(),
            })
            .collect(),
        pc: args.sample_pc,
    };
    Ok(Some(PeepSetup {
        plan,
        variables,
        interval: interval_text(interval),
    }))
}

/// The run summary's line.
pub fn summary(setup: &PeepSetup, peeped: Option<PeepReport>, written: SampleCount) -> String {
    let mut what: Vec<&str> = setup.variables.iter().map(|v| v.name.as_str()).collect();
    if setup.plan.pc {
        what.push("the pc (an exit each)");
    }
    let mut line = format!(
        "vtrace: peeped at {} every {}: {} samples in the trace",
        what.join(", "),
        setup.interval,
        written.recorded
    );
    if let Some(r) = peeped.filter(|r| r.missed > 0) {
        line.push_str(&format!(
            ", {} intervals missed (the host was late)",
            r.missed
        ));
    }
    if written.lost > 0 {
        line.push_str(&format!(", {} lost: the trace disk was full", written.lost));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_written_in_their_largest_whole_unit() {
        assert_eq!(interval_text(Duration::from_micros(100)), "100us");
        assert_eq!(interval_text(Duration::from_millis(2)), "2ms");
        assert_eq!(interval_text(Duration::from_secs(1)), "1s");
        assert_eq!(interval_text(Duration::from_nanos(1500)), "1500ns");
    }

    #[test]
    fn types_follow_the_last_colon() {
        assert_eq!(split_type("ticks").unwrap(), ("ticks", SampleType::U64));
        assert_eq!(split_type("ticks:i64").unwrap(), ("ticks", SampleType::I64));
        assert!(split_type("ticks:f32").is_err());
        assert!(split_type(":u8").is_err());
    }
}
