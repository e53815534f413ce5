//! `vtrace probes`, and the static probes of the kernel `vtrace run`
//! boots.

use anyhow::{Context, Result};
use vtrace_image::sdt::{self, ProbeSite};

use crate::cli::{ProbesArgs, ProbesCommand};
use crate::exit_status::BadArgument;

/// The static probe sites of a kernel image: an ELF, or the vmlinux
/// inside a bzImage. `what` names the image in errors.
pub fn kernel_probes(bytes: &[u8], what: &str) -> Result<Vec<ProbeSite>> {
    if bytes.starts_with(b"\x7fELF") {
        return sdt::probe_sites(bytes)
            .with_context(|| format!("cannot read the probes of {what}"));
    }
    match vtrace_image::bzimage::vmlinux_inside(bytes) {
        Some(vmlinux) => sdt::probe_sites(&vmlinux)
            .with_context(|| format!("cannot read the probes of the vmlinux inside {what}")),
        None => Err(BadArgument(format!(
            "{what} is neither an ELF file nor a bzImage whose vmlinux vtrace can unpack"
        ))
        .into()),
    }
}

pub fn probes(args: ProbesArgs) -> Result<i32> {
    match args.what {
        ProbesCommand::List { kernel, json } => {
            let (bytes, what) = match &kernel {
                Some(path) => (
                    std::fs::read(path)
                        .map_err(|e| BadArgument(format!("cannot read {}: {e}", path.display())))?,
                    path.display().to_string(),
                ),
                None => (
                    vtrace_demo::DEMO_OS_ELF.to_vec(),
                    "the built-in demo OS".to_string(),
                ),
            };
            let listed = sdt::listing(&kernel_probes(&bytes, &what)?);
            if listed.is_empty() && !json {
                eprintln!(
                    "vtrace: {what} has no static probes (guest-kit/include/vtrace-sdt.h makes \
                     them; fn:ROUTINE probes need none)"
                );
                return Ok(0);
            }
            crate::analyze::print(json, &listed, || sdt::format_listing(&listed))?;
            Ok(0)
        }
    }
}
