//! The values of memory accesses in the export and the listing, derived
//! from the recorded registers or recorded by `run --record-values`,
//! checked against the memory itself: the demo OS traced with captures of
//! the stack and of its counters at routines it calls often, each
//! capture's bytes compared with the values the export says the steps
//! before it stored there.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use common::*;
use serde_json::Value;

/// One access of a row: address, size, value.
type Access = (u64, u64, Option<u64>);

/// A row of the export: its step, mnemonic, whether an interrupt came
/// before it, and its reads and writes (`None` where not known).
struct Row {
    step: u64,
    cr3: u64,
    mnemonic: String,
    interrupted: bool,
    reads: Option<Vec<Access>>,
    writes: Option<Vec<Access>>,
}

fn accesses(row: &Value, kind: &str) -> Option<Vec<Access>> {
    let addresses = row[format!("{kind}s")].as_array()?;
    let sizes = row[format!("{kind}_sizes")].as_array().unwrap();
    let values = row[format!("{kind}_values")].as_array().unwrap();
    assert_eq!(addresses.len(), sizes.len(), "{row}");
    assert_eq!(addresses.len(), values.len(), "{row}");
    Some(
        addresses
            .iter()
            .zip(sizes)
            .zip(values)
            .map(|((a, s), v)| (a.as_u64().unwrap(), s.as_u64().unwrap(), v.as_u64()))
            .collect(),
    )
}

fn export_rows(disk: &Path) -> Vec<Row> {
    let out = run(&["analyze", "export", disk.to_str().unwrap(), "-o", "-"]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| {
            let row: Value = serde_json::from_str(l).unwrap();
            Row {
                step: row["step"].as_u64().unwrap(),
                cr3: row["cr3"].as_u64().unwrap(),
                mnemonic: row["mnemonic"].as_str().unwrap().to_string(),
                interrupted: row.get("interrupt").is_some(),
                reads: accesses(&row, "read"),
                writes: accesses(&row, "write"),
            }
        })
        .collect()
}

