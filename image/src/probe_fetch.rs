//! Typed `fn:` probe arguments, as kprobe events and bpftrace give them:
//! `fn:do_sys_openat2(dfd, filename:string, how->flags)` names the
//! routine's parameters as its source does, follows pointers into
//! structures, and says how to show what it finds. The kernel's BTF gives
//! each parameter's register (the x86-64 System V ABI's first six) and
//! type, and each field's offset and type; this module turns a probe's
//! text into [`Fetch`] plans the tracer follows at the routine's entry
//! with bounded reads of guest memory.

pub use btf_rs::Btf;
use btf_rs::{BtfType, Type};

/// General registers (in `Regs::gpr` order: rax, rcx, rdx, rbx, rsp, rbp,
/// rsi, rdi, r8...) of the first six integer arguments.
pub(crate) const ARGUMENT_REGISTERS: [usize; 6] = [7, 6, 2, 1, 8, 9];

/// Longest text a fetch reads.
pub const MAX_TEXT: usize = 256;

/// Structures a fetch follows, at most (`a->b->c->d`).
const MAX_DEPTH: usize = 4;

/// How to show what a fetch reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchKind {
    /// An integer of `size` bytes (1, 2, 4 or 8).
    Int {
        /// Its width.
        size: u8,
        /// Whether it is signed.
        signed: bool,
    },
    /// An address, shown in hex (a pointer not followed).
    Pointer,
    /// Text up to its NUL: the value is a `char *` to follow.
    TextAt,
    /// Text up to its NUL, at most `max` bytes, in place (a `char[]`
    /// field, such as a task's `comm`).
    TextInPlace {
        /// The array's length (at most [`MAX_TEXT`]).
        max: usize,
    },
}

/// Where an argument is when the probe fires: a routine's entry has it
/// in its ABI register; a tracepoint's site wherever the code around it
/// keeps it (found from the code it jumps to when enabled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgSource {
    /// The low `size` bytes (1, 2, 4 or 8) of a register (an index into
    /// `Regs::gpr`).
    Register {
        /// Which one.
        register: usize,
        /// Bytes of it that count.
        size: u8,
    },
    /// `size` bytes (1, 2, 4 or 8) of memory at a register's value plus
    /// `disp` (at `disp` itself without a register), sign-extended where
    /// `signed`.
    Memory {
        /// The base register, if any.
        base: Option<usize>,
        /// Added to it (wrapping).
        disp: u64,
        /// Bytes read.
        size: u8,
        /// Whether the value is sign-extended.
        signed: bool,
    },
    /// A register's value plus `disp` (an address computed, `lea`).
    Address {
        /// Which register.
        register: usize,
        /// Added to it (wrapping).
        disp: u64,
    },
    /// A value fixed in the code.
    Constant(u64),
}

impl ArgSource {
    /// A whole register.
    pub fn register(register: usize) -> ArgSource {
        ArgSource::Register { register, size: 8 }
    }
}

/// One typed value to fetch at a routine's entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetch {
    /// As the probe wrote it (`how->flags`).
    pub label: String,
    /// Where the argument is.
    pub source: ArgSource,
    /// Each `->` but the last: read the pointer at this offset from the
    /// address so far.
    pub loads: Vec<u64>,
    /// The last `->`: the field's offset from the address so far (none:
    /// the argument itself).
    pub field: Option<u64>,
    /// How to read and show it.
    pub kind: FetchKind,
}

/// Why a typed probe cannot be planned: said to the user as it is.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FetchError(pub String);

fn fail<T>(text: String) -> Result<T, FetchError> {
    Err(FetchError(text))
}

/// One argument of a probe's text, parsed: `name(->field)*(:type)?`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchSpec {
    /// As written.
    pub label: String,
    /// The parameter's name, or `argN` (1 to 6).
    pub parameter: String,
    /// Fields followed through pointers.
    pub fields: Vec<String>,
    /// The type asked for: `string`, `u8`...`u64`, `s8`...`s64`, `x`
    /// (an address in hex).
    pub cast: Option<String>,
}

