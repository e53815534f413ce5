//! How analyses name things for people: routines, interrupt vectors,
//! shares.

use vtrace_image::symbols::{FuncId, Symbolizer, UNKNOWN_FUNC};

/// Name of a routine for people: its symbol, or the address it was
/// entered at.
pub fn routine_name(symbols: &Symbolizer, func: FuncId, entry_pc: u64) -> String {
    if func == UNKNOWN_FUNC {
        format!("{entry_pc:#x}")
    } else {
        symbols.name(func).to_string()
    }
}

/// Short name of an interrupt vector.
pub fn vector_name(vector: u8) -> String {
    const EXC: [&str; 22] = [
        "#DE", "#DB", "NMI", "#BP", "#OF", "#BR", "#UD", "#NM", "#DF", "#MF", "#TS", "#NP", "#SS",
        "#GP", "#PF", "#15", "#MF", "#AC", "#MC", "#XM", "#VE", "#CP",
    ];
    match vector {
        v if usize::from(v) < EXC.len() => EXC[usize::from(v)].to_string(),
        32 => "irq 0 (timer)".into(),
        v if (33..48).contains(&v) => format!("irq {}", v - 32),
        v => format!("vector {v}"),
    }
}

/// `part` as a percentage of `total` (0 when there is no total).
pub fn percent(part: u64, total: u64) -> f64 {
    100.0 * part as f64 / total.max(1) as f64
}

/// A routine's name for tables: its symbol, or `[unknown code]`.
pub fn routine_label(symbols: &Symbolizer, f: FuncId) -> String {
    if f == UNKNOWN_FUNC {
        "[unknown code]".to_string()
    } else {
        symbols.name(f).to_string()
    }
}

/// How flame graphs name an address space at the root of its stacks.
pub fn space_root(cr3: u64) -> String {
    format!("{SPACE_ROOT}{:#x}", vtrace_image::symbols::cr3_root(cr3))
}

/// The start of [`space_root`]'s names.
pub const SPACE_ROOT: &str = "cr3=";

/// The device at an I/O port, as the PC (and vtrace's machine) places
/// them: what a listing's port access is to.
pub fn port_name(port: u16) -> Option<&'static str> {
    Some(match port {
        0x20 | 0x21 => "PIC master",
        0xa0 | 0xa1 => "PIC slave",
        0x40..=0x43 => "PIT",
        0x60 | 0x64 => "i8042",
        0x61 => "PC speaker/PIT gate",
        0x70 | 0x71 => "CMOS/RTC",
        0x80 => "POST delay",
        0x3f8..=0x3ff => "COM1",
        0x2f8..=0x2ff => "COM2",
        0x3e8..=0x3ef => "COM3",
        0x2e8..=0x2ef => "COM4",
        0xcf8..=0xcff => "PCI config",
        0x600..=0x603 => "ACPI PM1a event",
        0x604 | 0x605 => "ACPI PM1a control",
        vtrace_guest::PORT => "vtrace hypercall",
        _ => return None,
    })
}

/// A hypercall command's name (`TRACE_START`), or its number in hex.
pub fn hypercall_name(command: u32) -> String {
    vtrace_guest::cmd::name(command).map_or_else(|| format!("{command:#x}"), str::to_string)
}
