//! The kernel's own tracepoints (`sched:sched_switch`, `irq:*`), found in
//! its image and fired without changing the guest.
//!
//! Each `__tracepoint_NAME` (kallsyms) is a tracepoint; its sites are the
//! entries of `__jump_table` whose static key is the tracepoint's `key`:
//! a 5-byte NOP in the code that calls it. Its parameters are those of
//! `__traceiter_NAME` after `__data` (BTF); its system and record fields
//! come from `event_NAME` (`events.rs`). A probe `tp:SYSTEM:NAME` fires
//! where a traced step runs a site's NOP, with the arguments where the
//! site's out-of-line block would load them (`site_args.rs`): the guest's
//! tracepoint stays disabled and its code unchanged. The event's fields
//! that name a parameter (`prev_state`) or a parameter's member
//! (`prev_comm` is `prev->comm`) are fetched from it; fields the kernel
//! computes in its `TP_fast_assign` are not.

mod events;
mod image;
mod listing;
mod site_args;
mod syscalls;

use std::collections::HashMap;

use btf_rs::{Btf, BtfType, Type};
use serde::Serialize;

use crate::probe_fetch::{self, ArgSource, Fetch, FetchError, FetchSpec};
use events::{event_info, EventLayout};
use image::ImageMemory;
use site_args::{instruction_window, walk, SiteWalk};

pub use events::EventField;
pub use listing::{format_detail, format_table};

/// Jump table entries read, at most (Debian's 6.1 kernel has 5,900).
const MAX_JUMP_ENTRIES: u64 = 1 << 20;

/// Sites of one tracepoint followed, at most (Debian's 6.1 kernel's most
/// called has 176): a crafted image's one key with a million sites must
/// not cost a walk from each past every other.
const MAX_SITES: usize = 4096;

/// Site walks per image, at most (a crafted kallsyms may name one key
/// for many tracepoints).
const MAX_WALKS: usize = 1 << 16;

/// A jump table entry's size: code and target offsets (32-bit), the key's
/// offset (64-bit), each from its own field's address.
const JUMP_ENTRY: u64 = 16;

/// A parameter of a tracepoint, as its `TP_PROTO` declares it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Parameter {
    /// `prev`.
    pub name: String,
    /// `struct task_struct *`.
    #[serde(rename = "type")]
    pub type_name: String,
}

/// A field of the event's record, and where vtrace reads it from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Field {
    /// Its name and type, as tracefs's `format` gives them.
    #[serde(flatten)]
    pub field: EventField,
    /// The parameter (`prev_state`) or member (`prev->comm`) it is read
    /// from; none where the kernel computes it.
    pub from: Option<String>,
}

/// What a site gives a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SiteState {
    /// It fires with every argument.
    Fires,
    /// It fires; some arguments are not known there.
    FiresPartly,
    /// It only guards the code computing the arguments, which holds
    /// another site (`if (trace_X_enabled())`): it does not fire.
    Guard,
    /// Its out-of-line block could not be followed: it does not fire.
    Unreadable,
}

/// One site of a tracepoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Site {
    /// The linear address of its NOP.
    pub pc: u64,
    /// What it gives.
    pub state: SiteState,
    /// Each argument where the site has it (none: not known).
    #[serde(skip)]
    pub arguments: Vec<Option<ArgSource>>,
}

/// Where a tracepoint fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FiresAt {
    /// At its own sites: the NOPs its callers hold.
    Sites,
    /// At the entry of the system call's routine (`syscalls:sys_enter_*`,
    /// which the kernel makes from the gated `raw_syscalls:sys_enter`).
    SyscallEntry,
    /// Where that routine returns (`syscalls:sys_exit_*`), as an `fnret:`
    /// probe.
    SyscallReturn,
}

/// One of the kernel's tracepoints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Tracepoint {
    /// `sched`, from its event (none: a tracepoint with no event).
    pub system: Option<String>,
    /// `sched_switch`.
    pub name: String,
    /// Its `TP_PROTO`, from BTF.
    pub parameters: Vec<Parameter>,
    /// Its event's record.
    pub fields: Vec<Field>,
    /// Where it is called.
    #[serde(skip)]
    pub sites: Vec<Site>,
    /// Its callers reach its sites only while a probe is registered in
    /// the guest: it has a `regfunc` that sets what they check (a task's
    /// syscall work flag for `raw_syscalls:*`, a static key of its own for
    /// `exceptions:page_fault_*`). It never fires here.
    pub gated: bool,
    /// Where it fires.
    pub fires_at: FiresAt,
}

