//! Peeping: the variables to sample, found in the kernel the run boots.

use std::borrow::Cow;
use std::time::Duration;

use vtrace_image::symbols::{find_variable, physical_of};
use vtrace_storage::{SampleType, SampleVariable};
use vtrace_vmm::BootSource;
use vtrace_vmm::{PeepPlan, PeepRead, MAX_PEEP_READS as MAX_READS};

use crate::request::PeepRequest;
use crate::SessionError;

/// What the run peeps at.
#[derive(Clone, Debug)]
pub struct PeepSetup {
    /// What the VMM's peeper reads.
    pub plan: PeepPlan,
    /// The variables, as the trace's metadata names them.
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
fn split_type(spec: &str) -> Result<(&str, SampleType), SessionError> {
    match spec.rsplit_once(':') {
        None => Ok((spec, SampleType::U64)),
        Some((name, kind)) => match SampleType::parse(kind) {
            Some(kind) if !name.is_empty() => Ok((name, kind)),
            _ => Err(SessionError::request(format!(
                "--sample {spec}: the type after ':' is one of {}",
                SampleType::ALL.map(SampleType::name).join(", ")
            ))),
        },
    }
}

/// The peeping `request` asks for, of a run that boots `boot`.
pub fn setup(request: &PeepRequest, boot: &BootSource) -> Result<PeepSetup, SessionError> {
    let interval = request.interval;
    if request.samples.is_empty() && !request.pc {
        return Err(SessionError::request(
            "--peep needs something to sample: --sample SYMBOL[:TYPE] (repeatable) or \
             --sample-pc",
        ));
    }
    if request.samples.len() > MAX_READS {
        return Err(SessionError::request(format!(
            "{} --sample variables; at most {MAX_READS}",
            request.samples.len()
        )));
    }
    let elf = kernel_elf(boot);
    let mut variables = Vec::new();
    for spec in &request.samples {
        let (name, kind) = split_type(spec)?;
        let address = match name.strip_prefix("0x").map(|h| u64::from_str_radix(h, 16)) {
            Some(Ok(address)) => match elf.as_deref().and_then(|e| physical_of(e, address)) {
                Some(Ok(physical)) => physical,
                // Not in the image (or its per-CPU template): physical.
                _ => address,
            },
            Some(Err(_)) => {
                return Err(SessionError::request(format!(
                    "--sample {spec}: bad hexadecimal address"
                )))
            }
            None => {
                let Some(elf) = elf.as_deref() else {
                    return Err(SessionError::request(format!(
                        "--sample {spec}: vtrace cannot read this kernel's symbols (not an ELF, \
                         nor a bzImage it unpacks); give a guest-physical address"
                    )));
                };
                find_variable(elf, name)
                    .map_err(|e| SessionError::request(format!("--sample {spec}: {e}")))?
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
        pc: request.pc,
    };
    Ok(PeepSetup {
        plan,
        variables,
        interval: interval_text(interval),
    })
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
