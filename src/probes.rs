//! `vtrace probes`.

use anyhow::Result;
use vtrace_image::sdt;
use vtrace_session::kernel_probes;

use crate::cli::{ProbesArgs, ProbesCommand};
use crate::exit_status::BadArgument;

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
