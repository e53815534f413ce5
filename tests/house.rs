//! The house rules, checked on the source itself, for every crate of the
//! workspace (its members, read from the workspace's Cargo.toml, and the
//! CLI): crates depend on each other only as the floors allow (read from
//! their Cargo.toml files), no crate re-exports another vtrace crate's
//! items (code names each crate by its own path), inside a crate no two
//! modules use each other (directly or around a circle), no source file is
//! over 700 lines before its tests, and no function is over 100 lines.
//! Tests are left out of the source rules; the end-to-end tests in `tests/`
//! are scenarios (one guest run, many checks) and left out of the sizes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Which crates a crate may not depend on: the floors of the house, and the
/// heavy libraries kept out of a crate. `None`: no vtrace crate at all (the
/// ground floor).
const FORBIDDEN: &[(&str, Option<&[&str]>)] = &[
    // The architecture and the trace format stand on nothing of vtrace's.
    ("vtrace-x86", None),
    ("vtrace-storage", None),
    // The engine's binding is the C ABI and the architecture, nothing else
    // of vtrace's.
    (
        "vtrace-bochs",
        Some(&[
            "vtrace-vmm",
            "vtrace-trap",
            "vtrace-storage",
            "vtrace-image",
            "vtrace-session",
            "vtrace-analyzer",
            "vtrace-export",
            "vtrace-gdb",
            "vtrace-guest",
            "vtrace-demo",
        ]),
    ),
    // The analyzer reads traces; it never runs a guest or steps one, and
    // builds without the export's arrow and parquet.
    (
        "vtrace-analyzer",
        Some(&[
            "vtrace-vmm",
            "vtrace-trap",
            "vtrace-export",
            "arrow-array",
            "arrow-buffer",
            "arrow-schema",
            "parquet",
        ]),
    ),
    // The export reads what the analyzer reads, and builds with arrow and
    // parquet apart from it.
    ("vtrace-export", Some(&["vtrace-vmm", "vtrace-trap"])),
    // The debugger serves a trace or a live guest, not the tracer's engine.
    ("vtrace-gdb", Some(&["vtrace-trap"])),
];

/// The workspace's members, from its Cargo.toml (`members = [...]`).
fn members(manifest: &str) -> Vec<String> {
    let Some(list) = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
    else {
        return Vec::new();
    };
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// The crates' source folders, from the workspace root: the CLI's and
/// every member's.
fn crates() -> Vec<String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let mut out = vec!["src".to_string()];
    out.extend(members(&manifest).into_iter().map(|m| format!("{m}/src")));
    out
}

/// A manifest's package name and the crates under its `[dependencies]`
/// (dev-dependencies are tests', not the crate's).
fn dependencies(manifest: &str) -> (String, Vec<String>) {
    let mut name = String::new();
    let mut deps = Vec::new();
    let mut section = "";
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            continue;
        }
        if section == "[package]" {
            if let Some(v) = line.strip_prefix("name = ") {
                name = v.trim_matches('"').to_string();
            }
        }
        if section == "[dependencies]" && !line.is_empty() && !line.starts_with('#') {
            let dep: String = line
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '-')
                .collect();
            deps.push(dep);
        }
    }
    (name, deps)
}

/// What `manifest` breaks of [`FORBIDDEN`], one line each.
fn floor_breaches(manifest: &str) -> Vec<String> {
    let (name, deps) = dependencies(manifest);
    let Some((_, forbidden)) = FORBIDDEN.iter().find(|(n, _)| *n == name) else {
        return Vec::new();
    };
    deps.iter()
        .filter(|d| match forbidden {
            None => d.starts_with("vtrace-"),
            Some(list) => list.contains(&d.as_str()),
        })
        .map(|d| format!("{name} depends on {d}"))
        .collect()
}

/// Re-exports of another vtrace crate's items in `text` (`pub use
/// vtrace_x::...`, `pub(crate) use` too), as their lines.
fn reexports(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| {
            let Some(rest) = l.strip_prefix("pub") else {
                return false;
            };
            let rest = match rest.strip_prefix('(') {
                Some(r) => r.split_once(')').map_or("", |(_, after)| after),
                None => rest,
            };
            let rest = rest.trim_start();
            rest.strip_prefix("use ")
                .map(|p| p.trim_start_matches("::"))
                .is_some_and(|p| p.starts_with("vtrace_"))
        })
        .map(str::to_string)
        .collect()
}

