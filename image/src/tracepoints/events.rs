//! What the kernel's event metadata says of a tracepoint: its system
//! (`sched` of `sched:sched_switch`) and the fields of its event record
//! (the `format` file of tracefs), read from the image's static data. A
//! `TRACE_EVENT` defines `event_NAME` (a `struct trace_event_call`) whose
//! `tp` points at `__tracepoint_NAME` and whose class names the system
//! and lists the fields (`fields_array`: type and name strings, ended by
//! an empty entry). Layouts come from the kernel's BTF.

use btf_rs::{Btf, Type};

use super::image::ImageMemory;
use crate::probe_fetch::struct_member_offset;

/// Fields an event lists, at most (a crafted image must not run on).
const MAX_FIELDS: usize = 64;

/// `fields_array`'s marker of fields a routine defines (syscall events):
/// `TRACE_FUNCTION_TYPE`, `(const char *)~0UL`.
const FIELDS_BY_FUNCTION: u64 = u64::MAX;

/// One field of an event's record, as tracefs's `format` names it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct EventField {
    /// `prev_comm`.
    pub name: String,
    /// `char[16]`.
    #[serde(rename = "type")]
    pub type_name: String,
}

/// An event's system and fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct EventInfo {
    pub system: Option<String>,
    pub fields: Vec<EventField>,
}

/// Where the kernel keeps what [`event_info`] reads, from its BTF.
pub(super) struct EventLayout {
    call_class: u64,
    call_tp: u64,
    class_system: u64,
    class_fields: u64,
    field_size: u64,
    field_type: u64,
    field_name: u64,
}

impl EventLayout {
    /// The layout, if the BTF describes every member it needs.
    pub fn from_btf(btf: &Btf) -> Option<EventLayout> {
        let at = |s: &str, m: &str| struct_member_offset(btf, s, m);
        let field_size = btf
            .resolve_types_by_name("trace_event_fields")
            .ok()?
            .into_iter()
            .find_map(|t| match t {
                Type::Struct(s) => u64::try_from(s.size()).ok(),
                _ => None,
            })?;
        Some(EventLayout {
            call_class: at("trace_event_call", "class")?,
            call_tp: at("trace_event_call", "tp")?,
            class_system: at("trace_event_class", "system")?,
            class_fields: at("trace_event_class", "fields_array")?,
            field_size,
            field_type: at("trace_event_fields", "type")?,
            field_name: at("trace_event_fields", "name")?,
        })
    }
}

/// What `event_NAME` at `event` says, if it is the event of the
/// tracepoint at `tracepoint`.
pub(super) fn event_info(
    image: &ImageMemory<'_>,
    layout: &EventLayout,
    event: u64,
    tracepoint: u64,
) -> Option<EventInfo> {
    let word = |addr: u64, offset: u64| image.u64_at(addr.checked_add(offset)?);
    if word(event, layout.call_tp)? != tracepoint {
        return None;
    }
    let class = word(event, layout.call_class)?;
    let system = word(class, layout.class_system).and_then(|p| image.c_string(p));
    let mut fields = Vec::new();
    if let Some(array) = word(class, layout.class_fields).filter(|a| *a != 0) {
        for i in 0..MAX_FIELDS as u64 {
            let entry = array.checked_add(i.checked_mul(layout.field_size)?)?;
            let type_ptr = word(entry, layout.field_type)?;
            if type_ptr == 0 || type_ptr == FIELDS_BY_FUNCTION {
                break;
            }
            let (Some(type_name), Some(name)) = (
                image.c_string(type_ptr),
                word(entry, layout.field_name).and_then(|p| image.c_string(p)),
            ) else {
                break;
            };
            fields.push(EventField { name, type_name });
        }
    }
    Some(EventInfo { system, fields })
}
