//! `vtrace analyze gdb`: a trace served to gdb.

use std::path::Path;

use anyhow::{Context, Result};
use vtrace_analyzer::{ReadOnlyImage, Replay};
use vtrace_gdb::{serve_trace, Listen, Listener, TraceTarget};

use super::{open_trace, require_steps, StepsBar};
use crate::cli::{CpuChoice, GdbArgs};
use crate::exit_status::{BadArgument, BadData};

pub fn serve(args: GdbArgs) -> Result<()> {
    let listen = Listen::parse(&args.listen).map_err(|e| BadArgument(e.to_string()))?;
    let mut trace = open_trace(&args.trace.trace)?;
    require_steps(&trace)?;
    match args.trace.cpu {
        Some(CpuChoice::One(cpu)) => trace.select_cpu(cpu)?,
        Some(CpuChoice::Each) => {
            return Err(BadArgument("gdb follows one CPU: name it with --cpu N".into()).into())
        }
        None => {}
    }
    let images = images(&trace, &args.trace.symbols)?;
    let bar = StepsBar::new(&trace, &args.trace, "indexing the trace for gdb");
    let mut replay = Replay::open(trace, images, &|done, _| bar.update(done))?;
    bar.finish();
    let at = match args.at {
        None => replay.first(),
        Some(step) => {
            let (first, end) = replay.step_range();
            if step < first || step >= end {
                return Err(BadArgument(format!(
                    "--at {step} is outside the trace: its steps are {first} to {}",
                    end.saturating_sub(1)
                ))
                .into());
            }
            replay.at_step(step)?
        }
    };
    serve_at(replay, at, &listen)
}

fn serve_at(replay: Replay, at: Option<vtrace_analyzer::Position>, listen: &Listen) -> Result<()> {
    let Some(at) = at else {
        return Err(BadData("the trace holds no step of the CPU followed".into()).into());
    };
    let mut target = TraceTarget::new(replay, at);
    let step = target.step()?;
    let listener = Listener::bind(listen)?;
    // One line, flushed: scripts wait for it to start gdb.
    vtrace_vmm::user_message(&format!(
        "vtrace: serving the trace to gdb at {}, standing at step {step}: in gdb, `target \
         remote {}`",
        listener.address(),
        listener.address()
    ));
    serve_trace(&mut target, &listener)?;
    Ok(())
}

/// Read-only memory: the images `--symbols` names (for every address
/// space) and the traced kernel's, where it is found.
fn images(trace: &vtrace_analyzer::Trace, symbols: &[String]) -> Result<Vec<ReadOnlyImage>> {
    let mut out = Vec::new();
    for spec in symbols.iter().filter(|s| !s.contains('@')) {
        let bytes = vtrace_image::symbols::read_symbol_file(Path::new(spec))
            .with_context(|| format!("reading {spec}"))?;
        out.push(elf_image(&bytes));
    }
    if let Some(kernel) = trace.metadata.kernel.as_deref() {
        let builtin = vtrace_session::builtin_kernels();
        if let Some((_, bytes)) = builtin.builtin.iter().find(|(k, _)| *k == kernel) {
            out.push(ReadOnlyImage::from_elf(bytes));
        } else if let Ok(bytes) = vtrace_image::symbols::read_symbol_file(Path::new(kernel)) {
            out.push(elf_image(&bytes));
        }
    }
    out.retain(|i| !i.is_empty());
    Ok(out)
}

/// An ELF image's read-only segments, or a bzImage's vmlinux's.
fn elf_image(bytes: &[u8]) -> ReadOnlyImage {
    match vtrace_image::bzimage::vmlinux_inside(bytes) {
        Some(vmlinux) => ReadOnlyImage::from_elf(&vmlinux),
        None => ReadOnlyImage::from_elf(bytes),
    }
}