const MAX_FILE_LINES: usize = 700;
const MAX_FUNCTION_LINES: usize = 100;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text before the file's unit tests (`#[cfg(test)]`, perhaps more
/// attributes, then `mod tests`, perhaps `pub(super)` or the like where
/// other modules' tests share its helpers).
fn before_tests(text: &str) -> &str {
    let mut from = 0;
    while let Some(at) = text[from..].find("#[cfg(test)]\n") {
        let at = from + at;
        let after = text[at..].lines().skip(1).find(|l| !l.starts_with("#["));
        let unit_tests = |l: &str| {
            let unqualified = match l.strip_prefix("pub(") {
                Some(rest) => rest.split_once(") ").map_or(rest, |(_, item)| item),
                None => l,
            };
            unqualified
                .strip_prefix("mod tests")
                .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '{', ';']))
        };
        if after.is_some_and(unit_tests) {
            return &text[..at];
        }
        from = at + 1;
    }
    text
}

/// A file's module path in its crate: `run_loop/exit.rs` is
/// `["run_loop", "exit"]`, `run_loop/mod.rs` is `["run_loop"]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
    {
        parts.pop();
    }
    parts
}

/// The paths written after each `prefix` (`crate::a::b`), as segments.
fn paths_after(text: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let path: Vec<String> = rest[..end]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        if !path.is_empty() {
            out.push(path);
        }
    }
    out
}

/// Edges between sibling modules (at every level) of the crate at `src`.
fn module_edges(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_path(src, f), f.clone()))
        .collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap();
        let text = before_tests(&text);
        let parent = &module[..module.len().saturating_sub(1)];
        let mut refs = paths_after(text, "crate::");
        refs.extend(paths_after(text, "super::").into_iter().map(|p| {
            let mut full = parent.to_vec();
            full.extend(p);
            full
        }));
        for r in refs {
            let Some(target) = (1..=r.len())
                .rev()
                .map(|k| r[..k].to_vec())
                .find(|p| modules.contains_key(p))
            else {
                continue;
            };
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            // Parent and child use each other by design (a module and
            // its rooms); the rule is about siblings.
            if common == module.len() || common == target.len() {
                continue;
            }
            edges
                .entry(module[..=common].to_vec())
                .or_default()
                .insert(target[..=common].to_vec());
        }
    }
    edges
}