/// Splits `fn:ROUTINE(args)` into the routine and its fetches (none
/// without parentheses).
pub fn parse_probe(text: &str) -> Result<(&str, Vec<FetchSpec>), FetchError> {
    let Some((routine, rest)) = text.split_once('(') else {
        return Ok((text, Vec::new()));
    };
    let Some(list) = rest.strip_suffix(')') else {
        return fail(format!("{text}: the argument list must end with `)`"));
    };
    let mut specs = Vec::new();
    // `fn:f()` fetches nothing; an empty place in a list is a typing slip.
    if !list.trim().is_empty() {
        for arg in list.split(',').map(str::trim) {
            if arg.is_empty() {
                return fail(format!(
                    "{text}: an empty value in the argument list (values are separated by \
                     single commas: {}(arg1, arg2:string))",
                    routine.trim()
                ));
            }
            specs.push(parse_fetch(arg)?);
        }
    }
    if specs.len() > vtrace_storage::MAX_PROBE_FIELDS {
        return fail(format!(
            "{text}: {} values; a probe fetches at most {}",
            specs.len(),
            vtrace_storage::MAX_PROBE_FIELDS
        ));
    }
    Ok((routine, specs))
}

fn parse_fetch(arg: &str) -> Result<FetchSpec, FetchError> {
    let (path, cast) = match arg.split_once(':') {
        Some((p, c)) => (p.trim(), Some(c.trim().to_string())),
        None => (arg, None),
    };
    if let Some(cast) = &cast {
        if cast_kind(cast).is_none() && cast != "string" {
            return fail(format!(
                "{arg}: no type `{cast}` (string, u8, u16, u32, u64, s8, s16, s32, s64 or x)"
            ));
        }
    }
    let mut names = path.split("->").map(str::trim);
    let parameter = names.next().unwrap_or_default().to_string();
    let fields: Vec<String> = names.map(str::to_string).collect();
    let word = |w: &str| {
        !w.is_empty()
            && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !w.starts_with(|c: char| c.is_ascii_digit())
    };
    if !word(&parameter) || !fields.iter().all(|f| word(f)) {
        return fail(format!(
            "{arg}: not a fetch (a parameter, `->field`s, and `:type`: how->flags, \
             filename:string)"
        ));
    }
    if fields.len() > MAX_DEPTH {
        return fail(format!("{arg}: at most {MAX_DEPTH} `->` in a fetch"));
    }
    Ok(FetchSpec {
        // The value's name as the probe follows it, without its type.
        label: path.split_whitespace().collect::<Vec<_>>().join(""),
        parameter,
        fields,
        cast,
    })
}

/// The integer kind of a cast (`u32`, `s64`, `x`).
pub(crate) fn cast_kind(cast: &str) -> Option<FetchKind> {
    let (signed, bits) = match cast.split_at_checked(1)? {
        ("u", bits) => (false, bits),
        ("s", bits) => (true, bits),
        ("x", "") => return Some(FetchKind::Pointer),
        _ => return None,
    };
    let size = match bits {
        "8" => 1,
        "16" => 2,
        "32" => 4,
        "64" => 8,
        _ => return None,
    };
    Some(FetchKind::Int { size, signed })
}

/// `argN` (1 to 6): the argument's index.
pub(crate) fn numbered(parameter: &str) -> Option<usize> {
    let n: usize = parameter.strip_prefix("arg")?.parse().ok()?;
    (1..=6).contains(&n).then(|| n - 1)
}

/// Plans `specs` without type information (a guest without BTF): only
/// `argN` with an integer or `string` type.
pub fn plan_untyped(routine: &str, specs: &[FetchSpec]) -> Result<Vec<Fetch>, FetchError> {
    specs
        .iter()
        .map(|spec| {
            let Some(index) = numbered(&spec.parameter) else {
                return fail(format!(
                    "fn:{routine}({}): the kernel has no BTF to name parameters and fields by; \
                     use arg1 to arg6 (arg1:string, arg2:u32)",
                    spec.label
                ));
            };
            if !spec.fields.is_empty() {
                return fail(format!(
                    "fn:{routine}({}): `->` needs the kernel's BTF, which it has not",
                    spec.label
                ));
            }
            let kind = match spec.cast.as_deref() {
                Some("string") => FetchKind::TextAt,
                Some(cast) => cast_kind(cast).unwrap_or(FetchKind::Pointer),
                None => FetchKind::Int {
                    size: 8,
                    signed: true,
                },
            };
            Ok(Fetch {
                label: spec.label.clone(),
                source: ArgSource::register(ARGUMENT_REGISTERS[index]),
                loads: Vec::new(),
                field: None,
                kind,
            })
        })
        .collect()
}

