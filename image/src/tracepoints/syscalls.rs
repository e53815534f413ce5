//! The `syscalls:` events (`sys_enter_openat`, `sys_exit_openat`). The
//! kernel has no site of its own for them: it makes them from
//! `raw_syscalls:*`, which are gated. vtrace fires them at the system
//! call's own routine, `__x64_sys_NAME`, whose one parameter is the
//! caller's saved registers (`struct pt_regs *`): an argument is read
//! from where the system call ABI's register for it (rdi, rsi, rdx, r10,
//! r8, r9) was saved, the number from `orig_ax`. `sys_exit_NAME` fires
//! where that routine returns, as an `fnret:` probe (its `ret` is the
//! return value; its number is the routine's index in `sys_call_table`,
//! read from the image where the kernel has that table). Names and types are the kernel's `__syscall_meta__NAME`
//! (`struct syscall_metadata`), as tracefs's `format` gives them.

use btf_rs::Btf;

use super::image::ImageMemory;
use super::{guarded, EventField, Field, FiresAt, Parameter, Site, SiteState, Tracepoint};
use crate::probe_fetch::{
    self, cast_kind, natural_kind, underlying, ArgSource, Fetch, FetchError, FetchKind, FetchSpec,
};

/// Arguments a system call has at most.
const MAX_ARGS: usize = 6;

/// Metadata records read, at most (Debian's 6.1 kernel has about 450).
const MAX_SYSCALLS: usize = 4096;

/// `struct pt_regs`'s members holding the arguments, in order, and the
/// number.
const ARG_MEMBERS: [&str; MAX_ARGS] = ["di", "si", "dx", "r10", "r8", "r9"];
const NUMBER_MEMBER: &str = "orig_ax";

/// Their offsets where the kernel has no BTF (x86-64's `pt_regs`).
const ARG_OFFSETS: [u64; MAX_ARGS] = [112, 104, 96, 56, 72, 64];
const NUMBER_OFFSET: u64 = 120;

/// The system call number's field, as tracefs names it.
const NUMBER_FIELD: &str = "__syscall_nr";

/// Entries of `sys_call_table` read, at most (x86-64 has some 460).
const MAX_NUMBERS: u64 = 1024;

/// The `syscalls:` events of the kernel: a `sys_enter_NAME` and a
/// `sys_exit_NAME` for each `__syscall_meta__NAME` whose `__x64_sys_NAME`
/// kallsyms has.
pub(super) fn syscall_events(
    image: &ImageMemory<'_>,
    symbols: &[(char, String, u64)],
    find: &dyn Fn(&str) -> Option<u64>,
    btf: Option<&Btf>,
) -> Vec<Tracepoint> {
    let offset = |member: &str, fallback: u64| {
        guarded(btf, |b| {
            probe_fetch::struct_member_offset(b, "syscall_metadata", member)
        })
        .unwrap_or(fallback)
    };
    let layout = MetadataLayout {
        name: offset("name", 0),
        count: offset("nb_args", 12),
        types: offset("types", 16),
        args: offset("args", 24),
    };
    let sources = register_sources(btf);
    let numbers = numbers(image, symbols, find);
    let mut found = Vec::new();
    for (_, symbol, meta) in symbols {
        if found.len() >= 2 * MAX_SYSCALLS {
            break;
        }
        if !symbol.starts_with("__syscall_meta__") {
            continue;
        }
        let Some((call, parameters)) = read_metadata(image, &layout, *meta) else {
            continue;
        };
        if let Some(entry) = find(&format!("__x64_sys_{call}")) {
            let number = numbers.get(&entry).copied();
            found.extend(events(&call, (entry, number), parameters, &sources));
        }
    }
    found
}

/// Each system call routine's number: its first index in
/// `sys_call_table` (read up to the next symbol, at most [`MAX_NUMBERS`]
/// entries). Empty where the kernel has no such table (6.9 and later
/// dispatch through a switch).
fn numbers(
    image: &ImageMemory<'_>,
    symbols: &[(char, String, u64)],
    find: &dyn Fn(&str) -> Option<u64>,
) -> std::collections::HashMap<u64, u64> {
    let mut by_entry = std::collections::HashMap::new();
    let Some(table) = find("sys_call_table") else {
        return by_entry;
    };
    let next = symbols
        .iter()
        .map(|s| s.2)
        .filter(|a| *a > table)
        .min()
        .unwrap_or(u64::MAX);
    let count = (next.saturating_sub(table) / 8).min(MAX_NUMBERS);
    for nr in 0..count {
        let Some(entry) = table.checked_add(8 * nr).and_then(|a| image.u64_at(a)) else {
            break;
        };
        by_entry.entry(entry).or_insert(nr);
    }
    by_entry
}

