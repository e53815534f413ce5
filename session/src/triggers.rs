//! From what a run asks for to what the tracer watches: captures,
//! `--trace-function` routines and probes, each at a place found in the
//! guest's images, within the CPU's four breakpoints.

use vtrace_image::probe_dwarf::DwarfTypes;
use vtrace_image::probe_fetch;
use vtrace_image::sdt::{self, ProbeSite};
use vtrace_trap::{CaptureSite, FunctionProbe, FunctionSite, StaticSite, MAX_CAPTURES};
use vtrace_vmm::BootSource;
use vtrace_x86::dr::BREAKPOINTS;

use crate::location::{parse_location, Location};
use crate::places::{Place, Places};
use crate::request::CaptureRequest;
use crate::SessionError;

type Result<T> = std::result::Result<T, SessionError>;

/// Finds the place `option` names, if given; what the user should know of
/// it goes to `notes`.
pub(crate) fn find_place(
    places: &mut Places<'_>,
    location: &Option<Location>,
    option: &str,
    notes: &mut Vec<String>,
) -> Result<Option<Place>> {
    let place = places.find(location, option)?;
    if let Some(note) = place.as_ref().and_then(|p| p.note.clone()) {
        notes.push(note);
    }
    Ok(place)
}

/// The captures' places, found as triggers' are.
pub(crate) fn capture_sites(
    captures: &[CaptureRequest],
    places: &mut Places<'_>,
    notes: &mut Vec<String>,
) -> Result<Vec<CaptureSite>> {
    if captures.len() > MAX_CAPTURES {
        return Err(SessionError::request(format!(
            "{} captures given; a run takes at most {MAX_CAPTURES}",
            captures.len()
        )));
    }
    let mut sites = Vec::with_capacity(captures.len());
    for capture in captures {
        let option = format!("--capture {}", capture.name);
        let location = Some(capture.place.clone());
        let Some(place) = find_place(places, &location, &option, notes)? else {
            continue;
        };
        sites.push(CaptureSite {
            name: capture.name.clone(),
            at: place.address,
            register: capture.register,
            length: capture.length,
            task: place.task,
        });
    }
    Ok(sites)
}

/// The `--trace-function` routines, found as triggers' are; each takes a
/// breakpoint.
pub(crate) fn function_sites(
    functions: &[Location],
    places: &mut Places<'_>,
    start_at: bool,
    notes: &mut Vec<String>,
) -> Result<Vec<FunctionSite>> {
    let room = BREAKPOINTS - usize::from(start_at);
    if functions.len() > room {
        return Err(SessionError::request(format!(
            "{} --trace-function routines given; the CPU's breakpoints watch at most {room}{}",
            functions.len(),
            if start_at { " beside --start-at" } else { "" }
        )));
    }
    let mut sites = Vec::with_capacity(functions.len());
    for location in functions {
        let name = location.to_string();
        let option = format!("--trace-function {name}");
        let location = Some(location.clone());
        let Some(place) = find_place(places, &location, &option, notes)? else {
            continue;
        };
        sites.push(FunctionSite {
            name,
            entry: place.address,
            task: place.task,
        });
    }
    Ok(sites)
}

/// The static probe sites of a kernel image: an ELF, or the vmlinux
/// inside a bzImage. `what` names the image in errors.
pub fn kernel_probes(bytes: &[u8], what: &str) -> Result<Vec<ProbeSite>> {
    let unreadable = |source| SessionError::Probes {
        what: what.to_string(),
        source,
    };
    if bytes.starts_with(b"\x7fELF") {
        return sdt::probe_sites(bytes).map_err(unreadable);
    }
    match vtrace_image::bzimage::vmlinux_inside(bytes) {
        Some(vmlinux) => sdt::probe_sites(&vmlinux).map_err(|source| SessionError::Probes {
            what: format!("the vmlinux inside {what}"),
            source,
        }),
        None => Err(SessionError::request(format!(
            "{what} is neither an ELF file nor a bzImage whose vmlinux vtrace can unpack"
        ))),
    }
}

