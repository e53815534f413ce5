//! End-to-end tests of `vtrace analyze export` on a real trace of the demo
//! OS, read back with DuckDB (the Python package, which scripts/test.sh
//! installs): what a user's own data tools see.

mod common;

use std::collections::BTreeMap;

use common::{demo_trace, duckdb, info_json, kvm_available, python, run, stderr, stdout};
use serde_json::Value;

fn trace_arg() -> &'static str {
    demo_trace().to_str().unwrap()
}

fn export(args: &[&str]) -> std::process::Output {
    let mut all = vec!["analyze", "export", trace_arg()];
    all.extend_from_slice(args);
    let out = run(&all);
    assert!(out.status.success(), "vtrace {all:?}: {}", stderr(&out));
    out
}

fn one_number(sql: &str) -> u64 {
    duckdb(sql)[0][0].as_u64().expect("a number")
}

/// `name -> count` from a two-column query.
fn counts(sql: &str) -> BTreeMap<String, u64> {
    duckdb(sql)
        .into_iter()
        .map(|r| (r[0].as_str().unwrap().to_string(), r[1].as_u64().unwrap()))
        .collect()
}

fn stats_json() -> Value {
    let out = run(&["analyze", "stats", "--json", trace_arg()]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Sums a stats table by name (routines of a program may share names).
fn by_name(table: &Value, count: &str) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for r in table.as_array().unwrap() {
        *m.entry(r["name"].as_str().unwrap().to_string())
            .or_default() += r[count].as_u64().unwrap();
    }
    m
}

/// pyarrow (what pandas and many notebooks read Parquet with) reads every
/// column of the export as DuckDB does, row for row: the dictionary text
/// columns, the nullable registers, the lists with their null items. It
/// takes a dictionary page at its word: a text listed twice there made it
/// read indices past the end.
#[test]
fn pyarrow_reads_every_column_as_duckdb_does() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("steps.parquet");
    export(&["-o", file.to_str().unwrap()]);
    const SCRIPT: &str = "import sys, duckdb, pyarrow as pa, pyarrow.parquet as pq\n\
        duckdb.sql('SET enable_progress_bar = false')\n\
        path = sys.argv[1]\n\
        t = pq.read_table(path)\n\
        for i, f in enumerate(t.schema):\n\
        \x20   if pa.types.is_dictionary(f.type):\n\
        \x20       c = pa.chunked_array([x.cast(pa.string()) for x in t.column(i).chunks])\n\
        \x20       t = t.set_column(i, f.name, c)\n\
        q = lambda a, b: duckdb.sql(f'SELECT count(*) FROM (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b})').fetchall()[0][0]\n\
        f = f\"read_parquet('{path}')\"\n\
        print(t.num_rows, q('t', f), q(f, 't'))\n";
    let out = python(
        SCRIPT,
        &[file.to_str().unwrap()],
        "pyarrow and DuckDB on the export",
    );
    let said = stdout(&out);
    let steps = info_json(demo_trace())["steps"].as_u64().unwrap();
    assert_eq!(
        said.trim(),
        format!("{steps} 0 0"),
        "rows, then rows only one reader saw"
    );
}

