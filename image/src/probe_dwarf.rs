//! Typed `fn:` probe arguments from DWARF (`.debug_info`), for images
//! built with `-g` and no BTF: the demo OS, a custom kernel, a user
//! program. The same plans as [`crate::probe_fetch`] makes from BTF: each
//! parameter's register by its position (System V's first six), each
//! `->field`'s offset through pointers to structures (anonymous members
//! looked into, bitfields refused), and how to show the value.

use addr2line::gimli;
use gimli::{AttributeValue, DwTag, Reader as _, Unit, UnitOffset};
use object::Object;

use crate::probe_fetch::{
    argument_register, numbered, ArgSource, Fetch, FetchError, FetchKind, FetchSpec, MAX_TEXT,
};
use crate::symbols::load_dwarf;

use crate::symbols::DwarfReader as Reader;

/// Typedefs and qualifiers followed, and anonymous members looked into,
/// at most (a crafted image may loop).
const MAX_CHAIN: usize = 16;

/// Entries a search reads, at most (a crafted image may hold millions).
const MAX_ENTRIES: usize = 4_000_000;

fn fail<T>(text: String) -> Result<T, FetchError> {
    Err(FetchError(text))
}

/// The DWARF of an ELF image, loaded once.
pub struct DwarfTypes {
    dwarf: gimli::Dwarf<Reader>,
}

impl std::fmt::Debug for DwarfTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DwarfTypes")
    }
}

impl DwarfTypes {
    /// The image's DWARF, if it has `.debug_info`.
    pub fn from_elf(bytes: &[u8]) -> Option<DwarfTypes> {
        let file = object::File::parse(bytes).ok()?;
        file.section_by_name(".debug_info")?;
        let dwarf = load_dwarf(&file).ok()?;
        Some(DwarfTypes { dwarf })
    }

    /// Plans `specs` for `routine`; an error names what is missing.
    pub fn plan(&self, routine: &str, specs: &[FetchSpec]) -> Result<Vec<Fetch>, FetchError> {
        let Some((unit, params)) = self.parameters(routine) else {
            return fail(format!(
                "fn:{routine}: the image's DWARF describes no routine {routine}"
            ));
        };
        let t = Types {
            dwarf: &self.dwarf,
            unit: &unit,
        };
        specs
            .iter()
            .map(|spec| {
                let index = numbered(&spec.parameter)
                    .or_else(|| params.iter().position(|(n, _)| *n == spec.parameter));
                let Some(index) = index else {
                    let names: Vec<&str> = params.iter().map(|p| p.0.as_str()).collect();
                    return fail(format!(
                        "fn:{routine}({}): {routine} has no parameter {} (it has: {})",
                        spec.label,
                        spec.parameter,
                        names.join(", ")
                    ));
                };
                let register = argument_register(&format!("fn:{routine}"), index, spec)?;
                let ty = params.get(index).and_then(|p| p.1);
                t.plan_one(routine, spec, register, ty)
            })
            .collect()
    }

    /// The unit of `routine`'s description and its parameters (name,
    /// type), from a definition where there is one.
    #[allow(clippy::type_complexity)]
    fn parameters(
        &self,
        routine: &str,
    ) -> Option<(Unit<Reader>, Vec<(String, Option<UnitOffset>)>)> {
        let mut units = self.dwarf.units();
        let mut read = 0usize;
        let mut declared = None;
        while let Ok(Some(header)) = units.next() {
            let unit = self.dwarf.unit(header).ok()?;
            let mut entries = unit.entries();
            let mut found = None;
            while let Ok(Some((_, entry))) = entries.next_dfs() {
                read += 1;
                if read > MAX_ENTRIES {
                    return None;
                }
                if entry.tag() != gimli::DW_TAG_subprogram {
                    continue;
                }
                let t = Types {
                    dwarf: &self.dwarf,
                    unit: &unit,
                };
                if t.name(entry.offset()).as_deref() != Some(routine) {
                    continue;
                }
                let declaration = matches!(
                    entry.attr_value(gimli::DW_AT_declaration),
                    Ok(Some(AttributeValue::Flag(true)))
                );
                found = Some((entry.offset(), declaration));
                if !declaration {
                    break;
                }
            }
            if let Some((offset, declaration)) = found {
                let params = Types {
                    dwarf: &self.dwarf,
                    unit: &unit,
                }
                .formal_parameters(offset);
                if !declaration {
                    return Some((unit, params));
                }
                declared.get_or_insert((unit, params));
            }
        }
        declared
    }
}

