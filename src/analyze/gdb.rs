//! `vtrace analyze gdb`: a trace served to gdb.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use vtrace_analyzer::{ReadOnlyImage, Replay};
use vtrace_gdb::{serve_trace, Listen, Listener, SymbolFile, TraceTarget};

use super::{open_trace, require_steps, StepsBar};
use crate::cli::{CpuChoice, GdbArgs};
use crate::exit_status::{BadArgument, BadData};

pub fn serve(args: GdbArgs) -> Result<()> {
    let listen = Listen::parse(&args.listen)?;
    let mut trace = open_trace(&args.trace.trace)?;
    require_steps(&trace)?;
    match args.trace.cpu {
        Some(CpuChoice::One(cpu)) => trace.select_cpu(cpu)?,
        Some(CpuChoice::Each) => {
            return Err(BadArgument("gdb follows one CPU: name it with --cpu N".into()).into())
        }
        None => {}
    }
    let (images, kernel) = images(&trace, &args.trace.symbols)?;
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
    let symbols = match kernel.filter(|_| !args.trace.no_kernel_symbols) {
        Some((elf, path)) => SymbolFile::for_kernel(&elf, path.as_deref())?,
        None => None,
    };
    if let Some(file) = &symbols {
        vtrace_vmm::user_message(&format!(
            "vtrace: gdb loads the kernel's symbols from {} ({})",
            file.path().display(),
            file.what
        ));
        target.offer_symbols(file.path().to_path_buf());
    }
    let listener = Listener::bind(&listen)?;
    let step = target.step()?;
    // One line, flushed: scripts wait for it to start gdb.
    vtrace_vmm::user_message(&format!(
        "vtrace: serving the trace to gdb at {address}, standing at step {step}: in gdb, \
         `target remote {address}`",
        address = listener.address()
    ));
    serve_trace(&mut target, &listener)?;
    Ok(())
}

/// The traced kernel's ELF (a bzImage's vmlinux) and its path where the
/// file is that ELF itself.
type KernelElf = (Vec<u8>, Option<PathBuf>);

/// Read-only memory: the images `--symbols` names (for every address
/// space) and the traced kernel's, where it is found; and the traced
/// kernel, for gdb's symbols.
fn images(
    trace: &vtrace_analyzer::Trace,
    symbols: &[String],
) -> Result<(Vec<ReadOnlyImage>, Option<KernelElf>)> {
    let mut out = Vec::new();
    for spec in symbols.iter().filter(|s| !s.contains('@')) {
        let bytes = vtrace_image::symbols::read_symbol_file(Path::new(spec))
            .with_context(|| format!("reading {spec}"))?;
        out.push(ReadOnlyImage::from_elf(&elf_of(bytes).0));
    }
    let mut kernel = None;
    if let Some(name) = trace.metadata.kernel.as_deref() {
        let builtin = vtrace_session::builtin_kernels();
        if let Some((_, bytes)) = builtin.builtin.iter().find(|(k, _)| *k == name) {
            out.push(ReadOnlyImage::from_elf(bytes));
            kernel = Some((bytes.to_vec(), None));
        } else if let Ok(bytes) = vtrace_image::symbols::read_symbol_file(Path::new(name)) {
            let (elf, itself) = elf_of(bytes);
            out.push(ReadOnlyImage::from_elf(&elf));
            kernel = Some((elf, itself.then(|| PathBuf::from(name))));
        }
    }
    out.retain(|i| !i.is_empty());
    Ok((out, kernel))
}

/// An ELF image as it is (true), or a bzImage's vmlinux (false).
fn elf_of(bytes: Vec<u8>) -> (Vec<u8>, bool) {
    match vtrace_image::bzimage::vmlinux_inside(&bytes) {
        Some(vmlinux) => (vmlinux, false),
        None => (bytes, true),
    }
}
