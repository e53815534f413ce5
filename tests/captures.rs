//! `vtrace run --capture` on the demo OS under this host's KVM: memory
//! copied at a place, from the address a register holds, checked against
//! the trace's own steps and the demo's ELF.

mod common;

use std::path::Path;

use common::*;
use object::{Object, ObjectSection};
use vtrace_storage::{Event, Record};

/// `length` bytes of the demo's image at `addr` (the OS loads at its link
/// addresses), or fewer where the section ends.
fn demo_bytes(addr: u64, length: usize) -> Vec<u8> {
    let elf = object::File::parse(vtrace_demo::DEMO_OS_ELF).unwrap();
    let section = elf
        .sections()
        .find(|s| (s.address()..s.address() + s.size()).contains(&addr))
        .unwrap_or_else(|| panic!("no section of the demo holds {addr:#x}"));
    let data = section.data().unwrap();
    let at = (addr - section.address()) as usize;
    data[at..(at + length).min(data.len())].to_vec()
}

/// The format strings the demo's C source hands to kprintf, as the bytes
/// the compiler makes of them (the source uses `\n` and `\"` only).
fn kprintf_formats() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("guest-kit/demo/os");
    let mut formats = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "c") {
            let source = std::fs::read_to_string(&path).unwrap();
            for call in source.split("kprintf(\"").skip(1) {
                // The literal ends at the first quote not escaped.
                let end = (0..call.len())
                    .find(|&i| {
                        call.as_bytes()[i] == b'"' && (i == 0 || call.as_bytes()[i - 1] != b'\\')
                    })
                    .unwrap();
                let format = call[..end].replace("\\n", "\n").replace("\\\"", "\"");
                formats.push(format.into_bytes());
            }
        }
    }
    formats
}

/// (name, address, length, bytes) of each capture, with the index of the
/// record after it.
fn captures_in(records: &[Record]) -> Vec<(usize, String, u64, u32, Vec<u8>)> {
    records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r {
            Record::Event(Event::Capture {
                name,
                addr,
                length,
                bytes,
            }) => Some((i + 1, name.clone(), *addr, *length, bytes.clone())),
            _ => None,
        })
        .collect()
}

/// Runs the demo OS with `captures` onto `disk`, traced from its start or
/// not; it must succeed.
fn run_demo(disk: &Path, traced: bool, captures: &[&str]) -> std::process::Output {
    let size = if traced { "64M" } else { "8M" };
    let mut args = vec!["run", "--no-input", "--disk-size", size];
    args.extend(["--disk", disk.to_str().unwrap()]);
    if traced {
        args.push("--trace");
    }
    for c in captures {
        args.extend(["--capture", c]);
    }
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    out
}