/// A circle among the modules, if there is one.
fn find_cycle(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<String>> {
    fn visit(
        node: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        on_path: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
    ) -> Option<Vec<String>> {
        if let Some(at) = on_path.iter().position(|n| n == node) {
            let mut circle: Vec<String> = on_path[at..].iter().map(|m| m.join("::")).collect();
            circle.push(node.join("::"));
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        on_path.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, edges, on_path, done) {
                return Some(c);
            }
        }
        on_path.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        if let Some(c) = visit(node, edges, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn every_crate_is_guarded() {
    let crates = crates();
    for krate in ["x86/src", "gdb/src", "guest-kit/demo/src", "analyzer/src"] {
        assert!(crates.iter().any(|c| c == krate), "{krate} in {crates:?}");
    }
    for krate in &crates {
        assert!(root().join(krate).is_dir(), "{krate}");
    }
}

#[test]
fn crates_stand_on_their_floors() {
    let mut found = Vec::new();
    for krate in crates() {
        let manifest = root().join(&krate).with_file_name("Cargo.toml");
        found.extend(floor_breaches(&std::fs::read_to_string(manifest).unwrap()));
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_floor_check_finds_each_breach() {
    let manifest = |name: &str, dep: &str| {
        format!(
            "[package]\nname = \"{name}\"\n\n[dependencies]\n{dep}.workspace = true\n\
             iced-x86 = \"1\"\n\n[dev-dependencies]\nvtrace-demo.workspace = true\n"
        )
    };
    for (name, dep) in [
        ("vtrace-x86", "vtrace-storage"),
        ("vtrace-storage", "vtrace-x86"),
        ("vtrace-analyzer", "vtrace-vmm"),
        ("vtrace-analyzer", "vtrace-trap"),
        ("vtrace-analyzer", "parquet"),
        ("vtrace-export", "vtrace-vmm"),
        ("vtrace-gdb", "vtrace-trap"),
    ] {
        assert_eq!(
            floor_breaches(&manifest(name, dep)),
            vec![format!("{name} depends on {dep}")]
        );
    }
    assert!(floor_breaches(&manifest("vtrace-analyzer", "vtrace-image")).is_empty());
    assert!(
        floor_breaches(&manifest("vtrace-trap", "vtrace-vmm")).is_empty(),
        "the tracer stands on the VMM"
    );
    assert_eq!(
        members("[workspace]\nmembers = [\"x86\", \"guest-kit/demo\"]\n"),
        ["x86", "guest-kit/demo"]
    );
}

/// Every crate's source files, each as its path from the workspace root
/// and its text before its unit tests.
fn sources() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for krate in crates() {
        let mut files = Vec::new();
        rust_files(&root().join(&krate), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let name = file.strip_prefix(root()).unwrap_or(&file).display();
            out.push((name.to_string(), before_tests(&text).to_string()));
        }
    }
    out
}

#[test]
fn no_crate_reexports_another() {
    let found: Vec<String> = sources()
        .iter()
        .flat_map(|(name, text)| {
            reexports(text)
                .into_iter()
                .map(move |l| format!("{name}: {l}"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "name other crates by their own path:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_reexport_check_finds_each_form() {
    let text = "use vtrace_x86::Flow;\npub use vtrace_x86::Flow;\n    pub(crate) use \
                vtrace_storage::{Regs, Step};\npub use ::vtrace_image::symbols;\npub use \
                crate::insn::Cache;\npub use iced_x86::Register;\n";
    assert_eq!(
        reexports(text),
        [
            "pub use vtrace_x86::Flow;",
            "pub(crate) use vtrace_storage::{Regs, Step};",
            "pub use ::vtrace_image::symbols;",
        ]
    );
}

#[test]
fn no_module_uses_another_that_uses_it() {
    for krate in crates() {
        let src = root().join(&krate);
        if let Some(circle) = find_cycle(&module_edges(&src)) {
            panic!("{krate}: modules use each other: {}", circle.join(" -> "));
        }
    }
}

#[test]
fn the_loop_finder_finds_a_loop() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(dir.path().join("a.rs"), "use crate::b::B;\npub struct A;\n").unwrap();
    std::fs::write(dir.path().join("b.rs"), "pub struct B(crate::a::A);\n").unwrap();
    let circle = find_cycle(&module_edges(dir.path())).expect("a and b use each other");
    assert!(circle.contains(&"a".to_string()) && circle.contains(&"b".to_string()));
    std::fs::write(dir.path().join("b.rs"), "pub struct B;\n").unwrap();
    assert_eq!(find_cycle(&module_edges(dir.path())), None);
}

/// The functions of `text` over `limit` lines, as (first line, name, lines).
fn long_functions(text: &str, limit: usize) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let signature = trimmed
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ")
            .trim_start_matches("const ")
            .trim_start_matches("unsafe ");
        let Some(rest) = signature.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // A body on the signature's line is one line long.
        if trimmed.contains('{') && trimmed.trim_end().ends_with('}') {
            continue;
        }
        // A declaration without a body (a trait's) ends with `;` first.
        let opens = lines[i..]
            .iter()
            .position(|l| l.trim_end().ends_with('{') || l.trim_end().ends_with(';'));
        if opens.is_none_or(|o| lines[i + o].trim_end().ends_with(';')) {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(len) = lines[i + 1..].iter().position(|l| *l == close) {
            if len + 2 > limit {
                out.push((i + 1, name, len + 2));
            }
        }
    }
    out
}

#[test]
fn no_file_over_700_lines_and_no_function_over_100() {
    let mut found = Vec::new();
    for (name, text) in sources() {
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            found.push(format!("{name}: {lines} lines before its tests"));
        }
        for (line, function, length) in long_functions(&text, MAX_FUNCTION_LINES) {
            found.push(format!("{name}:{line}: {function} is {length} lines"));
        }
    }
    assert!(
        found.is_empty(),
        "over the house's sizes:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_size_check_measures_functions() {
    let body = "    x += 1;\n".repeat(120);
    let text = format!(
        "trait T {{\n    fn f(&self);\n    fn g(&self) {{}}\n}}\n\npub fn long() {{\n{body}}}\n"
    );
    let found = long_functions(&text, MAX_FUNCTION_LINES);
    assert_eq!(found, vec![(6, "long".to_string(), 122)]);
    let tested =
        format!("fn a() {{}}\n#[cfg(test)]\n#[allow(dead_code)]\nmod tests {{\n{text}}}\n");
    assert_eq!(before_tests(&tested), "fn a() {}\n");
    let shared = format!("fn a() {{}}\n#[cfg(test)]\npub(super) mod tests {{\n{text}}}\n");
    assert_eq!(
        before_tests(&shared),
        "fn a() {}\n",
        "tests whose helpers others use"
    );
    let not_tests = format!("fn a() {{}}\n#[cfg(test)]\npub(super) mod testsuite;\n{text}");
    assert_eq!(
        before_tests(&not_tests).len(),
        not_tests.len(),
        "not unit tests"
    );
}