/// (step, address, bytes) of every capture on `disk`.
fn captures(disk: &Path) -> Vec<(u64, u64, Vec<u8>)> {
    let out = run(&["analyze", "captures", "--json", disk.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["captures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let hex = c["hex"].as_str().unwrap();
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            let address = c["address"].as_str().unwrap().trim_start_matches("0x");
            (
                c["step"].as_u64().unwrap(),
                u64::from_str_radix(address, 16).unwrap(),
                bytes,
            )
        })
        .collect()
}

/// What the steps so far say memory holds: each byte's value and the
/// mnemonic of the step that stored it, where a known store was the last
/// to touch it since the memory was last unknown (an interrupt's delivery
/// pushes a frame no step records; a step whose registers before are not
/// known writes where the trace cannot say).
///
/// The CPU's page walker sets the accessed and dirty bits of the page
/// tables it walks, a write no step makes: the pages holding page tables
/// (the root of every address space, and each table a stored entry of a
/// table above links, 4-level paging) are left out.
#[derive(Default)]
struct Memory {
    bytes: HashMap<u64, (u8, String)>,
    /// Page-table pages and their level (4: the root).
    tables: HashMap<u64, u32>,
}

const PAGE: u64 = !0xfff;
const FRAME: u64 = 0x000f_ffff_ffff_f000;

impl Memory {
    /// Whether the CPU may write `addr` itself.
    fn walked(&self, addr: u64) -> bool {
        self.tables.contains_key(&(addr & PAGE))
    }

    /// Notes the tables an entry stored at `addr` links.
    fn link(&mut self, addr: u64, size: u64, value: Option<u64>) {
        let (Some(level), Some(entry)) = (self.tables.get(&(addr & PAGE)).copied(), value) else {
            return;
        };
        // Present, not a large page, above the last level (32-bit code
        // stores an entry's low half, which holds the frame below 4 GiB).
        if size >= 4 && addr.is_multiple_of(8) && entry & 1 == 1 && entry & 0x80 == 0 && level > 1 {
            self.tables.insert(entry & FRAME, level - 1);
        }
    }

    fn apply(&mut self, row: &Row) {
        self.tables.entry(row.cr3 & PAGE).or_insert(4);
        if row.interrupted {
            self.bytes.clear();
        }
        let Some(writes) = &row.writes else {
            self.bytes.clear();
            return;
        };
        for &(addr, size, value) in writes {
            self.link(addr, size, value);
            for i in 0..size {
                match value {
                    Some(v) if size <= 8 => {
                        let byte = (v >> (8 * i)) as u8;
                        self.bytes.insert(addr + i, (byte, row.mnemonic.clone()));
                    }
                    _ => {
                        self.bytes.remove(&(addr + i));
                    }
                }
            }
        }
    }

    /// The value at `addr` of `size` bytes, where every byte is known.
    fn value(&self, addr: u64, size: u64) -> Option<u64> {
        (0..size).try_fold(0u64, |v, i| {
            let (byte, _) = self.bytes.get(&(addr + i))?;
            Some(v | u64::from(*byte) << (8 * i))
        })
    }
}

/// Stores' values are what a capture of the same memory reads: the call
/// that pushed the return address, the pushes of saved registers, the
/// moves into locals, `rep stosb`'s bytes, and (recorded) `sete`'s byte.
/// And each load the export gives a value to reads what the stores before
/// it put there: (recorded) `add [m], 1` reads what it stored the time
/// before, `cmp` and `add r, [m]` what moves and pushes stored.
#[test]
fn stored_values_are_the_memory_a_capture_reads() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("values.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--trace",
        "--disk",
        disk.to_str().unwrap(),
        "--capture",
        "memset:rsp:64:memset",
        "--capture",
        "schedule:rsp:64:schedule",
        "--capture",
        "trap:rsp:64:trap",
        "--capture",
        "serial_write:rsp:64:serial",
        // Right after `sete [rax+4]` (the IDT's gates are built a byte at
        // a time): no register holds the byte it stored, so its value is
        // recorded, as are the loads of `add [m], 1` and `cmp [m], r`.
        "--capture",
        "idt_init+0x2f:rax:8:idt",
        "--record-values",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rows = export_rows(&disk);
    let captures = captures(&disk);
    assert!(captures.len() > 50, "{} captures", captures.len());

    let mut memory = Memory::default();
    let mut next = captures.iter().peekable();
    // Bytes compared, by the mnemonic that stored them.
    let mut checked: BTreeMap<String, u64> = BTreeMap::new();
    let mut loads: BTreeMap<String, u64> = BTreeMap::new();
    for row in &rows {
        // A capture is taken before its step runs.
        while let Some((step, addr, bytes)) = next.next_if(|c| c.0 <= row.step) {
            for (i, byte) in bytes.iter().enumerate() {
                if memory.walked(addr + i as u64) {
                    continue;
                }
                if let Some((stored, by)) = memory.bytes.get(&(addr + i as u64)) {
                    assert_eq!(
                        stored,
                        byte,
                        "byte {:#x} at step {step}: {by} stored {stored:#x}, the capture read \
                         {byte:#x}",
                        addr + i as u64
                    );
                    *checked.entry(by.clone()).or_default() += 1;
                }
            }
        }
        // A load with a value reads what the known stores put there.
        for &(addr, size, value) in row.reads.iter().flatten() {
            if let (Some(v), false) = (value, row.interrupted || memory.walked(addr)) {
                if let Some(stored) = memory.value(addr, size) {
                    assert_eq!(
                        v, stored,
                        "{} at step {} read {addr:#x}",
                        row.mnemonic, row.step
                    );
                    *loads.entry(row.mnemonic.clone()).or_default() += 1;
                }
            }
        }
        memory.apply(row);
    }
    listing_says_the_same(&disk, &rows);
    for by in ["call", "push", "mov", "stosb", "sete"] {
        assert!(
            checked.get(by).is_some_and(|n| *n >= 8),
            "{by}: {checked:?}"
        );
    }
    // Values only --record-values gives.
    for by in ["add", "cmp"] {
        assert!(loads.get(by).is_some_and(|n| *n >= 8), "{by}: {loads:?}");
    }
    assert!(
        loads.values().sum::<u64>() > 100,
        "loads checked: {loads:?}"
    );
}

/// `analyze listing --values` shows each step's accesses as the export
/// gives them (writes, then reads; `?` for no value), over kmain's first
/// calls, pushes and returns.
fn listing_says_the_same(disk: &Path, rows: &[Row]) {
    let start = rows
        .iter()
        .find(|r| r.mnemonic == "call")
        .map(|r| r.step)
        .unwrap();
    let from = start.to_string();
    let out = run(&[
        "analyze",
        "listing",
        "--values",
        "--no-lines",
        "--from",
        &from,
        "--count",
        "3000",
        disk.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let by_step: HashMap<u64, &Row> = rows.iter().map(|r| (r.step, r)).collect();
    let mut compared = 0;
    for line in stdout(&out).lines().filter(|l| !l.starts_with('#')) {
        let Some(step) = line
            .split_whitespace()
            .next()
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        let row = by_step[&step];
        let shown = line.split("| mem").nth(1).unwrap_or_default();
        let mut expected = String::new();
        for (kind, list) in [("w", &row.writes), ("r", &row.reads)] {
            for (addr, size, value) in list.iter().flatten() {
                let value = value.map_or("?".to_string(), |v| format!("{v:#x}"));
                expected.push_str(&format!(" {kind} {addr:#x}:{size}={value}"));
            }
        }
        assert_eq!(shown, expected, "{line}");
        compared += usize::from(!expected.is_empty());
    }
    assert!(compared > 100, "{compared} steps with memory compared");
}

/// `--record-values` only observes: the same steps, registers and events
/// as a run without it (the digest leaves the values out), and the values
/// on top.
#[test]
fn recording_values_leaves_the_run_as_it_was() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let traced = |name: &str, extra: &[&str]| {
        let disk = dir.path().join(name);
        let mut args = vec![
            "run",
            "--no-input",
            "--trace",
            "--max-steps",
            "300000",
            "--exit-after-trace",
            "--disk",
            disk.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = run(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        info_json(&disk)
    };
    let plain = traced("plain.vtd", &[]);
    let recorded = traced("recorded.vtd", &["--record-values"]);
    assert_eq!(plain["steps"], 300000);
    assert_eq!(plain["digest"], recorded["digest"]);
    assert!(plain["events"].get("memory values").is_none(), "{plain}");
    let events = recorded["events"]["memory values"].as_u64().unwrap_or(0);
    assert!(events > 1000, "{recorded}");
}
