//! `vtrace analyze symbolize` against binutils' own answers (`nm`,
//! `addr2line`) on the demo OS's ELF, and against the listing on a real
//! trace.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{demo_trace, kvm_available, run, stderr, stdout, vtrace, write_guest};

/// The demo's routines as `nm -S` gives them: (start, size, name), code
/// symbols only, by address.
fn nm_routines(elf: &Path) -> Vec<(u64, u64, String)> {
    let out = Command::new("nm").arg("-S").arg(elf).output().unwrap();
    assert!(out.status.success(), "nm: {}", stderr(&out));
    let mut routines: Vec<(u64, u64, String)> = stdout(&out)
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            match cols[..] {
                [start, size, "T" | "t", name] => Some((
                    u64::from_str_radix(start, 16).ok()?,
                    u64::from_str_radix(size, 16).ok()?,
                    name.to_string(),
                )),
                _ => None,
            }
        })
        .collect();
    routines.sort();
    routines
}

/// `addr2line -f -e ELF` for each address: (function, file:line or `??`).
fn addr2line(elf: &Path, addrs: &[u64]) -> Vec<(String, String)> {
    let out = Command::new("addr2line")
        .arg("-f")
        .arg("-e")
        .arg(elf)
        .args(addrs.iter().map(|a| format!("{a:#x}")))
        .output()
        .unwrap();
    assert!(out.status.success(), "addr2line: {}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 * addrs.len(), "{text}");
    lines
        .chunks(2)
        .map(|pair| {
            // `file:line (discriminator N)`: the discriminator is DWARF's
            // block number, not part of the place.
            let place = pair[1].split(" (").next().unwrap_or(pair[1]);
            (pair[0].to_string(), place.to_string())
        })
        .collect()
}

/// Runs `vtrace analyze symbolize ARGS`, feeding `input` on stdin.
fn symbolize(args: &[&str], input: &str) -> std::process::Output {
    let mut child = vtrace()
        .arg("analyze")
        .arg("symbolize")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Every routine's first byte and one inside it: the routine is the one
/// `nm` puts there (the first name at an address, where several share it)
/// and the file and line are `addr2line`'s.
#[test]
fn symbolize_agrees_with_nm_and_addr2line_on_the_demo_elf() {
    let dir = tempfile::tempdir().unwrap();
    let elf = write_guest(dir.path(), "demo.elf", vtrace_demo::DEMO_OS_ELF);
    let routines = nm_routines(&elf);
    assert!(routines.len() > 20, "{routines:?}");
    let mut expected = Vec::new();
    for (start, size, _) in &routines {
        for addr in [*start, start + size / 2] {
            // The routine at `addr`: the last to start at or below it (nm
            // sorts aliases by name; the ELF's first is not nm's first).
            let names: Vec<&str> = routines
                .iter()
                .filter(|(s, z, _)| *s <= addr && addr < s + (*z).max(1))
                .map(|(_, _, n)| n.as_str())
                .collect();
            let base = routines.iter().rfind(|(s, _, _)| *s <= addr).unwrap().0;
            expected.push((addr, names, addr - base));
        }
    }
    let addrs: Vec<u64> = expected.iter().map(|e| e.0).collect();
    let binutils = addr2line(&elf, &addrs);
    let args: Vec<String> = addrs.iter().map(|a| format!("{a:#x}")).collect();
    let mut all = vec!["--symbols", elf.to_str().unwrap()];
    all.extend(args.iter().map(String::as_str));
    let out = symbolize(&all, "");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let ours: Vec<&str> = text.lines().collect();
    assert_eq!(ours.len(), addrs.len(), "{text}");
    for ((line, (addr, names, off)), (_, place)) in ours.iter().zip(&expected).zip(&binutils) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            u64::from_str_radix(&cols[0][2..], 16).unwrap(),
            *addr,
            "{line}"
        );
        let (name, at) = match cols[1].split_once("+0x") {
            Some((n, o)) => (n, u64::from_str_radix(o, 16).unwrap()),
            None => (cols[1], 0),
        };
        assert!(names.contains(&name), "{line}: nm has {names:?} there");
        assert_eq!(at, *off, "{line}");
        match place.as_str() {
            "??:0" | "??:?" => assert_eq!(cols.len(), 2, "{line}: addr2line knows no line"),
            place => assert_eq!(cols.get(2), Some(&place), "{line}"),
        }
    }

    // Addresses on standard input, several a line, name the same.
    let input = args
        .chunks(3)
        .map(|c| c.join(" ") + "\n")
        .collect::<String>();
    let piped = symbolize(&["--symbols", elf.to_str().unwrap()], &input);
    assert!(piped.status.success(), "{}", stderr(&piped));
    assert_eq!(stdout(&piped), text);
}