#[test]
fn parquet_rows_are_the_trace_steps_and_group_as_stats_counts_them() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("steps.parquet");
    let file = file.to_str().unwrap();
    let said = stderr(&export(&["-o", file]));
    assert!(said.contains("bytes per step"), "{said}");
    let info = info_json(demo_trace());
    let steps = info["steps"].as_u64().unwrap();
    let from = format!("'{file}'");

    // One row per step, numbered as the trace numbers them.
    assert_eq!(one_number(&format!("SELECT count(*) FROM {from}")), steps);
    assert_eq!(
        one_number(&format!("SELECT count(DISTINCT step) FROM {from}")),
        steps
    );
    assert_eq!(
        one_number(&format!("SELECT max(step) - min(step) + 1 FROM {from}")),
        steps
    );
    // The demo's clock is one virtual nanosecond per step (info says so).
    assert!(
        info["metadata"]
            .as_str()
            .is_some_and(|m| m.contains("clock: steps:1")),
        "{info}"
    );
    assert_eq!(
        one_number(&format!(
            "SELECT count(*) FROM {from} WHERE virtual_ns IS DISTINCT FROM step"
        )),
        0
    );

    // A row group per segment.
    assert_eq!(
        Some(one_number(&format!(
            "SELECT count(DISTINCT row_group_id) FROM parquet_metadata({from})"
        ))),
        info["segments"].as_u64()
    );

    // Each row group's step statistics are its first and last step, so
    // that a reader skips the groups a step range rules out: the
    // groups' spans add up to the steps, from the first to the last.
    let spans = duckdb(&format!(
        "SELECT sum(stats_max_value::UBIGINT - stats_min_value::UBIGINT + 1)::UBIGINT, \
         min(stats_min_value::UBIGINT), max(stats_max_value::UBIGINT) \
         FROM parquet_metadata({from}) WHERE path_in_schema = 'step'"
    ));
    let range = duckdb(&format!("SELECT min(step), max(step) FROM {from}"));
    assert_eq!(spans[0][0].as_u64(), Some(steps), "{spans:?}");
    assert_eq!(spans[0][1..], range[0][..], "first and last step");

    // Steps per routine and per mnemonic: as `analyze stats` counts them.
    let stats = stats_json();
    assert_eq!(
        counts(&format!(
            "SELECT routine, count(*) FROM {from} GROUP BY routine"
        )),
        by_name(&stats["routines"], "self_steps")
    );
    assert_eq!(
        counts(&format!(
            "SELECT mnemonic, count(*) FROM {from} GROUP BY mnemonic"
        )),
        by_name(&stats["mnemonics"], "count")
    );
    // Interrupts: each delivered one before the step it interrupted.
    let interrupts: u64 = stats["interrupts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["count"].as_u64().unwrap())
        .sum();
    assert!(interrupts > 0);
    assert_eq!(
        one_number(&format!(
            "SELECT count(*) FROM {from} WHERE interrupt IS NOT NULL"
        )),
        interrupts
    );
    assert_eq!(
        one_number(&format!(
            "SELECT count(*) FROM {from} WHERE list_contains(events, \
             'trace started by the command line (--trace)')"
        )),
        1
    );
    // The demo runs its tasks in ring 0 and its own address spaces.
    assert!(
        one_number(&format!("SELECT count(DISTINCT cr3) FROM {from}")) > 1,
        "one address space"
    );
}

#[test]
fn memory_and_registers_follow_what_the_instructions_do() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("steps.parquet");
    let file = file.to_str().unwrap();
    export(&["-o", file]);
    let from = format!("'{file}'");

    // A push writes the new stack top, which is rsp after it; a pop reads
    // the old one, 8 below rsp after it; a call writes its return address
    // at the new rsp. The addresses come from the registers before the
    // step and the operand, rsp from the step's own record: two ways.
    let pushes = one_number(&format!(
        "SELECT count(*) FROM {from} WHERE mnemonic = 'push' AND bitness = 64 \
         AND writes IS NOT NULL"
    ));
    assert!(pushes > 500, "{pushes} pushes");
    for (what, wrong) in [
        (
            "push",
            "mnemonic = 'push' AND bitness = 64 AND writes IS NOT NULL \
             AND writes <> [rsp]",
        ),
        (
            "pop",
            "mnemonic = 'pop' AND bitness = 64 AND reads IS NOT NULL \
             AND reads <> [rsp - 8]",
        ),
        (
            "call",
            "mnemonic = 'call' AND bitness = 64 AND writes IS NOT NULL \
             AND NOT list_contains(writes, rsp)",
        ),
    ] {
        let bad = duckdb(&format!(
            "SELECT step, instruction, reads, writes, rsp FROM {from} WHERE {wrong} LIMIT 3"
        ));
        assert!(bad.is_empty(), "{what}: {bad:?}");
    }
    // The first step after the start of tracing has unknown registers
    // before it: it lists every register, and no addresses. So has a
    // handler's first step, as far as memory goes: the interrupt's
    // delivery moved the stack (rsp changed) between the two steps.
    let unknown = duckdb(&format!(
        "SELECT step, rax IS NOT NULL AND rflags IS NOT NULL FROM {from} \
         WHERE reads IS NULL AND interrupt IS NULL"
    ));
    assert_eq!(unknown.len(), 1, "{unknown:?}");
    assert_eq!(unknown[0][1], Value::Bool(true));
    let handlers = duckdb(&format!(
        "SELECT count(*), count(reads), count(rsp) FROM {from} WHERE interrupt IS NOT NULL"
    ));
    let n = handlers[0][0].as_u64().unwrap();
    assert!(n > 0);
    assert_eq!(handlers[0][1].as_u64(), Some(0), "{handlers:?}");
    assert_eq!(handlers[0][2].as_u64(), Some(n), "{handlers:?}");

    // The registers each step changed are the listing's, step by step,
    // across a segment border (a row group's: where the registers before
    // come from the segment before).
    let border = one_number(&format!(
        "SELECT any_value(row_group_num_rows) FROM parquet_metadata({from}) \
         WHERE row_group_id = 0"
    ));
    let first = border - 20;
    let listing = run(&[
        "analyze",
        "listing",
        trace_arg(),
        "--no-lines",
        "--from",
        &first.to_string(),
        "--count",
        "40",
    ]);
    assert!(listing.status.success(), "{}", stderr(&listing));
    let registers = [
        "rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12",
        "r13", "r14", "r15", "rflags",
    ];
    let select: Vec<String> = registers.iter().map(|r| r.to_string()).collect();
    let rows = duckdb(&format!(
        "SELECT step, pc, {} FROM {from} WHERE step >= {first} AND step < {} ORDER BY step",
        select.join(", "),
        first + 40
    ));
    let text = stdout(&listing);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("--") && !l.starts_with('#'))
        .collect();
    assert_eq!(lines.len(), 40, "{text}");
    for (row, line) in rows.iter().zip(&lines) {
        let changes = line.rsplit_once(" | ").map_or("", |(_, c)| c.trim());
        let exported: Vec<String> = registers
            .iter()
            .enumerate()
            .filter_map(|(i, r)| row[i + 2].as_u64().map(|v| format!("{r}={v:#x}")))
            .collect();
        assert_eq!(changes, exported.join(" "), "step {}: {line}", row[0]);
        assert!(
            line.trim_start()
                .starts_with(&row[0].as_u64().unwrap().to_string()),
            "{line}"
        );
    }
}

