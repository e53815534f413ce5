//! `tp:SYSTEM:NAME` probes: the kernel's own tracepoints, each site a
//! place the tracer watches while tracing (see
//! [`vtrace_image::tracepoints`]).

use vtrace_image::probe_fetch;
use vtrace_image::tracepoints::{self, FiresAt, SiteState, Tracepoint};
use vtrace_trap::FunctionProbe;
use vtrace_vmm::BootSource;

use crate::SessionError;

type Result<T> = std::result::Result<T, SessionError>;

/// The tracepoints of a kernel image (an ELF vmlinux, or the one inside
/// a bzImage), found from its kallsyms and BTF; `what` names it in
/// errors.
pub fn kernel_tracepoints(bytes: &[u8], what: &str) -> Result<Vec<Tracepoint>> {
    let unpacked;
    let vmlinux = match bytes.starts_with(b"\x7fELF") {
        true => bytes,
        false => {
            unpacked = vtrace_image::bzimage::vmlinux_inside(bytes).ok_or_else(|| {
                SessionError::request(format!(
                    "{what} is neither an ELF file nor a bzImage whose vmlinux vtrace can unpack"
                ))
            })?;
            &unpacked
        }
    };
    Ok(vmlinux_tracepoints(vmlinux, what)?.0)
}

/// The tracepoints of `vmlinux`, and its BTF.
fn vmlinux_tracepoints(
    vmlinux: &[u8],
    what: &str,
) -> Result<(Vec<Tracepoint>, Option<probe_fetch::Btf>)> {
    let symbols = vtrace_image::symbols::all_kallsyms(vmlinux, what).map_err(|e| {
        SessionError::request(format!(
            "the tracepoints of {what} are named by its kallsyms, which vtrace cannot read: {e}"
        ))
    })?;
    let btf = probe_fetch::read_btf(vmlinux);
    Ok((
        tracepoints::tracepoints(vmlinux, &symbols, btf.as_ref()),
        btf,
    ))
}