/// Where `struct syscall_metadata` keeps what vtrace reads.
struct MetadataLayout {
    /// `const char *name` (`sys_openat`).
    name: u64,
    /// `int nb_args`.
    count: u64,
    /// `const char **types`.
    types: u64,
    /// `const char **args`.
    args: u64,
}

/// The call's name (`openat`) and parameters of the metadata at `meta`.
fn read_metadata(
    image: &ImageMemory<'_>,
    layout: &MetadataLayout,
    meta: u64,
) -> Option<(String, Vec<Parameter>)> {
    let name = image.c_string(image.u64_at(meta.checked_add(layout.name)?)?)?;
    let call = name.strip_prefix("sys_").filter(|c| !c.is_empty())?;
    let count = usize::try_from(image.i32_at(meta.checked_add(layout.count)?)?).ok()?;
    if count > MAX_ARGS {
        return None;
    }
    let strings = |at: u64, i: usize| {
        let list = image.u64_at(meta.checked_add(at)?)?;
        let item = image.u64_at(list.checked_add(8 * i as u64)?)?;
        image.c_string(item)
    };
    let parameters = (0..count)
        .map(|i| {
            Some(Parameter {
                name: strings(layout.args, i)?,
                type_name: strings(layout.types, i)?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some((call.to_string(), parameters))
}

/// The two events of system call `call`, whose routine starts at `entry`
/// and whose number is `number`, where known.
fn events(
    call: &str,
    (entry, number): (u64, Option<u64>),
    parameters: Vec<Parameter>,
    sources: &RegisterSources,
) -> [Tracepoint; 2] {
    let field = |type_name: &str, name: &str, from: Option<String>| Field {
        field: EventField {
            type_name: type_name.into(),
            name: name.into(),
        },
        from,
    };
    let mut enter_fields = vec![field(
        "int",
        NUMBER_FIELD,
        Some(format!("regs->{NUMBER_MEMBER}")),
    )];
    enter_fields.extend(
        parameters
            .iter()
            .zip(ARG_MEMBERS)
            .map(|(p, m)| field(&p.type_name, &p.name, Some(format!("regs->{m}")))),
    );
    let mut arguments: Vec<Option<ArgSource>> = vec![Some(sources.number)];
    arguments.extend(
        sources.arguments[..parameters.len()]
            .iter()
            .copied()
            .map(Some),
    );
    let site = Site {
        pc: entry,
        state: SiteState::Fires,
        arguments,
    };
    let exit = Tracepoint {
        system: Some("syscalls".into()),
        name: format!("sys_exit_{call}"),
        parameters: Vec::new(),
        fields: vec![
            field(
                "int",
                NUMBER_FIELD,
                number.map(|nr| format!("its index in sys_call_table: {nr}")),
            ),
            field("long", "ret", Some("RAX at the return (retval)".into())),
        ],
        // It reads nothing at its return: its number is known now, its
        // value is the return value.
        sites: vec![Site {
            arguments: vec![number.map(ArgSource::Constant)],
            ..site.clone()
        }],
        gated: false,
        fires_at: FiresAt::SyscallReturn,
    };
    let enter = Tracepoint {
        system: Some("syscalls".into()),
        name: format!("sys_enter_{call}"),
        parameters,
        fields: enter_fields,
        sites: vec![site],
        gated: false,
        fires_at: FiresAt::SyscallEntry,
    };
    [enter, exit]
}

/// Where the number and each argument are at `__x64_sys_NAME`'s entry.
struct RegisterSources {
    number: ArgSource,
    arguments: [ArgSource; MAX_ARGS],
}

fn register_sources(btf: Option<&Btf>) -> RegisterSources {
    let regs = probe_fetch::ARGUMENT_REGISTERS[0];
    let saved = |member: &str, fallback: u64| ArgSource::Memory {
        base: Some(regs),
        disp: guarded(btf, |b| {
            probe_fetch::struct_member_offset(b, "pt_regs", member)
        })
        .unwrap_or(fallback),
        size: 8,
        signed: false,
    };
    RegisterSources {
        number: saved(NUMBER_MEMBER, NUMBER_OFFSET),
        arguments: std::array::from_fn(|i| saved(ARG_MEMBERS[i], ARG_OFFSETS[i])),
    }
}

/// The fetches of a `syscalls:` probe (`sys_enter_openat(filename)`):
/// the fields named, or without `specs` every field. An argument's type
/// is the kernel's text for it: a `char *` reads as text, another pointer
/// shows in hex, an integer type has the size and sign BTF gives its name
/// (a whole word where it has none). A cast (`:u32`, `:string`) chooses.
pub(super) fn plan(
    btf: &Btf,
    tp: &Tracepoint,
    specs: &[FetchSpec],
) -> Result<Vec<(u64, Vec<Fetch>)>, FetchError> {
    let what = tp.probe();
    let Some(site) = tp.sites.first() else {
        return Ok(Vec::new());
    };
    if tp.fires_at == FiresAt::SyscallReturn {
        return return_plan(&what, site, specs);
    }
    let defaults: Vec<FetchSpec>;
    let specs = match specs.is_empty() {
        true => {
            defaults = tp
                .fields
                .iter()
                .filter(|f| f.from.is_some())
                .map(|f| FetchSpec {
                    label: f.field.name.clone(),
                    parameter: f.field.name.clone(),
                    fields: Vec::new(),
                    cast: None,
                })
                .collect();
            &defaults
        }
        false => specs,
    };
    let fetches = specs
        .iter()
        .map(|spec| {
            let Some(index) = tp
                .fields
                .iter()
                .position(|f| f.from.is_some() && f.field.name == spec.parameter)
            else {
                let names: Vec<&str> = tp.fields.iter().map(|f| f.field.name.as_str()).collect();
                return Err(FetchError(format!(
                    "{what}({}): the event has no field {} (it has: {})",
                    spec.label,
                    spec.parameter,
                    names.join(", ")
                )));
            };
            if !spec.fields.is_empty() {
                return Err(FetchError(format!(
                    "{what}({}): a system call's arguments are read as the kernel's format has \
                     them, not followed (`->`)",
                    spec.label
                )));
            }
            let type_name = &tp.fields[index].field.type_name;
            // `parse_probe` refused any other cast already.
            let kind = match spec.cast.as_deref() {
                Some("string") => FetchKind::TextAt,
                Some(cast) => cast_kind(cast).unwrap_or(FetchKind::Pointer),
                None => kind_of(btf, type_name),
            };
            let source = site
                .arguments
                .get(index)
                .copied()
                .flatten()
                .ok_or_else(|| FetchError(format!("{what}({}): not known", spec.label)))?;
            Ok(Fetch {
                label: spec.label.clone(),
                source,
                loads: Vec::new(),
                field: None,
                kind,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let fetches = fetches
        .into_iter()
        .take(vtrace_storage::MAX_PROBE_FIELDS)
        .collect();
    Ok(vec![(site.pc, fetches)])
}

/// The plan of a `sys_exit_NAME` probe at `site`: it takes no values
/// asked for (`specs`); its number is the one fetch, a constant, where the
/// kernel's table gave it.
fn return_plan(
    what: &str,
    site: &Site,
    specs: &[FetchSpec],
) -> Result<Vec<(u64, Vec<Fetch>)>, FetchError> {
    if !specs.is_empty() {
        return Err(FetchError(format!(
            "{what}(...): a return event reads no values (its `ret` is the return value, \
             shown as retval)"
        )));
    }
    let number = site
        .arguments
        .first()
        .copied()
        .flatten()
        .map(|source| Fetch {
            label: NUMBER_FIELD.into(),
            source,
            loads: Vec::new(),
            field: None,
            kind: FetchKind::Int {
                size: 4,
                signed: true,
            },
        });
    Ok(vec![(site.pc, number.into_iter().collect())])
}

/// How a value of the C type `text` (`const char *`, `umode_t`) shows.
fn kind_of(btf: &Btf, text: &str) -> FetchKind {
    if let Some(pointee) = text.trim_end().strip_suffix('*') {
        let words = c_words(pointee);
        return match words.as_slice() {
            ["char"] | ["unsigned", "char"] => FetchKind::TextAt,
            _ => FetchKind::Pointer,
        };
    }
    let words = c_words(text);
    let by_name = |name: &str| {
        guarded(Some(btf), |b| {
            let ty = b.resolve_types_by_name(name).ok()?.into_iter().next()?;
            natural_kind(b, &underlying(b, ty))
        })
    };
    let int = |size, signed| FetchKind::Int { size, signed };
    let unsigned = words.contains(&"unsigned");
    let kind = match words.as_slice() {
        [name] => by_name(name),
        _ if words.contains(&"char") => Some(int(1, !unsigned)),
        _ if words.contains(&"short") => Some(int(2, !unsigned)),
        _ if words.contains(&"long") => Some(int(8, !unsigned)),
        _ if words.contains(&"int") || unsigned => Some(int(4, !unsigned)),
        _ => None,
    };
    match kind {
        Some(k @ FetchKind::Int { .. }) | Some(k @ FetchKind::Pointer) => k,
        _ => int(8, true),
    }
}

/// The words of a C type that say what it is (`const`, `__user` and the
/// like dropped).
fn c_words(text: &str) -> Vec<&str> {
    text.split_whitespace()
        .filter(|w| !matches!(*w, "const" | "volatile" | "__user" | "signed" | "struct"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_type_words_drop_qualifiers() {
        assert_eq!(c_words("const char __user "), ["char"]);
        assert_eq!(c_words("unsigned long"), ["unsigned", "long"]);
    }
}