/// Reads the types of one unit.
struct Types<'a> {
    dwarf: &'a gimli::Dwarf<Reader>,
    unit: &'a Unit<Reader>,
}

impl Types<'_> {
    fn tag(&self, at: UnitOffset) -> Option<DwTag> {
        Some(self.unit.entry(at).ok()?.tag())
    }

    /// An entry's `DW_AT_name`, or its abstract origin's.
    fn name(&self, at: UnitOffset) -> Option<String> {
        let entry = self.unit.entry(at).ok()?;
        match entry.attr_value(gimli::DW_AT_name).ok()? {
            Some(v) => {
                let s = self.dwarf.attr_string(self.unit, v).ok()?;
                Some(s.to_string_lossy().ok()?.into_owned())
            }
            None => match entry.attr_value(gimli::DW_AT_abstract_origin).ok()? {
                Some(AttributeValue::UnitRef(origin)) if origin != at => {
                    let origin_entry = self.unit.entry(origin).ok()?;
                    let v = origin_entry.attr_value(gimli::DW_AT_name).ok()??;
                    let s = self.dwarf.attr_string(self.unit, v).ok()?;
                    Some(s.to_string_lossy().ok()?.into_owned())
                }
                _ => None,
            },
        }
    }

    /// An entry's `DW_AT_type` (or its abstract origin's), within the unit.
    fn type_of(&self, at: UnitOffset) -> Option<UnitOffset> {
        let entry = self.unit.entry(at).ok()?;
        match entry.attr_value(gimli::DW_AT_type).ok()? {
            Some(AttributeValue::UnitRef(t)) => Some(t),
            _ => match entry.attr_value(gimli::DW_AT_abstract_origin).ok()? {
                Some(AttributeValue::UnitRef(origin)) if origin != at => self.type_of(origin),
                _ => None,
            },
        }
    }

    fn udata(&self, at: UnitOffset, attr: gimli::DwAt) -> Option<u64> {
        let entry = self.unit.entry(at).ok()?;
        entry.attr_value(attr).ok()??.udata_value()
    }

    /// The subprogram's parameters: name and type.
    fn formal_parameters(&self, at: UnitOffset) -> Vec<(String, Option<UnitOffset>)> {
        let mut params = Vec::new();
        let Ok(mut tree) = self.unit.entries_tree(Some(at)) else {
            return params;
        };
        let Ok(root) = tree.root() else {
            return params;
        };
        let mut children = root.children();
        while let Ok(Some(child)) = children.next() {
            let entry = child.entry();
            if entry.tag() == gimli::DW_TAG_formal_parameter {
                let offset = entry.offset();
                params.push((self.name(offset).unwrap_or_default(), self.type_of(offset)));
            }
        }
        params
    }

    /// Through typedefs and qualifiers to the type itself (none: void).
    fn underlying(&self, mut at: Option<UnitOffset>) -> Option<UnitOffset> {
        for _ in 0..MAX_CHAIN {
            let here = at?;
            match self.tag(here)? {
                gimli::DW_TAG_typedef
                | gimli::DW_TAG_const_type
                | gimli::DW_TAG_volatile_type
                | gimli::DW_TAG_restrict_type
                | gimli::DW_TAG_atomic_type => at = self.type_of(here),
                _ => return Some(here),
            }
        }
        None
    }

    /// Member `name` of the structure or union at `at`: its offset and
    /// type, looking into anonymous members.
    fn member(
        &self,
        at: UnitOffset,
        name: &str,
        depth: usize,
    ) -> Option<(u64, Option<UnitOffset>, bool)> {
        if depth > MAX_CHAIN {
            return None;
        }
        let mut tree = self.unit.entries_tree(Some(at)).ok()?;
        let root = tree.root().ok()?;
        let mut children = root.children();
        while let Ok(Some(child)) = children.next() {
            let entry = child.entry();
            if entry.tag() != gimli::DW_TAG_member {
                continue;
            }
            let offset = entry.offset();
            let location = self
                .udata(offset, gimli::DW_AT_data_member_location)
                .unwrap_or(0);
            let bitfield = self.udata(offset, gimli::DW_AT_bit_size).is_some();
            match self.name(offset) {
                Some(own) if own == name => {
                    return Some((location, self.type_of(offset), bitfield))
                }
                Some(_) => {}
                None => {
                    let inner = self.underlying(self.type_of(offset))?;
                    if matches!(
                        self.tag(inner),
                        Some(gimli::DW_TAG_structure_type | gimli::DW_TAG_union_type)
                    ) {
                        if let Some((o, t, b)) = self.member(inner, name, depth + 1) {
                            return Some((location.checked_add(o)?, t, b));
                        }
                    }
                }
            }
        }
        None
    }

    /// How a value of the type at `at` shows by itself.
    fn natural_kind(&self, at: Option<UnitOffset>) -> Option<FetchKind> {
        let at = self.underlying(at)?;
        let size = |n: u64| u8::try_from(n).ok().filter(|s| matches!(s, 1 | 2 | 4 | 8));
        match self.tag(at)? {
            gimli::DW_TAG_base_type => {
                let entry = self.unit.entry(at).ok()?;
                let signed = matches!(
                    entry.attr_value(gimli::DW_AT_encoding).ok()?,
                    Some(AttributeValue::Encoding(
                        gimli::DW_ATE_signed | gimli::DW_ATE_signed_char
                    ))
                );
                Some(FetchKind::Int {
                    size: size(self.udata(at, gimli::DW_AT_byte_size)?)?,
                    signed,
                })
            }
            gimli::DW_TAG_enumeration_type => Some(FetchKind::Int {
                size: size(self.udata(at, gimli::DW_AT_byte_size)?)?,
                signed: true,
            }),
            gimli::DW_TAG_pointer_type => Some(FetchKind::Pointer),
            gimli::DW_TAG_array_type => {
                let element = self.underlying(self.type_of(at))?;
                (self.tag(element)? == gimli::DW_TAG_base_type
                    && self.udata(element, gimli::DW_AT_byte_size)? == 1)
                    .then(|| FetchKind::TextInPlace {
                        max: self.array_length(at).unwrap_or(MAX_TEXT).min(MAX_TEXT),
                    })
            }
            _ => None,
        }
    }

    /// An array's length, from its subrange.
    fn array_length(&self, at: UnitOffset) -> Option<usize> {
        let mut tree = self.unit.entries_tree(Some(at)).ok()?;
        let root = tree.root().ok()?;
        let mut children = root.children();
        while let Ok(Some(child)) = children.next() {
            let offset = child.entry().offset();
            if child.entry().tag() == gimli::DW_TAG_subrange_type {
                let n = match self.udata(offset, gimli::DW_AT_count) {
                    Some(count) => count,
                    None => self
                        .udata(offset, gimli::DW_AT_upper_bound)?
                        .checked_add(1)?,
                };
                return usize::try_from(n).ok();
            }
        }
        None
    }

    fn plan_one(
        &self,
        routine: &str,
        spec: &FetchSpec,
        register: usize,
        mut ty: Option<UnitOffset>,
    ) -> Result<Fetch, FetchError> {
        let where_ = |what: String| FetchError(format!("fn:{routine}({}): {what}", spec.label));
        let mut loads = Vec::new();
        let mut field = None;
        for (i, name) in spec.fields.iter().enumerate() {
            let pointer = self.underlying(ty);
            let target = match pointer.and_then(|p| self.tag(p)) {
                Some(gimli::DW_TAG_pointer_type) => {
                    self.underlying(pointer.and_then(|p| self.type_of(p)))
                }
                _ => None,
            };
            let Some(target) = target.filter(|t| {
                matches!(
                    self.tag(*t),
                    Some(gimli::DW_TAG_structure_type | gimli::DW_TAG_union_type)
                )
            }) else {
                return Err(where_(format!(
                    "`->{name}` follows no pointer to a structure"
                )));
            };
            let (offset, member, bitfield) = self
                .member(target, name, 0)
                .ok_or_else(|| where_(format!("the structure has no field {name}")))?;
            if bitfield {
                return Err(where_(format!("{name} is a bitfield")));
            }
            match i + 1 < spec.fields.len() {
                true => loads.push(offset),
                false => field = Some(offset),
            }
            ty = member;
        }
        let is_array = self
            .underlying(ty)
            .and_then(|t| self.tag(t))
            .is_some_and(|t| t == gimli::DW_TAG_array_type);
        let kind = match spec.cast.as_deref() {
            Some("string") if is_array => self
                .natural_kind(ty)
                .filter(|k| matches!(k, FetchKind::TextInPlace { .. }))
                .unwrap_or(FetchKind::TextInPlace { max: MAX_TEXT }),
            Some("string") => FetchKind::TextAt,
            Some(cast) => crate::probe_fetch::cast_kind(cast).unwrap_or(FetchKind::Pointer),
            None => self.natural_kind(ty).ok_or_else(|| {
                where_(
                    "a value of no integer, pointer or text type: name a field, or give a type \
                     (:u64)"
                        .into(),
                )
            })?,
        };
        Ok(Fetch {
            label: spec.label.clone(),
            source: ArgSource::register(register),
            loads,
            field,
            kind,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe_fetch::parse_probe;

    fn plan(text: &str) -> Result<Vec<Fetch>, FetchError> {
        let dwarf = DwarfTypes::from_elf(vtrace_demo::DEMO_OS_ELF).expect("the demo has DWARF");
        let (routine, specs) = parse_probe(text).unwrap();
        dwarf.plan(routine, &specs)
    }

    /// kernel.h: `struct frame { u64 r15, r14, r13, r12, r11, r10, r9, r8;
    /// u64 rbp, rdi, rsi, rdx, rcx, rbx, rax; u64 vector, error; u64 rip,
    /// ... }`: `vector` is the 16th u64, `rip` the 18th.
    #[test]
    fn the_demo_s_parameters_and_fields_plan_from_its_dwarf() {
        let p = plan("schedule(f->vector, f->rip, f)").unwrap();
        assert_eq!(p[0].source, ArgSource::register(7), "rdi");
        assert_eq!(p[0].field, Some(15 * 8));
        assert_eq!(
            p[0].kind,
            FetchKind::Int {
                size: 8,
                signed: false
            }
        );
        assert_eq!(p[1].field, Some(17 * 8));
        assert_eq!((p[2].field, p[2].kind), (None, FetchKind::Pointer));
        // task_create(const char *name, void (*entry)(void))
        let p = plan("task_create(name:string, entry)").unwrap();
        assert_eq!(p[0].kind, FetchKind::TextAt);
        assert_eq!(p[1].source, ArgSource::register(6), "rsi");
        assert_eq!(p[1].kind, FetchKind::Pointer);
        for (bad, says) in [
            ("schedule(f->nothing)", "no field nothing"),
            ("schedule(frame)", "has no parameter frame (it has: f)"),
            ("schedule(f->rip->x)", "follows no pointer to a structure"),
            ("no_such_routine(a)", "describes no routine no_such_routine"),
        ] {
            let e = plan(bad).unwrap_err();
            assert!(e.0.contains(says), "{bad}: {e}");
        }
    }
}