impl Tracepoint {
    /// Its probe's name: `tp:sched:sched_switch` (`tp:NAME` without a
    /// system).
    pub fn probe(&self) -> String {
        match &self.system {
            Some(system) => format!("tp:{system}:{}", self.name),
            None => format!("tp:{}", self.name),
        }
    }

    /// The sites that fire (none where it is gated).
    pub fn firing_sites(&self) -> impl Iterator<Item = &Site> {
        self.sites
            .iter()
            .filter(|s| !self.gated && matches!(s.state, SiteState::Fires | SiteState::FiresPartly))
    }
}

/// The tracepoints of the kernel whose vmlinux is `vmlinux`, with its
/// kallsyms `symbols` (`nm` type, name, address) and BTF; sorted by
/// probe name. Without BTF they have no parameters, fields or system.
pub fn tracepoints(
    vmlinux: &[u8],
    symbols: &[(char, String, u64)],
    btf: Option<&Btf>,
) -> Vec<Tracepoint> {
    let Some(image) = ImageMemory::new(vmlinux) else {
        return Vec::new();
    };
    let mut address: HashMap<&str, u64> = HashMap::new();
    for (_, name, addr) in symbols {
        address.entry(name.as_str()).or_insert(*addr);
    }
    let find = |name: &str| address.get(name).copied();
    let key_offset = guarded(btf, |b| {
        probe_fetch::struct_member_offset(b, "tracepoint", "key")
    })
    .unwrap_or(8);
    let regfunc_offset = guarded(btf, |b| {
        probe_fetch::struct_member_offset(b, "tracepoint", "regfunc")
    });
    let layout = guarded(btf, EventLayout::from_btf);
    let sites = jump_sites(&image, &find);
    let code = |addr: u64| {
        let bytes = image.from(addr)?;
        instruction_window(bytes, 0)
    };
    let mut walks = 0;
    let mut found: Vec<Tracepoint> = symbols
        .iter()
        .filter_map(|(_, symbol, addr)| Some((symbol.strip_prefix("__tracepoint_")?, *addr)))
        .filter(|(name, _)| !name.is_empty())
        .map(|(name, tp)| {
            let parameters = guarded(btf, |b| tracepoint_parameters(b, name)).unwrap_or_default();
            let info = layout
                .as_ref()
                .and_then(|l| event_info(&image, l, find(&format!("event_{name}"))?, tp))
                .unwrap_or_default();
            let key = tp.wrapping_add(key_offset);
            let mut own: Vec<(u64, u64)> = sites.get(&key).cloned().unwrap_or_default();
            own.truncate(MAX_SITES);
            let calls: Vec<u64> = [
                format!("__SCT__tp_func_{name}"),
                format!("__traceiter_{name}"),
            ]
            .iter()
            .filter_map(|c| find(c))
            .collect();
            let mut sorted: Vec<u64> = own.iter().map(|s| s.0).collect();
            sorted.sort_unstable();
            let sites = own
                .iter()
                .map(|&(pc, target)| {
                    walks += 1;
                    match walks <= MAX_WALKS {
                        true => site(
                            pc,
                            walk(&code, target, &calls, &sorted, pc, parameters.len()),
                        ),
                        false => site(pc, SiteWalk::NoCall),
                    }
                })
                .collect();
            let fields = info
                .fields
                .into_iter()
                .map(|field| Field {
                    from: guarded(btf, |b| field_source(b, name, &field.name)),
                    field,
                })
                .collect();
            let gated = regfunc_offset
                .and_then(|o| image.u64_at(tp.checked_add(o)?))
                .is_some_and(|f| f != 0);
            Tracepoint {
                system: info.system,
                name: name.to_string(),
                parameters: parameters.into_iter().map(|(p, _)| p).collect(),
                fields,
                sites,
                gated,
                fires_at: FiresAt::Sites,
            }
        })
        .collect();
    found.extend(syscalls::syscall_events(&image, symbols, &find, btf));
    found.sort_by_key(Tracepoint::probe);
    found.dedup_by_key(|t| t.probe());
    found
}

