//! Tracepoints in words, for `vtrace probes list`.

use std::fmt::Write as _;

use super::{SiteState, Tracepoint};

/// A table: a line per tracepoint with its sites, those that fire, and
/// its parameters.
pub fn format_table(tracepoints: &[Tracepoint]) -> String {
    let width = tracepoints
        .iter()
        .map(|t| t.probe().len())
        .max()
        .unwrap_or(10)
        .max(10);
    let mut out = format!("{:width$}  sites  fire  parameters\n", "tracepoint");
    for t in tracepoints {
        let names: Vec<&str> = t.parameters.iter().map(|p| p.name.as_str()).collect();
        let _ = writeln!(
            out,
            "{:width$}  {:>5}  {:>4}  {}",
            t.probe(),
            t.sites.len(),
            t.firing_sites().count(),
            names.join(", ")
        );
    }
    out
}

/// One tracepoint in full: parameters, its event's fields and where each
/// is read from, and each site's state.
pub fn format_detail(t: &Tracepoint) -> String {
    let mut out = format!("{}\n", t.probe());
    let parameters: Vec<String> = t
        .parameters
        .iter()
        .map(|p| match p.type_name.ends_with('*') {
            true => format!("{}{}", p.type_name, p.name),
            false => format!("{} {}", p.type_name, p.name),
        })
        .collect();
    let _ = match parameters.is_empty() {
        true => writeln!(out, "  parameters: none"),
        false => writeln!(out, "  parameters: {}", parameters.join(", ")),
    };
    for (i, f) in t.fields.iter().enumerate() {
        let label = if i == 0 { "  fields:" } else { "" };
        let from = match &f.from {
            Some(from) => format!("read from {from}"),
            None => "computed by the kernel: not read".to_string(),
        };
        let _ = writeln!(
            out,
            "{label:14}{} {} ({from})",
            f.field.type_name, f.field.name
        );
    }
    for (i, s) in t.sites.iter().enumerate() {
        let label = if i == 0 { "  sites:" } else { "" };
        let state = match s.state {
            _ if t.gated => "gated: does not fire".to_string(),
            SiteState::Fires => "fires".to_string(),
            SiteState::FiresPartly => {
                let missing: Vec<&str> = t
                    .parameters
                    .iter()
                    .zip(&s.arguments)
                    .filter(|(_, a)| a.is_none())
                    .map(|(p, _)| p.name.as_str())
                    .collect();
                format!("fires without {}", missing.join(", "))
            }
            SiteState::Guard => "guards another site: does not fire".to_string(),
            SiteState::Unreadable => {
                "jumps to code vtrace does not follow (a helper's call): does not fire".to_string()
            }
        };
        let _ = writeln!(out, "{label:14}{:#x} {state}", s.pc);
    }
    match t.fires_at {
        super::FiresAt::Sites => {}
        super::FiresAt::SyscallEntry => {
            let _ = writeln!(
                out,
                "  fires at:   the system call's routine's entry, arguments read from the \
                 registers it was called with"
            );
        }
        super::FiresAt::SyscallReturn => {
            let _ = writeln!(
                out,
                "  fires at:   where the system call's routine returns (ret: its return \
                 value), as an fnret: probe"
            );
        }
    }
    if t.sites.is_empty() {
        let _ = writeln!(out, "  sites:      none (the kernel never calls it)");
    }
    if t.gated {
        let _ = writeln!(
            out,
            "  gated:      its callers reach its sites only while a probe is registered in \
             the guest (it has a regfunc): it does not fire"
        );
    }
    out
}
