//! `vtrace analyze symbolize`: addresses to routine+offset and file:line.

use std::io::{BufRead, Read, Write};
use std::path::Path;

use anyhow::Result;
use vtrace_analyzer::{name_address, AddressQuery, Named};
use vtrace_image::symbols::Symbolizer;

use super::{create, open_trace, symbols};
use vtrace_session::DEFAULT_TRACE;

use crate::cli::{SymbolizeArgs, TraceArgs};
use crate::exit_status::BadArgument;

/// Longest line of standard input read as addresses: a stream that never
/// ends a line must not fill memory.
const MAX_LINE: u64 = 64 << 10;

pub(super) fn symbolize(a: SymbolizeArgs) -> Result<()> {
    let names = names(&a)?;
    let mut out = create(a.output.as_deref().unwrap_or(Path::new("-")))?;
    let json = a.json;
    let write = |out: &mut dyn Write, named: &Named| -> Result<()> {
        match json {
            true => serde_json::to_writer(&mut *out, named)?,
            // A crafted symbol file must not steer the terminal.
            false => out.write_all(vtrace_vmm::escape_within_line(&named.text()).as_bytes())?,
        }
        out.write_all(b"\n")?;
        Ok(())
    };
    if !a.addresses.is_empty() {
        for q in &a.addresses {
            write(&mut out, &name_address(&names, *q))?;
        }
        out.flush()?;
        return Ok(());
    }
    // As addr2line: each answer as soon as its line is read, so a program
    // can hold a pipe open and ask one address at a time.
    let mut stdin = std::io::stdin().lock();
    let mut bad = Vec::new();
    let mut line = Vec::new();
    for number in 1u64.. {
        line.clear();
        if (&mut stdin).take(MAX_LINE).read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&line);
        for word in text.split_whitespace() {
            match AddressQuery::parse(word) {
                Ok(q) => write(&mut out, &name_address(&names, q))?,
                Err(why) => bad.push(format!("line {number}: {why}")),
            }
        }
        out.flush()?;
    }
    if let Some(first) = bad.first() {
        return Err(BadArgument(format!(
            "{} word(s) of standard input are not addresses and were left out (the first: \
             {}); give hex addresses, one or more a line",
            bad.len(),
            vtrace_vmm::escape_within_line(first)
        ))
        .into());
    }
    Ok(())
}

/// The symbols that name the addresses: the trace's (its kernel, its
/// programs) where there is one, and `--symbols`.
fn names(a: &SymbolizeArgs) -> Result<Symbolizer> {
    let default = Path::new(DEFAULT_TRACE);
    let trace_path = match &a.trace {
        Some(path) => Some(path.clone()),
        None if default.exists() => Some(default.to_path_buf()),
        None => None,
    };
    let args = TraceArgs {
        trace: trace_path.clone().unwrap_or_else(|| default.to_path_buf()),
        symbols: a.symbols.clone(),
        no_kernel_symbols: a.no_kernel_symbols,
        sysroot: a.sysroot.clone(),
        initramfs: a.initramfs.clone(),
        quiet: true,
        cpu: None,
    };
    let names = match trace_path {
        Some(path) => symbols(&open_trace(&path)?, &args)?,
        None if a.sysroot.is_some() || a.initramfs.is_some() => {
            return Err(BadArgument(format!(
                "--sysroot and --initramfs name the programs of a trace, and there is no \
                 --trace and no {DEFAULT_TRACE} here; give the trace the addresses come from"
            ))
            .into())
        }
        None if a.symbols.is_empty() => {
            return Err(BadArgument(format!(
                "nothing to name the addresses with: no --trace, no {DEFAULT_TRACE} here and no \
                 --symbols (give the trace the addresses come from, or the image they are in)"
            ))
            .into())
        }
        None => {
            let mut names = Symbolizer::new();
            super::add_symbol_files(&mut names, &a.symbols)?;
            names
        }
    };
    if names.func_count() == 0 {
        say!("vtrace: warning: no symbols were found: every address is named `??`");
    }
    Ok(names)
}
