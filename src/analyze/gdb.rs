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
    let (images, vmlinux) = images(&trace, &args.trace.symbols)?;
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
    let Some(at) = at else {
        return Err(BadData("the trace holds no step of the CPU followed".into()).into());
    };
    let mut target = TraceTarget::new(replay, at);
    // Kept until gdb is done: gdb reads it as it connects.
    let symbols = match vmlinux.filter(|_| !args.trace.no_kernel_symbols) {
        Some(vmlinux) => kernel_symbols_for_gdb(&vmlinux)?,
        None => None,
    };
    if let Some(file) = &symbols {
        target.offer_symbols(file.path().to_path_buf());
    }
    serve_at(target, &listen)
}

/// Where the traced kernel has no DWARF of its own (a distribution's
/// vmlinuz), a symbol file for gdb from its kallsyms and ORC tables.
fn kernel_symbols_for_gdb(vmlinux: &[u8]) -> Result<Option<tempfile::NamedTempFile>> {
    if vtrace_image::gdb_symbols::has_dwarf(vmlinux) {
        return Ok(None);
    }
    let made = match vtrace_image::gdb_symbols::gdb_symbol_file(vmlinux, "the traced kernel") {
        Ok(made) => made,
        Err(e) => {
            vtrace_vmm::user_message(&format!(
                "vtrace: warning: no symbols for gdb from the traced kernel ({e}): load a \
                 vmlinux with `file` in gdb"
            ));
            return Ok(None);
        }
    };
    let mut file = tempfile::Builder::new()
        .prefix("vtrace-gdb-kernel-")
        .suffix(".elf")
        .tempfile()
        .context("making the kernel's symbol file for gdb")?;
    std::io::Write::write_all(&mut file, &made.elf)
        .context("writing the kernel's symbol file for gdb")?;
    vtrace_vmm::user_message(&format!(
        "vtrace: gdb loads the kernel's symbols from {} ({} routines and {} variables from its \
         kallsyms, {} unwind rules from its ORC tables; types and lines need a debug vmlinux: \
         `file` it in gdb)",
        file.path().display(),
        made.routines,
        made.variables,
        made.unwind_rules
    ));
    Ok(Some(file))
}

fn serve_at(mut target: TraceTarget, listen: &Listen) -> Result<()> {
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
/// space) and the traced kernel's, where it is found; and the traced
/// kernel's ELF (a bzImage's vmlinux), for gdb's symbols.
fn images(
    trace: &vtrace_analyzer::Trace,
    symbols: &[String],
) -> Result<(Vec<ReadOnlyImage>, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    for spec in symbols.iter().filter(|s| !s.contains('@')) {
        let bytes = vtrace_image::symbols::read_symbol_file(Path::new(spec))
            .with_context(|| format!("reading {spec}"))?;
        out.push(ReadOnlyImage::from_elf(&elf_of(bytes)));
    }
    let mut kernel = None;
    if let Some(name) = trace.metadata.kernel.as_deref() {
        let builtin = vtrace_session::builtin_kernels();
        if let Some((_, bytes)) = builtin.builtin.iter().find(|(k, _)| *k == name) {
            out.push(ReadOnlyImage::from_elf(bytes));
        } else if let Ok(bytes) = vtrace_image::symbols::read_symbol_file(Path::new(name)) {
            let elf = elf_of(bytes);
            out.push(ReadOnlyImage::from_elf(&elf));
            kernel = Some(elf);
        }
    }
    out.retain(|i| !i.is_empty());
    Ok((out, kernel))
}

/// An ELF image as it is, or a bzImage's vmlinux.
fn elf_of(bytes: Vec<u8>) -> Vec<u8> {
    vtrace_image::bzimage::vmlinux_inside(&bytes).unwrap_or(bytes)
}