fn analyze_captures(disk: &Path) -> Vec<serde_json::Value> {
    let out = run(&["analyze", "captures", "--json", disk.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["problems"], serde_json::json!([]), "{json}");
    json["captures"].as_array().unwrap().clone()
}

/// While tracing, `--capture kprintf:rdi:64` is taken before every step at
/// kprintf's first instruction, with the address the call left in RDI, and
/// its bytes are the demo's format string there; a capture whose register
/// points at memory not present (the address `page_fault` is handed) is
/// skipped, and the trace says how much was asked.
#[test]
fn captures_while_tracing_copy_what_the_register_points_at() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("c.vtd");
    let out = run_demo(&disk, true, &["kprintf:rdi:64", "page_fault:rdi:16:fault"]);
    let console = stdout(&out);
    let page_faults = number_after(&console, "page faults:").expect("page-fault count");
    let records = records(&disk);
    let captures = captures_in(&records);

    let kprintf = demo_symbol("kprintf");
    let steps_at_kprintf = records
        .iter()
        .filter(|r| matches!(r, Record::Step(s) if s.pc == kprintf))
        .count();
    let formats = kprintf_formats();
    let mut texts = Vec::new();
    for (next, name, addr, length, bytes) in captures.iter().filter(|c| c.1 == "kprintf") {
        assert_eq!((name.as_str(), *length), ("kprintf", 64));
        // Taken right before the step at kprintf, with the RDI the steps
        // before it left.
        let Record::Step(at) = &records[*next] else {
            panic!("a step follows a capture")
        };
        assert_eq!(at.pc, kprintf);
        let before = records[..*next - 1]
            .iter()
            .rev()
            .find_map(|r| match r {
                Record::Step(s) => Some(s),
                _ => None,
            })
            .unwrap();
        assert_eq!(before.regs.gpr[7], *addr, "RDI before the call's target");
        assert_eq!(
            *bytes,
            demo_bytes(*addr, 64),
            "the demo's bytes at {addr:#x}"
        );
        let text = &bytes[..bytes.iter().position(|&b| b == 0).unwrap()];
        assert!(
            formats.iter().any(|f| f == text),
            "{:?} is no kprintf format of the source",
            String::from_utf8_lossy(text)
        );
        texts.push(String::from_utf8_lossy(text).to_string());
    }
    assert_eq!(texts.len(), steps_at_kprintf, "one capture per call");
    assert!(
        texts.contains(&"timer ticks: %lu, context switches: %lu\n".to_string()),
        "{texts:?}"
    );

    // page_fault(addr, error) gets the address that was not present.
    let faults: Vec<_> = captures.iter().filter(|c| c.1 == "fault").collect();
    assert_eq!(
        faults.len() as u64,
        page_faults,
        "one per fault the demo counted"
    );
    assert!(
        faults.iter().all(|c| c.3 == 16 && c.4.is_empty()),
        "{faults:?}"
    );
    assert!(
        stderr(&out).contains(&format!(
            "captures: kprintf {}, fault {page_faults} ({page_faults} with bytes not present)",
            texts.len()
        )),
        "{}",
        stderr(&out)
    );

    // The analyzer: JSON keys as documented, and the text table.
    let json = analyze_captures(&disk);
    assert_eq!(json.len(), captures.len());
    let ticks = json
        .iter()
        // The text once escaped, by JSON: a real newline.
        .find(|c| c["text"] == "timer ticks: %lu, context switches: %lu\n")
        .expect("the timer ticks line");
    assert_eq!(ticks["name"], "kprintf");
    assert_eq!(ticks["traced"], true);
    assert_eq!(ticks["hex"].as_str().unwrap().len(), 128);
    assert!(ticks["address"].as_str().unwrap().starts_with("0x"));
    assert!(ticks["step"].as_u64().is_some());
    let text = run(&["analyze", "captures", disk.to_str().unwrap()]);
    let text = stdout(&text);
    assert!(text.contains("(not present, skipped)"), "{text}");
    assert!(text.contains("\"timer ticks: %lu"), "{text}");

    // The listing and the nest diagram show them where they were taken.
    let listing = run(&["analyze", "listing", "--no-lines", disk.to_str().unwrap()]);
    let listing = stdout(&listing);
    assert_eq!(
        listing.matches("-- capture kprintf at 0x").count(),
        texts.len()
    );
    assert_eq!(
        listing.matches("-- capture fault at 0x").count() as u64,
        page_faults
    );
    let nest = stdout(&run(&["analyze", "nest", disk.to_str().unwrap()]));
    let noted: Vec<&str> = nest
        .lines()
        .filter(|l| l.contains("/* capture kprintf at"))
        .collect();
    assert_eq!(noted.len(), texts.len());
}

/// With tracing off, captures are taken at breakpoints (this host's
/// breakpoints reach vtrace), each once, the vCPU stepping over the place:
/// the same strings, as many as when every step is looked at.
#[test]
fn captures_without_tracing_are_taken_at_breakpoints() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("c.vtd");
    run_demo(&disk, false, &["kprintf:rdi:64"]);
    let json = analyze_captures(&disk);
    let texts: Vec<&str> = json.iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert!(
        texts.contains(&"timer ticks: %lu, context switches: %lu\n"),
        "{texts:?}"
    );
    // The demo traces a stretch of itself by hypercall: those captures
    // were taken at breakpoints all the same, between the stretch's steps.
    assert!(json.iter().all(|c| c["traced"] == false), "{json:?}");
    let formats = kprintf_formats();
    for c in &json {
        let hex = c["hex"].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let text = &bytes[..bytes.iter().position(|&b| b == 0).unwrap()];
        assert!(formats.iter().any(|f| f == text), "{c}");
    }
    // As many as when every step is looked at.
    let traced = dir.path().join("t.vtd");
    run_demo(&traced, true, &["kprintf:rdi:64"]);
    assert_eq!(analyze_captures(&traced).len(), json.len());
}

/// Bad captures are refused before anything runs, saying what is wrong.
#[test]
fn bad_captures_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("c.vtd");
    for (capture, says) in [
        ("kprintf:rdi", "WHERE:REGISTER:LENGTH"),
        ("kprintf:rdi:5000", "1 to 4096 bytes"),
        ("no_such_routine:rdi:8", "no routine of that name"),
    ] {
        let out = run(&[
            "run",
            "--no-input",
            "--disk",
            disk.to_str().unwrap(),
            "--capture",
            capture,
        ]);
        assert_eq!(out.status.code(), Some(2), "{capture}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{capture}: {}", stderr(&out));
        assert!(!disk.exists(), "{capture}: no disk made");
    }
    let many: Vec<String> = (0..31)
        .map(|i| format!("--capture=kprintf:rdi:{}", i + 1))
        .collect();
    let mut args = vec!["run", "--no-input", "--disk", disk.to_str().unwrap()];
    args.extend(many.iter().map(String::as_str));
    let out = run(&args);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("at most 30"), "{}", stderr(&out));
}