/// `f` of the BTF, if there is one. btf-rs asserts on some malformed
/// types: a crafted kernel costs its tracepoints their types, not the
/// program.
fn guarded<T>(btf: Option<&Btf>, f: impl FnOnce(&Btf) -> Option<T>) -> Option<T> {
    let btf = btf?;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(btf))).ok()?
}

fn site(pc: u64, walked: SiteWalk) -> Site {
    let (state, arguments) = match walked {
        SiteWalk::Arguments(a) if a.iter().all(Option::is_some) => (SiteState::Fires, a),
        SiteWalk::Arguments(a) => (SiteState::FiresPartly, a),
        SiteWalk::Guard => (SiteState::Guard, Vec::new()),
        SiteWalk::NoCall => (SiteState::Unreadable, Vec::new()),
    };
    Site {
        pc,
        state,
        arguments,
    }
}

/// Every static key's sites: key address -> (code, out-of-line target).
fn jump_sites(
    image: &ImageMemory<'_>,
    find: &dyn Fn(&str) -> Option<u64>,
) -> HashMap<u64, Vec<(u64, u64)>> {
    let mut by_key: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    let (Some(start), Some(stop)) = (find("__start___jump_table"), find("__stop___jump_table"))
    else {
        return by_key;
    };
    let count = (stop.saturating_sub(start) / JUMP_ENTRY).min(MAX_JUMP_ENTRIES);
    for i in 0..count {
        let entry = start.wrapping_add(i * JUMP_ENTRY);
        let (Some(code), Some(target), Some(key)) = (
            image.i32_at(entry),
            image.i32_at(entry.wrapping_add(4)),
            image.u64_at(entry.wrapping_add(8)),
        ) else {
            continue;
        };
        let code = entry.wrapping_add_signed(i64::from(code));
        let target = entry.wrapping_add(4).wrapping_add_signed(i64::from(target));
        // The key's low bits are the entry's flags (branch, init).
        let key = entry.wrapping_add(8).wrapping_add(key) & !3;
        by_key.entry(key).or_default().push((code, target));
    }
    by_key
}

/// `__traceiter_NAME`'s parameters after `__data`, named and typed.
fn tracepoint_parameters(btf: &Btf, name: &str) -> Option<Vec<(Parameter, Type)>> {
    let params = probe_fetch::parameters(btf, &format!("__traceiter_{name}")).ok()?;
    Some(
        params
            .into_iter()
            .skip(1)
            .map(|(name, ty)| {
                let type_name = type_text(btf, &ty, 0);
                (Parameter { name, type_name }, ty)
            })
            .collect(),
    )
}

/// `field`'s source among tracepoint `name`'s parameters: one of the same
/// name with a type vtrace shows, or `P->M` for a field `P_M` where `P`
/// points to a structure with a member `M`.
fn field_source(btf: &Btf, name: &str, field: &str) -> Option<String> {
    let params = tracepoint_parameters(btf, name)?;
    let shown = |ty: Type| probe_fetch::natural_kind(btf, &probe_fetch::underlying(btf, ty));
    for (p, ty) in &params {
        if p.name == field {
            return shown(ty.clone()).map(|_| p.name.clone());
        }
    }
    for (p, ty) in &params {
        let Some(member) = field
            .strip_prefix(&p.name)
            .and_then(|r| r.strip_prefix('_'))
        else {
            continue;
        };
        let Type::Ptr(ptr) = probe_fetch::underlying(btf, ty.clone()) else {
            continue;
        };
        let target = btf.resolve_chained_type(&ptr).ok()?;
        let (Type::Struct(s) | Type::Union(s)) = probe_fetch::underlying(btf, target) else {
            continue;
        };
        if let Some((_, m)) = probe_fetch::member(btf, &s, member, 0) {
            if shown(m).is_some() {
                return Some(format!("{}->{member}", p.name));
            }
        }
    }
    None
}

