//! The C header and the Rust ABI crate must define the same hypercall ABI.

use std::collections::HashMap;

fn header_defines() -> HashMap<String, i64> {
    let text = include_str!("../guest-kit/include/vtrace.h");
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("#define "))
        .filter_map(|rest| {
            let mut parts = rest.split_whitespace();
            let name = parts.next()?.to_string();
            let value = parts.next()?.trim_matches(|c| c == '(' || c == ')');
            let number = match value.strip_prefix("0x") {
                Some(hex) => i64::from_str_radix(hex, 16).ok()?,
                None => value.parse().ok()?,
            };
            Some((name, number))
        })
        .collect()
}

#[test]
fn c_header_matches_the_rust_abi() {
    use vtrace_guest::{cmd, status};
    let h = header_defines();
    let expect: &[(&str, i64)] = &[
        ("VTRACE_PORT", i64::from(vtrace_guest::PORT)),
        ("VTRACE_ABI_VERSION", i64::from(vtrace_guest::ABI_VERSION)),
        (
            "VTRACE_VERSION_MAGIC",
            i64::from(vtrace_guest::VERSION_MAGIC),
        ),
        ("VTRACE_LOG_MAX_LEN", i64::from(vtrace_guest::LOG_MAX_LEN)),
        ("VTRACE_CMD_VERSION", i64::from(cmd::VERSION)),
        ("VTRACE_CMD_EXIT", i64::from(cmd::EXIT)),
        ("VTRACE_CMD_LOG", i64::from(cmd::LOG)),
        ("VTRACE_CMD_MARK", i64::from(cmd::MARK)),
        ("VTRACE_CMD_TRACE_START", i64::from(cmd::TRACE_START)),
        ("VTRACE_CMD_TRACE_STOP", i64::from(cmd::TRACE_STOP)),
        ("VTRACE_CMD_TRACE_REGION", i64::from(cmd::TRACE_REGION)),
        ("VTRACE_CMD_PROBE", i64::from(cmd::PROBE)),
        ("VTRACE_OK", i64::from(status::OK)),
        ("VTRACE_UNKNOWN_COMMAND", i64::from(status::UNKNOWN_COMMAND)),
        ("VTRACE_BAD_ADDRESS", i64::from(status::BAD_ADDRESS)),
        ("VTRACE_BAD_LENGTH", i64::from(status::BAD_LENGTH)),
        ("VTRACE_UNAVAILABLE", i64::from(status::UNAVAILABLE)),
    ];
    for (name, value) in expect {
        assert_eq!(h.get(*name), Some(value), "{name} in vtrace.h");
    }
    let numeric = h
        .keys()
        .filter(|k| k.starts_with("VTRACE_") && k.as_str() != "VTRACE_H")
        .count();
    assert_eq!(
        numeric,
        expect.len(),
        "vtrace.h defines a constant the Rust crate lacks: {h:?}"
    );
}