/// Reads the kernel's BTF from its vmlinux ELF.
pub fn read_btf(vmlinux: &[u8]) -> Option<Btf> {
    use object::{Object, ObjectSection};
    let elf = object::File::parse(vmlinux).ok()?;
    let data = elf.section_by_name(".BTF")?.data().ok()?;
    // The parser asserts on some malformed input: a crafted image must
    // cost the typed probe, not the run.
    std::panic::catch_unwind(|| Btf::from_bytes(data))
        .ok()?
        .ok()
}

/// Plans `specs` for `routine` from the kernel's BTF.
pub fn plan(btf: &Btf, routine: &str, specs: &[FetchSpec]) -> Result<Vec<Fetch>, FetchError> {
    // btf-rs asserts on some malformed types (a size missing): a crafted
    // kernel costs the probe its types, not the run. Nothing is left half
    // changed by a panic here: the BTF is only read.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        plan_inner(btf, routine, specs)
    }))
    .unwrap_or_else(|_| {
        fail(format!(
            "fn:{routine}: the kernel's BTF is damaged where this probe's types are"
        ))
    })
}

fn plan_inner(btf: &Btf, routine: &str, specs: &[FetchSpec]) -> Result<Vec<Fetch>, FetchError> {
    let params = parameters(btf, routine)?;
    let what = format!("fn:{routine}");
    plan_specs(btf, &what, routine, &params, specs, |index, spec| {
        argument_register(&what, index, spec).map(ArgSource::register)
    })
}

/// The ABI register of parameter `index` (0-based) of probe `what`, or
/// why there is none.
pub(crate) fn argument_register(
    what: &str,
    index: usize,
    spec: &FetchSpec,
) -> Result<usize, FetchError> {
    ARGUMENT_REGISTERS.get(index).copied().ok_or_else(|| {
        FetchError(format!(
            "{what}({}): parameter {} is passed on the stack (only the first six are in \
             registers)",
            spec.label,
            index + 1
        ))
    })
}

/// The index of the parameter `spec` names among `params` (`argN`, or by
/// name).
pub(crate) fn parameter_index(params: &[(String, Type)], spec: &FetchSpec) -> Option<usize> {
    numbered(&spec.parameter)
        .or_else(|| params.iter().position(|(name, _)| *name == spec.parameter))
}

/// Plans `specs` over `params` (of `owner`, a probe `what`), each
/// parameter `source_of` its index.
pub(crate) fn plan_specs(
    btf: &Btf,
    what: &str,
    owner: &str,
    params: &[(String, Type)],
    specs: &[FetchSpec],
    mut source_of: impl FnMut(usize, &FetchSpec) -> Result<ArgSource, FetchError>,
) -> Result<Vec<Fetch>, FetchError> {
    specs
        .iter()
        .map(|spec| {
            let found =
                parameter_index(params, spec).map(|i| (i, params.get(i).map(|p| p.1.clone())));
            let Some((index, ty)) = found else {
                let names: Vec<&str> = params.iter().map(|p| p.0.as_str()).collect();
                return fail(format!(
                    "{what}({}): {owner} has no parameter {} (it has: {})",
                    spec.label,
                    spec.parameter,
                    names.join(", ")
                ));
            };
            let source = source_of(index, spec)?;
            plan_one(btf, what, spec, source, ty)
        })
        .collect()
}

