//! `vtrace probes`.

use anyhow::Result;
use serde::Serialize;
use vtrace_image::sdt::{self, ProbeListing};
use vtrace_image::tracepoints::{self, Tracepoint};
use vtrace_session::{kernel_probes, kernel_tracepoints};

use crate::cli::{ProbesArgs, ProbesCommand};
use crate::exit_status::{BadArgument, Unreadable};

/// A tracepoint as `--json` lists it: the keys of a static probe's, and
/// what only a tracepoint has.
#[derive(Serialize)]
struct TracepointListing<'a> {
    probe: String,
    arguments: usize,
    sites: Vec<String>,
    #[serde(flatten)]
    tracepoint: &'a Tracepoint,
    site_states: Vec<tracepoints::SiteState>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Listed<'a> {
    Static(ProbeListing),
    Tracepoint(TracepointListing<'a>),
}

pub fn probes(args: ProbesArgs) -> Result<i32> {
    match args.what {
        ProbesCommand::List {
            kernel,
            pattern,
            json,
        } => {
            let (bytes, what) = match &kernel {
                Some(path) => (
                    std::fs::read(path)
                        .map_err(|e| Unreadable(format!("cannot read {}: {e}", path.display())))?,
                    path.display().to_string(),
                ),
                None => (
                    vtrace_demo::DEMO_OS_ELF.to_vec(),
                    "the built-in demo OS".to_string(),
                ),
            };
            let wanted = |name: &str| {
                pattern
                    .as_deref()
                    .is_none_or(|p| vtrace_trap::probe_matches(p, name))
            };
            let mut listed = sdt::listing(&kernel_probes(&bytes, &what)?);
            listed.retain(|p| wanted(&p.probe));
            let mut tps = match kernel.is_some() {
                true => linux_tracepoints(&bytes, &what),
                false => Vec::new(),
            };
            tps.retain(|t| wanted(&t.probe()));
            if listed.is_empty() && tps.is_empty() {
                // A pattern that matches nothing is a value that means
                // nothing for this kernel, as `fn:` of a routine it lacks.
                if let Some(p) = pattern.as_deref() {
                    return Err(BadArgument(format!("no probe of {what} matches {p}")).into());
                }
                if !json {
                    say!("vtrace: {}", no_probes(&what));
                    return Ok(0);
                }
            }
            if json {
                let all: Vec<Listed> = listed
                    .into_iter()
                    .map(Listed::Static)
                    .chain(
                        tps.iter()
                            .map(|t| Listed::Tracepoint(tracepoint_listing(t))),
                    )
                    .collect();
                crate::analyze::print(true, &all, String::new)?;
                return Ok(0);
            }
            let mut text = String::new();
            if !listed.is_empty() {
                text.push_str(&sdt::format_listing(&listed));
            }
            if !tps.is_empty() {
                if !text.is_empty() {
                    text.push('\n');
                }
                match pattern.is_some() {
                    true => {
                        let each: Vec<String> =
                            tps.iter().map(tracepoints::format_detail).collect();
                        text.push_str(&each.join("\n"));
                    }
                    false => text.push_str(&tracepoints::format_table(&tps)),
                }
            }
            print!("{text}");
            Ok(0)
        }
    }
}

/// The kernel's tracepoints, or none with a word why where it should
/// have some.
fn linux_tracepoints(bytes: &[u8], what: &str) -> Vec<Tracepoint> {
    match kernel_tracepoints(bytes, what) {
        Ok(t) => t,
        Err(e) => {
            if vtrace_image::bzimage::vmlinux_inside(bytes).is_some() {
                say!("vtrace: no tracepoints listed: {e}");
            }
            Vec::new()
        }
    }
}

fn tracepoint_listing(t: &Tracepoint) -> TracepointListing<'_> {
    TracepointListing {
        probe: t.probe(),
        arguments: t.parameters.len(),
        sites: t.sites.iter().map(|s| format!("{:#x}", s.pc)).collect(),
        tracepoint: t,
        site_states: t.sites.iter().map(|s| s.state).collect(),
    }
}

fn no_probes(what: &str) -> String {
    format!(
        "{what} has no static probes (guest-kit/include/vtrace-sdt.h makes them) and no \
         tracepoints; fn:ROUTINE probes need none"
    )
}