/// The static probe sites of the kernel, each by its probe's name (none
/// for a real-mode image, or a bzImage where no pattern asks for them:
/// unpacking it costs time). Every pattern of `probes` that is not a fn:
/// probe must name one.
pub(crate) fn static_probe_sites(
    probes: &[String],
    boot: &BootSource,
    notes: &mut Vec<String>,
) -> Result<Vec<StaticSite>> {
    let patterns: Vec<&String> = probes
        .iter()
        .filter(|p| !p.starts_with("fn:") && !p.starts_with("fnret:") && !p.starts_with("tp:"))
        .collect();
    let kernel = match boot {
        BootSource::Kernel { kernel, .. } => kernel,
        BootSource::RealMode { .. } => {
            if let Some(p) = patterns.first() {
                return Err(SessionError::request(format!(
                    "--probe {p}: a real-mode image has no probes (fn:ROUTINE needs symbols)"
                )));
            }
            return Ok(Vec::new());
        }
    };
    let elf = kernel.bytes.starts_with(b"\x7fELF");
    if !elf && patterns.is_empty() {
        return Ok(Vec::new());
    }
    let sites = match kernel_probes(&kernel.bytes, &kernel.name) {
        Ok(sites) => sites,
        Err(e) if patterns.is_empty() => {
            notes.push(format!("vtrace: static probes are off: {e}"));
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    for pattern in patterns {
        if !sites
            .iter()
            .any(|s| vtrace_trap::probe_matches(pattern, &s.probe()))
        {
            let mut names: Vec<String> = sites.iter().map(|s| s.probe()).collect();
            names.sort();
            names.dedup();
            let known = match names.is_empty() {
                true => {
                    "it has none (vtrace-sdt.h makes them); fn:ROUTINE probes need none".to_string()
                }
                false => format!("its probes: {}", names.join(", ")),
            };
            return Err(SessionError::request(format!(
                "--probe {pattern} matches no static probe of {}: {known}",
                kernel.name
            )));
        }
    }
    Ok(sites
        .into_iter()
        .map(|s| StaticSite {
            probe: s.probe(),
            pc: s.pc,
            semaphore: s.semaphore_physical,
            args: s.arguments.len(),
        })
        .collect())
}

/// The `fn:ROUTINE` probes among `probes`, found as triggers' places are;
/// each takes a breakpoint while tracing is off, after the `taken` ones.
/// A probe's name: a typed `fn:` probe's without its argument list
/// (`fn:filp_open(filename:string)` is `fn:filp_open`).
pub(crate) fn probe_name(probe: &str) -> String {
    match probe.split_once(':') {
        Some((kind @ ("fn" | "fnret" | "tp"), rest)) => {
            format!("{kind}:{}", rest.split('(').next().unwrap_or(rest).trim())
        }
        _ => probe.to_string(),
    }
}

/// Where a kernel's types come from.
pub(crate) enum ProbeTypes {
    /// Its BTF (Linux).
    Btf(probe_fetch::Btf),
    /// Its DWARF (an ELF kernel built with `-g`, such as the demo OS).
    Dwarf(Box<DwarfTypes>),
}

impl ProbeTypes {
    fn plan(
        &self,
        routine: &str,
        specs: &[probe_fetch::FetchSpec],
    ) -> std::result::Result<Vec<probe_fetch::Fetch>, probe_fetch::FetchError> {
        match self {
            ProbeTypes::Btf(btf) => probe_fetch::plan(btf, routine, specs),
            ProbeTypes::Dwarf(dwarf) => dwarf.plan(routine, specs),
        }
    }
}

/// The kernel's types, where a typed `fn:` probe needs them: its BTF (the
/// vmlinux inside a bzImage, or an ELF kernel's own), else an ELF
/// kernel's DWARF.
pub(crate) fn probe_types(probes: &[String], boot: &BootSource) -> Option<ProbeTypes> {
    let typed = probes
        .iter()
        .any(|p| p.starts_with("fn:") && p.contains('('));
    let BootSource::Kernel { kernel, .. } = boot else {
        return None;
    };
    if !typed {
        return None;
    }
    let btf = match vtrace_image::bzimage::vmlinux_inside(&kernel.bytes) {
        Some(vmlinux) => probe_fetch::read_btf(&vmlinux),
        None => probe_fetch::read_btf(&kernel.bytes),
    };
    match btf {
        Some(btf) => Some(ProbeTypes::Btf(btf)),
        None => DwarfTypes::from_elf(&kernel.bytes).map(|d| ProbeTypes::Dwarf(Box::new(d))),
    }
}

/// The `fn:` probes' places and typed fetches.
pub(crate) fn function_probes(
    probes: &[String],
    places: &mut Places<'_>,
    types: Option<&ProbeTypes>,
    taken: usize,
    notes: &mut Vec<String>,
) -> Result<Vec<FunctionProbe>> {
    // (kind, routine and values), fnret: probes firing at the return.
    let wanted: Vec<(&str, &str)> = probes
        .iter()
        .filter_map(|p| {
            p.strip_prefix("fn:")
                .map(|r| ("fn", r))
                .or_else(|| p.strip_prefix("fnret:").map(|r| ("fnret", r)))
        })
        .collect();
    // fn: probes must have their breakpoints; fnret: probes take theirs
    // (an entry each, and a return address for each call in flight)
    // only where at least one is left over for the returns.
    let breakpoints = wanted.iter().filter(|(kind, _)| *kind == "fn").count();
    let returning = wanted.len() - breakpoints;
    let room = BREAKPOINTS.saturating_sub(taken);
    let returns_untraced = breakpoints + returning < room;
    if breakpoints > room {
        return Err(SessionError::request(format!(
            "{breakpoints} fn: probes given; the CPU's breakpoints watch {room} more beside \
             --start-at and --trace-function",
        )));
    }
    let mut found = Vec::with_capacity(wanted.len());
    for (kind, text) in wanted {
        let (routine, specs) = probe_fetch::parse_probe(text)
            .map_err(|e| SessionError::request(format!("--probe {kind}:{e}")))?;
        let routine = routine.trim();
        if routine.contains(['*', '?']) {
            return Err(SessionError::request(format!(
                "--probe {kind}:{routine}: a {kind}: probe names one routine (each is watched \
                 at its address)"
            )));
        }
        if kind == "fnret" && !specs.is_empty() {
            return Err(SessionError::request(format!(
                "--probe fnret:{text}: an fnret: probe takes no values to fetch; it gives the \
                 return value (retval) and the steps since the entry (steps)"
            )));
        }
        let option = format!("--probe {kind}:{routine}");
        let location =
            parse_location(routine).map_err(|e| SessionError::request(format!("{option}: {e}")))?;
        let fetches = match (&location, types) {
            (_, _) if specs.is_empty() => Ok(Vec::new()),
            // The kernel's types name a kernel routine's parameters.
            (
                Location::Symbol {
                    program: None,
                    name,
                    offset: 0,
                },
                Some(types),
            ) => types.plan(name, &specs),
            // A user program's own DWARF, where it was built with -g.
            (
                Location::Symbol {
                    program: Some(program),
                    name,
                    offset: 0,
                },
                _,
            ) => match places.program_types(program) {
                Some(dwarf) => dwarf.plan(name, &specs),
                None => probe_fetch::plan_untyped(routine, &specs),
            },
            _ => probe_fetch::plan_untyped(routine, &specs),
        }
        .map_err(|e| SessionError::request(format!("--probe {e}")))?;
        // The places name the routine after the option's kind.
        let kind_option = format!("--probe {kind}:");
        let Some(place) = find_place(places, &Some(location), &kind_option, notes)? else {
            continue;
        };
        found.push(FunctionProbe {
            probe: format!("{kind}:{routine}"),
            entry: place.address,
            task: place.task,
            fetches,
            at_return: kind == "fnret",
            tracepoint: false,
            untraced: kind == "fn" || returns_untraced,
        });
    }
    if found.iter().any(|f| f.at_return) {
        notes.push(fnret_note(returns_untraced));
    }
    Ok(found)
}

/// How `fnret:` probes fire in this run: also untraced, or not.
fn fnret_note(untraced: bool) -> String {
    match untraced {
        true => "vtrace: fnret: probes fire at each return: while tracing, seen step by step \
                 (with its `steps`); while not, through breakpoints at the routine's entry and \
                 at each call's return address (with `ns`, the host's time between them), as \
                 far as debug registers are left"
            .to_string(),
        false => "vtrace: fnret: probes fire while instructions are traced (a call is seen to \
                  return step by step): no debug registers are left to watch their calls while \
                  tracing is off"
            .to_string(),
    }
}

/// What the user should know of captures while tracing is off: only as
/// many places as there are debug registers left (`taken` are not) are
/// watched.
pub(crate) fn capture_note(sites: &[CaptureSite], taken: usize) -> Option<String> {
    let mut places: Vec<u64> = sites.iter().map(|s| s.at).collect();
    places.sort_unstable();
    places.dedup();
    let room = BREAKPOINTS.saturating_sub(taken);
    (places.len() > room).then(|| {
        format!(
            "vtrace: --capture: {} places, and the CPU's breakpoints watch {room} of them \
             while tracing is off (all are taken while tracing)",
            places.len()
        )
    })
}