/// The `tp:` probes among `probes`, a place per site that fires.
pub(crate) fn tracepoint_probes(
    probes: &[String],
    boot: &BootSource,
    notes: &mut Vec<String>,
) -> Result<Vec<FunctionProbe>> {
    let wanted: Vec<&str> = probes
        .iter()
        .filter_map(|p| p.strip_prefix("tp:"))
        .collect();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let BootSource::Kernel { kernel, .. } = boot else {
        return Err(SessionError::request(format!(
            "--probe tp:{}: a real-mode image has no tracepoints",
            wanted[0]
        )));
    };
    let unpacked = match kernel.bytes.starts_with(b"\x7fELF") {
        true => None,
        false => vtrace_image::bzimage::vmlinux_inside(&kernel.bytes),
    };
    let vmlinux = unpacked.as_deref().unwrap_or(&kernel.bytes);
    let (all, btf) = vmlinux_tracepoints(vmlinux, &kernel.name)?;
    let btf = btf.ok_or_else(|| {
        SessionError::request(format!(
            "--probe tp:{}: {} has no BTF to read its tracepoints' arguments by",
            wanted[0], kernel.name
        ))
    })?;
    let mut found = Vec::new();
    for text in wanted {
        let (pattern, specs) = probe_fetch::parse_probe(text)
            .map_err(|e| SessionError::request(format!("--probe tp:{e}")))?;
        let pattern = format!("tp:{}", pattern.trim());
        let matched = matching(&all, &pattern, &kernel.name)?;
        if !specs.is_empty() && (matched.len() > 1 || pattern.contains(['*', '?'])) {
            return Err(SessionError::request(format!(
                "--probe {pattern}(...): a probe with values names one tracepoint ({} match)",
                matched.len()
            )));
        }
        let mut silent = Vec::new();
        for tp in matched {
            let sites = tracepoints::plan_sites(&btf, tp, &specs)
                .map_err(|e| SessionError::request(format!("--probe {e}")))?;
            if sites.is_empty() {
                silent.push(tp);
                continue;
            }
            found.extend(sites.into_iter().map(|(entry, fetches)| FunctionProbe {
                probe: tp.probe(),
                entry,
                task: None,
                fetches,
                at_return: tp.fires_at == FiresAt::SyscallReturn,
                tracepoint: true,
                untraced: false,
            }));
        }
        match (silent.as_slice(), pattern.contains(['*', '?'])) {
            ([], _) => {}
            ([one], false) => return Err(SessionError::request(silent_reason(one))),
            (many, _) => notes.push(format!(
                "vtrace: --probe {pattern}: {} of its tracepoints have no site vtrace can fire \
                 at ({}); `vtrace probes list --kernel KERNEL '{pattern}'` says why",
                many.len(),
                many.iter()
                    .take(5)
                    .map(|t| t.probe())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
    Ok(found)
}

/// Gives the `tp:` probes' sites breakpoints, so they fire while tracing
/// is off too, where all fit in the `room` the CPU has left; returns how
/// many they take.
pub(crate) fn place_breakpoints(
    probes: &mut [FunctionProbe],
    room: usize,
    notes: &mut Vec<String>,
) -> usize {
    if probes.is_empty() {
        return 0;
    }
    // A return event (`syscalls:sys_exit_*`) is an `fnret:` probe at its
    // call's entry: the return addresses of its calls take what is left.
    let mut sites: Vec<u64> = probes.iter().map(|p| p.entry).collect();
    sites.sort_unstable();
    sites.dedup();
    let fit = sites.len() <= room;
    for p in probes.iter_mut() {
        p.untraced = fit;
    }
    notes.push(match fit {
        true => "vtrace: tp: probes fire at each site (a tracepoint's NOP, a system call's \
                 routine), through a breakpoint while tracing is off (the kernel's tracepoint \
                 stays off and its code unchanged)"
            .to_string(),
        false => format!(
            "vtrace: tp: probes fire at each site (a tracepoint's NOP, a system call's routine) \
             while instructions are traced: their {} sites are more than the {room} breakpoints \
             left for while tracing is off",
            sites.len()
        ),
    });
    if fit {
        sites.len()
    } else {
        0
    }
}

/// The tracepoints `pattern` (`tp:sched:sched_switch`, `tp:sched:*`)
/// names, or what the user should write instead.
fn matching<'a>(all: &'a [Tracepoint], pattern: &str, kernel: &str) -> Result<Vec<&'a Tracepoint>> {
    let matched: Vec<&Tracepoint> = all
        .iter()
        .filter(|t| vtrace_trap::probe_matches(pattern, &t.probe()))
        .collect();
    if !matched.is_empty() {
        return Ok(matched);
    }
    // `tp:sched_switch`: the name without its system.
    let name = pattern.rsplit(':').next().unwrap_or(pattern);
    if let Some(t) = all.iter().find(|t| t.name == name) {
        return Err(SessionError::request(format!(
            "--probe {pattern}: name the tracepoint with its system: {}",
            t.probe()
        )));
    }
    let like: Vec<String> = all
        .iter()
        .filter(|t| !name.is_empty() && t.name.contains(name.trim_matches(['*', '?'])))
        .take(8)
        .map(Tracepoint::probe)
        .collect();
    Err(SessionError::request(format!(
        "--probe {pattern} matches none of the {} tracepoints of {kernel}{}; `vtrace probes \
         list --kernel {kernel}` lists them",
        all.len(),
        match like.is_empty() {
            true => String::new(),
            false => format!(" (names like it: {})", like.join(", ")),
        }
    )))
}

/// Why a tracepoint named alone cannot fire.
fn silent_reason(tp: &Tracepoint) -> String {
    let why = match tp.sites.first().map(|s| s.state) {
        _ if tp.gated => "its callers reach its sites only while a probe is registered in the \
                          guest (it has a regfunc: a flag or key of its own is set then)"
            .to_string(),
        None => "the kernel never calls it (no site in its jump table)".to_string(),
        Some(_) if tp.sites.iter().all(|s| s.state == SiteState::Guard) => {
            "each site only guards code that computes its arguments".to_string()
        }
        Some(_) => format!(
            "vtrace cannot follow the code its {} site(s) jump to when enabled (a helper \
             routine calls it)",
            tp.sites.len()
        ),
    };
    format!("--probe {}: cannot fire: {why}", tp.probe())
}