/// The routine's parameters: names and types, in order.
pub(crate) fn parameters(btf: &Btf, routine: &str) -> Result<Vec<(String, Type)>, FetchError> {
    let missing = || {
        FetchError(format!(
            "fn:{routine}: the kernel's BTF has no routine {routine}"
        ))
    };
    let func = btf
        .resolve_types_by_name(routine)
        .map_err(|_| missing())?
        .into_iter()
        .find_map(|t| match t {
            Type::Func(f) => Some(f),
            _ => None,
        })
        .ok_or_else(missing)?;
    let Ok(Type::FuncProto(proto)) = btf.resolve_chained_type(&func) else {
        return Err(missing());
    };
    proto
        .parameters
        .iter()
        .filter(|p| !p.is_variadic())
        .map(|p| {
            let name = btf.resolve_name(p).unwrap_or_default();
            let ty = btf
                .resolve_chained_type(p)
                .map_err(|e| FetchError(format!("fn:{routine}: parameter {name}: {e}")))?;
            Ok((name, ty))
        })
        .collect()
}

/// Strips typedefs and qualifiers (bounded: a crafted BTF may loop).
pub(crate) fn underlying(btf: &Btf, mut ty: Type) -> Type {
    for _ in 0..16 {
        let next = match &ty {
            Type::Typedef(t) => btf.resolve_chained_type(t as &dyn BtfType),
            Type::Volatile(t) | Type::Const(t) | Type::Restrict(t) => {
                btf.resolve_chained_type(t as &dyn BtfType)
            }
            Type::TypeTag(t) => btf.resolve_chained_type(t as &dyn BtfType),
            _ => return ty,
        };
        match next {
            Ok(n) => ty = n,
            Err(_) => return ty,
        }
    }
    ty
}

fn plan_one(
    btf: &Btf,
    probe: &str,
    spec: &FetchSpec,
    source: ArgSource,
    ty: Option<Type>,
) -> Result<Fetch, FetchError> {
    let where_ = |what: String| FetchError(format!("{probe}({}): {what}", spec.label));
    let mut ty = ty.map(|t| underlying(btf, t));
    let mut loads = Vec::new();
    let mut field = None;
    for (i, name) in spec.fields.iter().enumerate() {
        let Some(Type::Ptr(p)) = &ty else {
            return Err(where_(format!(
                "`->{name}` follows no pointer to a structure"
            )));
        };
        let target = btf
            .resolve_chained_type(p as &dyn BtfType)
            .map(|t| underlying(btf, t))
            .map_err(|e| where_(e.to_string()))?;
        let (Type::Struct(s) | Type::Union(s)) = &target else {
            return Err(where_(format!(
                "`->{name}` follows a pointer to no structure"
            )));
        };
        let (offset, member) = member(btf, s, name, 0)
            .ok_or_else(|| where_(format!("the structure has no field {name}")))?;
        // Every field but the last is the next pointer to follow.
        match i + 1 < spec.fields.len() {
            true => loads.push(offset),
            false => field = Some(offset),
        }
        ty = Some(underlying(btf, member));
    }
    let kind = match (spec.cast.as_deref(), &ty) {
        (Some("string"), Some(Type::Array(a))) => FetchKind::TextInPlace {
            max: a.len().min(MAX_TEXT),
        },
        (Some("string"), _) => FetchKind::TextAt,
        (Some(cast), _) => cast_kind(cast).unwrap_or(FetchKind::Pointer),
        (None, Some(t)) => natural_kind(btf, t).ok_or_else(|| {
            where_(
                "a value of no integer, pointer or text type: name a field, or give a type (:u64)"
                    .into(),
            )
        })?,
        (None, None) => FetchKind::Int {
            size: 8,
            signed: true,
        },
    };
    Ok(Fetch {
        label: spec.label.clone(),
        source,
        loads,
        field,
        kind,
    })
}