/// A C spelling of `ty` (`struct task_struct *`), bounded in depth.
fn type_text(btf: &Btf, ty: &Type, depth: u32) -> String {
    let name = |t: &dyn BtfType| btf.resolve_name(t).unwrap_or_default();
    let inner = |t: &dyn BtfType| match btf.resolve_chained_type(t) {
        Ok(next) if depth < 8 => type_text(btf, &next, depth + 1),
        _ => "void".to_string(),
    };
    match ty {
        Type::Void => "void".into(),
        Type::Int(t) => name(t),
        Type::Float(t) => name(t),
        Type::Typedef(t) => name(t),
        Type::Struct(t) => format!("struct {}", name(t)),
        Type::Union(t) => format!("union {}", name(t)),
        Type::Enum(t) => format!("enum {}", name(t)),
        Type::Enum64(t) => format!("enum {}", name(t)),
        Type::Fwd(t) => format!("struct {}", name(t)),
        Type::Ptr(t) => format!("{} *", inner(t)),
        Type::Const(t) => format!("const {}", inner(t)),
        Type::Volatile(t) => format!("volatile {}", inner(t)),
        Type::Restrict(t) => inner(t),
        Type::TypeTag(t) => inner(t),
        Type::Array(t) => format!("{}[{}]", inner(t), t.len()),
        _ => "?".into(),
    }
}

/// The fetches of probe `tp:...(specs)` at each of `tp`'s sites that
/// fire: (site pc, fetches). Without `specs`, the event's fields vtrace
/// can read (else its parameters). A fetch whose argument a site does not
/// have is left out there.
pub fn plan_sites(
    btf: &Btf,
    tp: &Tracepoint,
    specs: &[FetchSpec],
) -> Result<Vec<(u64, Vec<Fetch>)>, FetchError> {
    if tp.fires_at != FiresAt::Sites {
        return syscalls::plan(btf, tp, specs);
    }
    let what = tp.probe();
    let owner = format!("{what} (its parameters)");
    let params: Vec<(String, Type)> =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tracepoint_parameters(btf, &tp.name)
        }))
        .ok()
        .flatten()
        .ok_or_else(|| {
            FetchError(format!(
                "{what}: the kernel's BTF has no __traceiter_{}",
                tp.name
            ))
        })?
        .into_iter()
        .map(|(p, ty)| (p.name, ty))
        .collect();
    // Planned against a placeholder source to find every error, whatever
    // the sites.
    let plan = |specs: &[FetchSpec]| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            probe_fetch::plan_specs(btf, &what, &owner, &params, specs, |_, _| {
                Ok(ArgSource::Constant(0))
            })
        }))
        .unwrap_or_else(|_| {
            Err(FetchError(format!(
                "{what}: the kernel's BTF is damaged where this probe's types are"
            )))
        })
    };
    let (specs, planned): (Vec<FetchSpec>, Vec<Fetch>) = match specs.is_empty() {
        false => (specs.to_vec(), plan(specs)?),
        // What vtrace chose itself: the values it can show.
        true => default_specs(tp)
            .into_iter()
            .filter_map(|spec| {
                let fetch = plan(std::slice::from_ref(&spec)).ok()?.pop()?;
                Some((spec, fetch))
            })
            .unzip(),
    };
    let index_of =
        |spec: &FetchSpec| probe_fetch::parameter_index(&params, spec).unwrap_or(usize::MAX);
    Ok(tp
        .firing_sites()
        .map(|site| {
            let fetches = planned
                .iter()
                .zip(&specs)
                .filter_map(|(fetch, spec)| {
                    let source = (*site.arguments.get(index_of(spec))?)?;
                    Some(Fetch {
                        source,
                        ..fetch.clone()
                    })
                })
                .collect();
            (site.pc, fetches)
        })
        .collect())
}

/// A probe's fetches when it names none: the fields read from parameters,
/// by their field names, else the parameters.
fn default_specs(tp: &Tracepoint) -> Vec<FetchSpec> {
    let from_fields: Vec<FetchSpec> = tp
        .fields
        .iter()
        .filter_map(|f| {
            let from = f.from.as_ref()?;
            let mut path = from.split("->");
            // A text field (`char[16]`, or `__data_loc char[]` from a
            // `char *` parameter) reads as text.
            let text = f.field.type_name.contains("char[") && !from.contains("->")
                || f.field.type_name.ends_with("char *");
            Some(FetchSpec {
                label: f.field.name.clone(),
                parameter: path.next()?.to_string(),
                fields: path.map(str::to_string).collect(),
                cast: text.then(|| "string".to_string()),
            })
        })
        .collect();
    let specs = match from_fields.is_empty() {
        false => from_fields,
        true => tp
            .parameters
            .iter()
            .map(|p| FetchSpec {
                label: p.name.clone(),
                parameter: p.name.clone(),
                fields: Vec::new(),
                cast: None,
            })
            .collect(),
    };
    specs
        .into_iter()
        .take(vtrace_storage::MAX_PROBE_FIELDS)
        .collect()
}