#[test]
fn a_directory_of_files_holds_every_step_once_and_replaces_an_earlier_export() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("steps");
    let out_arg = out.to_str().unwrap();
    let steps = info_json(demo_trace())["steps"].as_u64().unwrap();

    let said = stderr(&export(&["-o", out_arg, "--steps-per-file", "300000"]));
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 3, "{names:?}; {said}");
    // step_range=FIRST-END: each file starts where the one before ended,
    // and holds exactly its range.
    let mut expected_first = 0;
    for name in &names {
        let range = name
            .strip_prefix("step_range=")
            .and_then(|n| n.strip_suffix(".parquet"))
            .unwrap_or_else(|| panic!("{name}"));
        let (first, end) = range.split_once('-').unwrap();
        let (first, end): (u64, u64) = (first.parse().unwrap(), end.parse().unwrap());
        assert_eq!(first, expected_first, "{names:?}");
        let path = out.join(name);
        let row = &duckdb(&format!(
            "SELECT count(*), min(step), max(step) FROM '{}'",
            path.display()
        ))[0];
        assert_eq!(row[0].as_u64(), Some(end - first), "{name}");
        assert_eq!(row[1].as_u64(), Some(first), "{name}");
        assert_eq!(row[2].as_u64(), Some(end - 1), "{name}");
        expected_first = end;
    }
    assert_eq!(expected_first, steps);
    assert_eq!(
        one_number(&format!("SELECT count(*) FROM '{out_arg}/*.parquet'")),
        steps
    );

    // Again with bigger files: none of the first export's files is left.
    export(&["-o", out_arg, "--steps-per-file", "100000000"]);
    let again: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(
        one_number(&format!("SELECT count(*) FROM '{out_arg}/*.parquet'")),
        steps
    );
}

#[test]
fn json_lines_hold_the_same_rows() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("steps.jsonl");
    let parquet = dir.path().join("steps.parquet");
    export(&["-o", file.to_str().unwrap()]);
    export(&["-o", parquet.to_str().unwrap()]);
    let steps = info_json(demo_trace())["steps"].as_u64().unwrap();

    // Standard output: one JSON object per line, every one parses.
    let piped = export(&["-o", "-"]);
    let text = stdout(&piped);
    let mut n = 0u64;
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["step"].as_u64(), Some(n), "{line}");
        n += 1;
    }
    assert_eq!(n, steps);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);

    let json = format!(
        "read_json('{}', format = 'newline_delimited')",
        file.display()
    );
    let pq = format!("'{}'", parquet.display());
    assert_eq!(one_number(&format!("SELECT count(*) FROM {json}")), steps);
    assert_eq!(
        counts(&format!("SELECT routine, count(*) FROM {json} GROUP BY 1")),
        counts(&format!("SELECT routine, count(*) FROM {pq} GROUP BY 1"))
    );
    // The same instruction text and bytes (hex in JSON) at the same step.
    let a = duckdb(&format!(
        "SELECT step, instruction, bytes FROM {json} WHERE step % 99991 = 7 ORDER BY step"
    ));
    let b = duckdb(&format!(
        "SELECT step, instruction, hex(bytes) FROM {pq} WHERE step % 99991 = 7 ORDER BY step"
    ));
    assert!(a.len() > 5);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x[0], y[0]);
        assert_eq!(x[1], y[1]);
        assert_eq!(
            x[2].as_str().unwrap(),
            y[2].as_str().unwrap().to_lowercase()
        );
    }
}