/// How a value of type `ty` shows by itself: integers and enums as
/// integers, pointers in hex, `char` arrays as text.
pub(crate) fn natural_kind(btf: &Btf, ty: &Type) -> Option<FetchKind> {
    let size = |n: usize| u8::try_from(n).ok().filter(|s| matches!(s, 1 | 2 | 4 | 8));
    match ty {
        Type::Int(i) => Some(FetchKind::Int {
            size: size(i.size())?,
            signed: i.is_signed(),
        }),
        Type::Enum(e) => Some(FetchKind::Int {
            size: size(e.size())?,
            signed: e.is_signed(),
        }),
        Type::Enum64(e) => Some(FetchKind::Int {
            size: size(e.size())?,
            signed: e.is_signed(),
        }),
        Type::Ptr(_) => Some(FetchKind::Pointer),
        Type::Array(a) => {
            let element = btf
                .resolve_chained_type(a as &dyn BtfType)
                .map(|t| underlying(btf, t))
                .ok()?;
            match element {
                Type::Int(i) if i.size() == 1 => Some(FetchKind::TextInPlace {
                    max: a.len().min(MAX_TEXT),
                }),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The byte offset of member `member_name` of structure `name`
/// (looking into anonymous members).
pub(crate) fn struct_member_offset(btf: &Btf, name: &str, member_name: &str) -> Option<u64> {
    btf.resolve_types_by_name(name)
        .ok()?
        .into_iter()
        .find_map(|t| match t {
            Type::Struct(s) => member(btf, &s, member_name, 0).map(|(o, _)| o),
            _ => None,
        })
}

/// Field `name` of `s`: its byte offset and type, looking into anonymous
/// structures and unions (`depth` bounds a crafted, cyclic BTF).
pub(crate) fn member(btf: &Btf, s: &btf_rs::Struct, name: &str, depth: u32) -> Option<(u64, Type)> {
    if depth > 8 {
        return None;
    }
    for m in &s.members {
        let at = u64::from(m.bit_offset() / 8);
        let own = btf.resolve_name(m).unwrap_or_default();
        let ty = btf.resolve_chained_type(m as &dyn BtfType).ok()?;
        if own == name {
            return (m.bitfield_size().unwrap_or(0) == 0).then_some((at, ty));
        }
        if !own.is_empty() {
            continue;
        }
        if let Type::Struct(inner) | Type::Union(inner) = underlying(btf, ty) {
            if let Some((off, t)) = member(btf, &inner, name, depth + 1) {
                return Some((at.checked_add(off)?, t));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_texts_parse_into_fetches() {
        let (routine, specs) =
            parse_probe("do_sys_openat2(dfd, filename:string, how -> flags, arg4:u32)").unwrap();
        assert_eq!(routine, "do_sys_openat2");
        assert_eq!(specs.len(), 4);
        assert_eq!(specs[1].cast.as_deref(), Some("string"));
        assert_eq!(specs[2].parameter, "how");
        assert_eq!(specs[2].fields, ["flags"]);
        assert_eq!(specs[2].label, "how->flags");
        assert_eq!(parse_probe("schedule").unwrap(), ("schedule", vec![]));
        assert_eq!(parse_probe("schedule()").unwrap(), ("schedule", vec![]));
        for bad in [
            "f(a",
            "f(a:float)",
            "f(1a)",
            "f(a->)",
            "f(a b)",
            "f(a->b->c->d->e->f)",
            "f(,,,)",
            "f(a,,b)",
            "f(a,)",
            "f(a,b,c,d,e,f,g,h,i)",
        ] {
            assert!(parse_probe(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn without_btf_only_numbered_arguments_plan() {
        let (_, specs) = parse_probe("kprintf(arg1:string, arg2:u32, arg3)").unwrap();
        let plan = plan_untyped("kprintf", &specs).unwrap();
        assert_eq!(plan[0].source, ArgSource::register(7), "rdi");
        assert_eq!(plan[0].kind, FetchKind::TextAt);
        assert_eq!(
            plan[1].kind,
            FetchKind::Int {
                size: 4,
                signed: false
            }
        );
        assert_eq!(plan[2].source, ArgSource::register(2), "rdx");
        let (_, named) = parse_probe("kprintf(fmt:string)").unwrap();
        let e = plan_untyped("kprintf", &named).unwrap_err();
        assert!(e.0.contains("no BTF"), "{e}");
    }
}
