//! The command line people expect: a version that names the commit,
//! completion scripts and manual pages made from the real definition,
//! `run --help` in sections, and `info`/`analyze` reading ./vtrace.vtd
//! when no trace is named.

mod common;

use common::*;

#[test]
fn the_version_names_the_commit_it_was_built_from() {
    let git = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    let out = run(&["--version"]);
    assert!(out.status.success());
    let version = stdout(&out);
    assert!(version.starts_with(&format!("vtrace {}", env!("CARGO_PKG_VERSION"))));
    match git {
        Ok(g) if g.status.success() => {
            let commit = String::from_utf8_lossy(&g.stdout).trim().to_string();
            assert!(version.contains(&format!("commit {commit}")), "{version}");
        }
        _ => assert!(version.contains("outside a git checkout"), "{version}"),
    }
}

#[test]
fn completions_and_manual_pages_come_from_the_command_line_itself() {
    for (shell, marker) in [
        ("bash", "_vtrace()"),
        ("zsh", "#compdef vtrace"),
        ("fish", "complete -c vtrace"),
    ] {
        let out = run(&["completions", shell]);
        assert!(out.status.success(), "{}", stderr(&out));
        let script = stdout(&out);
        assert!(script.contains(marker), "{shell}");
        // Options of nested commands are in it, as defined.
        assert!(
            script.contains("sample-pc") && script.contains("quantize"),
            "{shell}"
        );
    }
    // bash can load what it was given.
    let out = run(&["completions", "bash"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vtrace.bash");
    std::fs::write(&file, &out.stdout).unwrap();
    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(&file)
        .status()
        .unwrap();
    assert!(check.success(), "bash -n rejects the script");

    let out = run(&["man"]);
    let page = stdout(&out);
    assert!(
        page.starts_with(".ie") || page.contains(".TH vtrace"),
        "{page}"
    );
    let pages = dir.path().join("man");
    let out = run(&["man", "--dir", pages.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run_page = std::fs::read_to_string(pages.join("vtrace-run.1")).unwrap();
    assert!(run_page.contains("peep"), "vtrace-run.1 documents --peep");
    assert!(pages.join("vtrace-analyze-samples.1").exists());
}

#[test]
fn run_help_is_in_sections_and_says_its_defaults() {
    let out = run(&["run", "--help"]);
    let help = stdout(&out);
    for heading in [
        "Guest:",
        "Console:",
        "Clock:",
        "Tracing:",
        "Trace disk:",
        "Triggers:",
        "Probes, captures and peeping:",
        "Control:",
    ] {
        assert!(help.contains(heading), "{heading} in\n{help}");
    }
    assert!(help.contains("default vtrace.vtd"), "{help}");
    assert!(help.contains("[default: 1G]"), "{help}");
    // The default kernel command line, which --append adds to, as it is
    // (the help wraps it, so word by word).
    let default = vtrace_vmm::default_linux_cmdline(vtrace_vmm::CpuProfile::Baseline, 1);
    let words: Vec<&str> = help.split_whitespace().collect();
    let wanted: Vec<&str> = default.split_whitespace().collect();
    assert!(
        words.windows(wanted.len()).any(|w| w == wanted.as_slice()),
        "{default} in\n{help}"
    );
}

#[test]
fn the_readme_lists_the_exit_statuses_run_help_gives() {
    let help = stdout(&run(&["run", "--help"]));
    let (_, table) = help
        .split_once("Exit status:\n")
        .expect("run --help ends with its exit statuses");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    assert!(
        readme.contains(table.trim_end()),
        "README.md's exit statuses differ from run --help's:\n{table}"
    );
}

#[test]
fn info_and_analyze_read_vtrace_vtd_when_no_trace_is_named() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let here = |args: &[&str]| {
        vtrace()
            .args(args)
            .current_dir(dir.path())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let out = here(&["info"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("vtrace.vtd"), "{}", stderr(&out));
    let out = here(&["run", "--no-input", "-q", "--trace", "--max-steps", "500"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = here(&["info", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["steps"], 500);
    let out = here(&["analyze", "stats", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["steps"], 500, "{stats}");
    // Every text output takes -o.
    for what in ["stats", "spaces", "listing", "probes", "captures"] {
        let file = format!("{what}.out");
        let out = here(&["analyze", what, "-o", &file]);
        assert!(out.status.success(), "{what}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{what} wrote to standard output");
        let written = std::fs::read_to_string(dir.path().join(&file)).unwrap_or_default();
        assert!(
            !written.is_empty() || what == "probes" || what == "captures",
            "{what}"
        );
    }
    let out = here(&["info", "-o", "info.out"]);
    assert!(out.status.success(), "info: {}", stderr(&out));
    assert!(out.stdout.is_empty(), "info wrote to standard output");
    let info = std::fs::read_to_string(dir.path().join("info.out")).unwrap();
    assert!(info.contains("steps:          500"), "{info}");
    let listing = std::fs::read_to_string(dir.path().join("listing.out")).unwrap();
    assert!(listing.lines().count() >= 500, "a line per step");
    // `-o -` is standard output.
    let out = here(&["analyze", "flame", "-o", "-"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("<svg"), "an SVG on standard output");
    assert!(!dir.path().join("-").exists());
}

#[test]
fn a_run_without_a_terminal_reports_progress_while_tracing() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("p.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--trace",
        "--progress",
        "1s",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let log = stderr(&out);
    let steps: Vec<u64> = log
        .lines()
        .filter(|l| l.starts_with("vtrace: tracing on, "))
        .map(|l| number_after(l, "tracing on,").expect("steps recorded"))
        .collect();
    // The traced demo takes seconds here; a line comes each second.
    assert!(steps.len() >= 2, "{log}");
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "{steps:?}");
    let recorded = info_json(&disk)["steps"].as_u64().unwrap();
    assert!(*steps.last().unwrap() <= recorded);
    // With --quiet there is none.
    let out = run(&[
        "run",
        "--no-input",
        "-q",
        "--trace",
        "--progress",
        "1s",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    assert!(!stderr(&out).contains("tracing on,"), "{}", stderr(&out));
}

/// Untraced, the progress line says what tracing waits for and where the
/// guest is (a user waiting for `--start-at` on a slow host heard nothing
/// for minutes).
#[test]
fn a_run_waiting_for_its_trigger_reports_progress_too() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("p.vtd");
    // An address the demo never runs: tracing waits the whole run. The
    // demo runs about a second untraced here, its timer ticking at
    // 1 kHz: there are exits to look at the clock at.
    let out = run(&[
        "run",
        "--no-input",
        "--start-at",
        "0x7f0000",
        "--progress",
        "100ms",
        "--disk",
        disk.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let log = stderr(&out);
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("vtrace: tracing off until --start-at 0x7f0000 runs, 0 steps"))
        .collect();
    assert!(!lines.is_empty(), "{log}");
    assert!(
        lines.iter().all(|l| l.contains(", the guest at 0x")),
        "{log}"
    );
    // A routine given by name is named with its address.
    let kmain = common::demo_symbol("kmain");
    let out = run(&[
        "run",
        "--no-input",
        "--start-at",
        "kmain+0x700000",
        "--progress",
        "100ms",
        "--disk",
        dir.path().join("q.vtd").to_str().unwrap(),
    ]);
    let log = stderr(&out);
    let expected = format!(
        "tracing off until --start-at kmain+0x700000 ({:#x}) runs",
        kmain + 0x70_0000
    );
    assert!(log.contains(&expected), "{log}");
}