/// An export stopped part way (a Ctrl-C, through the library's stop
/// question) or failing leaves no file completed as if its rows were all:
/// a file's goes, and a directory keeps only the files whole before it.
#[test]
fn a_stopped_export_leaves_no_partial_file() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use vtrace_export::{Destination, ExportError, ExportFormat};
    if !kvm_available() {
        return;
    }
    let trace = vtrace_analyzer::Trace::open(demo_trace()).unwrap();
    assert!(trace.segments.len() > 3, "segments to stop between");
    let symbols = vtrace_image::symbols::Symbolizer::new();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("steps.parquet");
    let out = dir.path().join("steps");
    let destinations = [
        Destination::File(file),
        // A file a segment: the first is whole when the stop comes.
        Destination::Directory {
            dir: out.clone(),
            steps_per_file: 1,
        },
    ];
    for (destination, format) in destinations
        .into_iter()
        .flat_map(|d| [(d.clone(), ExportFormat::Parquet), (d, ExportFormat::Jsonl)])
    {
        // Asked before each segment: two go in, the third is refused.
        let asked = AtomicUsize::new(0);
        let stop = || asked.fetch_add(1, Ordering::SeqCst) >= 2;
        let exported = vtrace_export::export(
            &trace,
            &symbols,
            format,
            &destination,
            &vtrace_analyzer::no_progress,
            &stop,
        );
        assert!(
            matches!(exported, Err(ExportError::Stopped)),
            "{destination:?} {format:?}: {exported:?}"
        );
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .chain(std::fs::read_dir(&out).into_iter().flatten())
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name != "steps")
            .collect();
        left.sort();
        let whole = match destination {
            Destination::Directory { .. } => {
                let first = &trace.segments[0];
                let (from, end) = (first.first_step, first.first_step + first.steps);
                vec![format!(
                    "step_range={from:012}-{end:012}.{}",
                    format.extension()
                )]
            }
            _ => Vec::new(),
        };
        assert_eq!(left, whole, "{destination:?} {format:?}");
        let _ = std::fs::remove_dir_all(&out);
    }
}

#[test]
fn bad_destinations_are_refused_with_the_reason() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let refused = |args: &[&str], status: i32, says: &str| {
        let mut all = vec!["analyze", "export", trace_arg()];
        all.extend_from_slice(args);
        let out = run(&all);
        assert_eq!(out.status.code(), Some(status), "{all:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(says), "{all:?}: {err}");
    };
    refused(
        &["-o", "-", "--format", "parquet"],
        2,
        "Parquet cannot go to standard output",
    );
    let named = dir.path().join("x.parquet");
    refused(
        &["-o", named.to_str().unwrap(), "--format", "jsonl"],
        2,
        "names a .parquet file but --format is jsonl",
    );
    let plain = dir.path().join("plain");
    std::fs::write(&plain, "mine").unwrap();
    refused(&["-o", plain.to_str().unwrap()], 2, "is a file");
    // A name with another extension is not taken for a directory.
    let csv = dir.path().join("out.csv");
    refused(
        &["-o", csv.to_str().unwrap()],
        2,
        "export writes .parquet or .jsonl files, not .csv",
    );
    assert!(!csv.exists());
    assert_eq!(std::fs::read_to_string(&plain).unwrap(), "mine");
    let nowhere = dir.path().join("no/such/dir/x.parquet");
    // The output cannot be made: 73, as for a trace disk.
    refused(&["-o", nowhere.to_str().unwrap()], 73, "No such file");
    refused(
        &["-o", "x.parquet", "--steps-per-file", "0"],
        2,
        "steps-per-file",
    );
}