#[test]
fn symbolize_says_what_it_cannot_name_and_what_is_not_an_address() {
    let dir = tempfile::tempdir().unwrap();
    let elf = write_guest(dir.path(), "demo.elf", vtrace_demo::DEMO_OS_ELF);
    let elf = elf.to_str().unwrap();
    // Outside every routine: `??`, never the nearest symbol below.
    let out = symbolize(&["--symbols", elf, "--json", "0xdead00000000"], "");
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["address"], 0xdead_0000_0000_u64);
    assert!(v["routine"].is_null() && v["file"].is_null(), "{v}");

    // A word that is no address: the rest is still answered, and the
    // exit status says something was left out.
    let start = common::demo_symbol("schedule");
    let out = symbolize(&["--symbols", elf], &format!("schedule\n{start:#x}\n"));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stdout(&out).contains(" schedule "), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("line 1: \"schedule\" is not an address"),
        "{}",
        stderr(&out)
    );
    // On the command line, clap refuses it before anything runs.
    let out = symbolize(&["--symbols", elf, "0xzz"], "");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // Nothing to name addresses with.
    let out = Command::new(env!("CARGO_BIN_EXE_vtrace"))
        .args(["analyze", "symbolize", "0x1000"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing to name the addresses with"),
        "{}",
        stderr(&out)
    );
}

/// A trace names its own kernel: every pc of a stretch of the demo's
/// listing is named as the listing names it.
#[test]
fn symbolize_names_a_trace_s_pcs_as_its_listing_does() {
    if !kvm_available() {
        return;
    }
    let trace = demo_trace().to_str().unwrap();
    let listing = run(&[
        "analyze", "listing", "--from", "200000", "--count", "300", trace,
    ]);
    assert!(listing.status.success(), "{}", stderr(&listing));
    let mut pcs = Vec::new();
    let mut named = Vec::new();
    for line in stdout(&listing).lines().filter(|l| !l.starts_with('#')) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() > 3 && cols[0].parse::<u64>().is_ok() {
            pcs.push(cols[2].to_string());
            named.push(cols[3].to_string());
        }
    }
    assert_eq!(pcs.len(), 300, "{}", stdout(&listing));
    let input = pcs.join("\n");
    let out = symbolize(&["--trace", trace], &input);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let ours: Vec<&str> = text
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(ours, named);
    assert!(
        text.contains(".c:") || text.contains(".S:"),
        "no source lines: {text}"
    );

    // `info` names where the trace begins and ends the same way.
    let info = stdout(&run(&["info", trace]));
    for label in ["first step:", "last step:"] {
        let line = info.lines().find(|l| l.starts_with(label)).unwrap();
        let cols: Vec<&str> = line[label.len()..].split_whitespace().collect();
        let out = symbolize(&["--trace", trace, cols[0]], "");
        let routine = stdout(&out).split_whitespace().nth(1).unwrap().to_string();
        assert_eq!(
            cols.get(1),
            Some(&format!("({routine})").as_str()),
            "{info}"
        );
    }
}
