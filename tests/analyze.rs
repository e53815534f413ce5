//! End-to-end tests of `vtrace analyze` on a real trace of the demo OS.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use common::{demo_trace, kvm_available, mmio_traced_here, run, stderr, stdout};
use object::{Object, ObjectSymbol};

fn analyze(args: &[&str]) -> std::process::Output {
    let mut all = vec!["analyze"];
    all.extend_from_slice(args);
    let out = run(&all);
    assert!(out.status.success(), "vtrace {all:?}: {}", stderr(&out));
    out
}

fn trace_arg() -> &'static str {
    demo_trace().to_str().unwrap()
}

fn info_steps() -> u64 {
    let out = run(&["info", "--json", trace_arg()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["steps"].as_u64().unwrap()
}

/// Indentation of a nest line's routine column (after the three counts).
/// Indentation of a nest line's routine column (after the step, the two
/// counts and, the demo's clock being per step, the duration).
fn indent(line: &str) -> usize {
    let body = &line[2 + 10 + 1 + 10 + 1 + 8 + 15 + 2..];
    body.len() - body.trim_start().len()
}

/// The step number a nest line starts with.
fn line_step(line: &str) -> Option<u64> {
    line.split_whitespace().next()?.parse().ok()
}

#[test]
fn nest_has_durations_growing_steps_and_uftrace_filters() {
    if !kvm_available() {
        return;
    }
    let text = stdout(&analyze(&["nest", trace_arg()]));
    assert!(text.contains("duration is total as virtual time, 1 ns a step"));
    let mut entries = 0;
    let mut last = 0;
    for line in text.lines().skip(2) {
        // The demo's clock is 1 ns a step: a routine's duration is its
        // total steps in ns.
        let cols: Vec<&str> = line.split_whitespace().collect();
        if let (Some(total), Some("us")) = (
            cols.get(1).and_then(|t| t.parse::<u64>().ok()),
            cols.get(4).copied(),
        ) {
            let us: f64 = cols[3].parse().unwrap();
            assert!((us * 1000.0 - total as f64).abs() < 0.5, "{line}");
            entries += 1;
        }
        // Step numbers only grow down the page (the routines left open
        // on other stacks at the trace's end close last, at their own).
        if line.contains("open at trace end") {
            break;
        }
        let step = line_step(line).unwrap();
        assert!(step >= last, "{step} after {last}: {line}");
        last = step;
    }
    assert!(entries > 100);

    // --function: only page_fault's calls and what they call; the demo
    // takes 9 page faults, each handled by one page_fault() call.
    let only = stdout(&analyze(&["nest", trace_arg(), "--function", "page_fault"]));
    let lines: Vec<&str> = only.lines().skip(2).collect();
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("page_fault() {"))
            .count(),
        9,
        "{only}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l.contains("page_fault") || l.contains("memset();")),
        "{only}"
    );

    // --depth 1: each block shows its outermost routines only.
    let shallow = stdout(&analyze(&["nest", trace_arg(), "--depth", "1"]));
    let mut block_indent: Option<usize> = None;
    for line in shallow.lines().skip(2) {
        if line.contains("==>") {
            block_indent = None;
            continue;
        }
        if line.contains(DIVIDED_MARK) {
            continue;
        }
        let i = indent(line);
        assert_eq!(*block_indent.get_or_insert(i), i, "{line}");
    }

    // --from/--to and --space.
    let window = stdout(&analyze(&[
        "nest",
        trace_arg(),
        "--from",
        "50000",
        "--to",
        "60000",
    ]));
    let steps: Vec<u64> = window.lines().skip(2).filter_map(line_step).collect();
    assert!(!steps.is_empty());
    assert!(
        steps.iter().all(|s| (50_000..60_000).contains(s)),
        "{window}"
    );
    let space = stdout(&analyze(&["nest", trace_arg(), "--space", "0x404000"]));
    let levels: Vec<&str> = space.lines().filter(|l| l.contains("==>")).collect();
    assert!(!levels.is_empty());
    assert!(
        levels.iter().all(|l| l.contains("(address space 0x404000")),
        "{levels:?}"
    );
    // An address space the trace never ran in: said, not silently empty.
    let none = analyze(&["nest", trace_arg(), "--space", "0xdead000"]);
    assert!(
        stderr(&none).contains("nothing ran in address space 0xdead000"),
        "{}",
        stderr(&none)
    );
}

const DIVIDED_MARK: &str = "## divided level ##";

/// The demo trace's records `copies` times over, in a new trace at `path`
/// with the demo trace's metadata (so its symbols are found).
fn repeated_demo_trace(path: &Path, copies: usize) -> PathBuf {
    use vtrace_storage::{DiskWriter, DEFAULT_SEGMENT_SIZE};
    use vtrace_storage::{Recorder, SegmentDecoder, TraceReader};
    let reader = TraceReader::open(demo_trace()).unwrap();
    let metadata = reader.superblock().unwrap().metadata.clone();
    let payloads: Vec<Vec<u8>> = (0..reader.segments().len())
        .map(|i| reader.payload(i).unwrap())
        .collect();
    let disk = DiskWriter::create(path, 256 << 20, DEFAULT_SEGMENT_SIZE, false, &metadata).unwrap();
    let mut recorder = Recorder::start(disk);
    for _ in 0..copies {
        for payload in &payloads {
            for record in SegmentDecoder::new(payload) {
                recorder.record(&record.unwrap());
            }
        }
    }
    let report = recorder.finish().unwrap();
    assert_eq!(report.dropped_chunks, 0);
    path.to_path_buf()
}

/// A reader that wants the first lines only (`vtrace analyze nest | head
/// -2`) gets them, and vtrace stops reading the trace when the pipe
/// closes, exiting 0, rather than walking the rest of it.
#[test]
fn nest_stops_reading_when_its_reader_goes_away() {
    if !kvm_available() {
        return;
    }
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    // Ten demo runs: a diagram longer than a pipe and vtrace's own
    // buffers hold, so vtrace sees the pipe close before it is done.
    let long = repeated_demo_trace(&dir.path().join("long.vtd"), 10);
    let mut child = common::vtrace()
        .args(["-v", "analyze", "nest", long.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("# vtrace nest diagram of"), "{first}");
    assert!(
        lines.next().unwrap().unwrap().starts_with("#"),
        "the legend"
    );
    drop(lines);
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let total = 10 * info_steps();
    let stopped: u64 = err
        .lines()
        .find_map(|l| l.split("stopped reading after step ").nth(1))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no stop said: {err}"));
    assert!(
        stopped < total,
        "stopped at {stopped} of the trace's {total} steps"
    );
    assert!(err.contains(&format!("of {total}")), "{err}");
}

#[test]
fn nest_shows_the_timer_interrupt_the_scheduler_and_task_switches() {
    if !kvm_available() {
        return;
    }
    let text = stdout(&analyze(&["nest", trace_arg()]));
    let lines: Vec<&str> = text.lines().collect();
    // The demo OS's timer path (os/entry.S, os/interrupts.c): isr32 jumps
    // to isr_common, which calls trap(); trap's `return schedule(f)` is a
    // tail call at -O2, so schedule runs at trap's depth, in place of it.
    let mut timer_paths = 0;
    let mut switches_in_timer = 0;
    for (i, l) in lines.iter().enumerate() {
        if !l.contains("==> interrupt: irq 0 (timer)") {
            continue;
        }
        let isr = lines[i + 1];
        let common = lines[i + 2];
        let trap = lines[i + 3];
        let schedule = lines[i + 4];
        assert!(isr.contains("isr32();  [irq 0 (timer)]"), "{isr}");
        assert!(
            common.contains("isr_common() {  [irq 0 (timer)]"),
            "{common}"
        );
        assert_eq!(indent(isr), indent(common), "{isr}\n{common}");
        assert!(trap.contains("trap();"), "{trap}");
        assert_eq!(indent(trap), indent(common) + 2, "{common}\n{trap}");
        assert!(
            schedule.contains("schedule(") && schedule.contains("[jmp]"),
            "{schedule}"
        );
        assert_eq!(indent(schedule), indent(trap));
        timer_paths += 1;
        let rest = &lines[i + 5..];
        let end = rest
            .iter()
            .position(|l| l.contains("==> return from interrupt"))
            .unwrap_or(rest.len());
        if rest[..end]
            .iter()
            .any(|l| l.contains("==> address space switch"))
        {
            switches_in_timer += 1;
        }
    }
    assert!(
        timer_paths >= 3,
        "only {timer_paths} timer interrupts in:\n{text}"
    );
    assert!(
        switches_in_timer >= 1,
        "no task switch inside a timer interrupt:\n{text}"
    );
    // A page fault: trap calls page_fault, one level deeper.
    let pf = lines
        .iter()
        .position(|l| l.contains("==> interrupt: #PF"))
        .expect("the demo OS takes page faults");
    let trap = lines[pf + 3];
    let fault = lines[pf + 4];
    assert!(trap.contains("trap() {"), "{trap}");
    assert!(fault.contains("page_fault"), "{fault}");
    assert_eq!(indent(fault), indent(trap) + 2);
    // Each task's first run starts from nowhere (a return to where no
    // call was seen): the switch to it says so, and the demo, whose calls
    // all return where they were made, has no divided level.
    let spaces = lines
        .iter()
        .filter(|l| l.contains("==> address space switch"))
        .filter_map(|l| l.split("(address space ").nth(1))
        .map(|s| s.trim_end_matches(", its first run)").trim_end_matches(')'))
        .collect::<HashSet<_>>();
    assert_eq!(
        text.matches(", its first run)").count(),
        spaces.len(),
        "{spaces:?}"
    );
    assert!(!text.contains("## divided level ##"));
}

#[test]
fn self_steps_add_up_to_the_trace_and_stats_parse() {
    if !kvm_available() {
        return;
    }
    let steps = info_steps();
    let out = analyze(&["stats", "--json", trace_arg()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
    assert_eq!(v["steps"].as_u64(), Some(steps));
    let self_sum: u64 = v["routines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["self_steps"].as_u64().unwrap())
        .sum();
    assert_eq!(self_sum, steps);
    let mix: u64 = v["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["count"].as_u64().unwrap())
        .sum();
    assert_eq!(mix, steps);
    // The three tasks are where the demo spends its steps, with memset:
    // every iteration of its `rep stosb` is a step (the demo clears its
    // pages and stacks with it).
    let top: Vec<&str> = v["routines"].as_array().unwrap()[..4]
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for task in ["task_crc", "task_sieve", "task_matrix"] {
        assert!(top.contains(&task), "{top:?}");
    }
    let vectors: Vec<u64> = v["interrupts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["vector"].as_u64().unwrap())
        .collect();
    assert!(
        vectors.contains(&32) && vectors.contains(&14),
        "{vectors:?}"
    );
    assert!(v["interrupts_disabled"]["longest"].as_u64().unwrap() > 0);
    assert!(v["locality"]["distinct_pages"].as_u64().unwrap() > 0);
    let text = stdout(&analyze(&["stats", trace_arg()]));
    assert!(text.contains("routines by self steps"), "{text}");
}

/// A listing's step lines: not its header (`#`) or its events (`--`).
fn step_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("--") && !l.starts_with('#'))
}

#[test]
fn listing_windows_and_files_cover_every_step_with_demo_symbols() {
    if !kvm_available() {
        return;
    }
    let steps = info_steps();
    let window = stdout(&analyze(&[
        "listing",
        trace_arg(),
        "--from",
        "1000",
        "--count",
        "50",
    ]));
    let numbers: Vec<u64> = step_lines(&window)
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(numbers, (1000..1050).collect::<Vec<_>>());
    // A header row names the columns; the pc column is the routine's
    // address plus the offset the routine column gives (the ELF's
    // symbols); numbers are 0x... everywhere, the disassembly included.
    assert!(window.starts_with("#     step"), "{window}");
    let wide = stdout(&analyze(&[
        "listing",
        trace_arg(),
        "--no-lines",
        "--from",
        "49200",
        "--count",
        "2000",
    ]));
    let mut bar = None;
    for l in step_lines(&wide) {
        let cols: Vec<&str> = l.split_whitespace().collect();
        assert!(
            cols[1].starts_with("0x") && cols[2].starts_with("0x"),
            "{l}"
        );
        let pc = u64::from_str_radix(&cols[2][2..], 16).unwrap();
        let (name, off) = cols[3].split_once("+0x").unwrap_or((cols[3], "0"));
        let off = u64::from_str_radix(off, 16).unwrap();
        assert_eq!(common::demo_symbol(name) + off, pc, "{l}");
        let asm = l[..l.rfind(" |").unwrap()].trim_end();
        assert!(
            !asm.split([' ', ',', '[', ']', '+', '*'])
                .any(|w| w.len() > 1
                    && w.ends_with('h')
                    && w[..w.len() - 1].chars().all(|c| c.is_ascii_hexdigit())),
            "MASM hex in {l}"
        );
        // Fixed columns: the registers start at the same place on every line.
        assert_eq!(
            *bar.get_or_insert(l.find(" |").unwrap()),
            l.find(" |").unwrap(),
            "{l}"
        );
    }
    // Ports and hypercalls by name.
    let all = stdout(&analyze(&["listing", trace_arg(), "--no-lines"]));
    assert!(all.contains("-- io out port 0x3f8 (COM1) size 1"));
    assert!(all.contains("-- hypercall TRACE_START args ["));
    let last = stdout(&analyze(&[
        "listing",
        trace_arg(),
        "--from",
        &(steps - 5).to_string(),
        "--count",
        "100",
    ]));
    assert_eq!(step_lines(&last).count(), 5, "{last}");

    let dir = tempfile::tempdir().unwrap();
    analyze(&[
        "listing",
        trace_arg(),
        "--no-lines",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len() as u64, steps.div_ceil(500_000));
    let elf = object::File::parse(vtrace_demo::DEMO_OS_ELF).unwrap();
    let names: HashSet<String> = elf
        .symbols()
        .filter_map(|s| s.name().ok().map(str::to_string))
        .collect();
    let mut count = 0u64;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for l in step_lines(&text) {
            // step, address space, pc, routine+offset
            let place = l.split_whitespace().nth(3).unwrap();
            let routine = place.split('+').next().unwrap();
            assert!(names.contains(routine), "step not in a demo routine: {l}");
            count += 1;
        }
    }
    assert_eq!(count, steps);
}

#[test]
fn spaces_lists_the_boot_space_and_each_task() {
    if !kvm_available() {
        return;
    }
    let out = analyze(&["spaces", "--json", trace_arg()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("spaces JSON");
    let spaces = v["spaces"].as_array().unwrap();
    // Boot (paging off), the kernel's own tables, and one per task.
    assert!(spaces.len() >= 5, "{v}");
    let sum: u64 = spaces.iter().map(|s| s["steps"].as_u64().unwrap()).sum();
    assert_eq!(sum, info_steps());
    assert!(v["switches"].as_u64().unwrap() >= 6);
    for task in ["task_crc", "task_sieve", "task_matrix"] {
        assert!(
            spaces.iter().any(|s| s["routines"][0]["name"] == task),
            "{task} does not lead any address space: {v}"
        );
    }
}

#[test]
fn flame_graph_is_well_formed_svg_with_the_call_stacks() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("flame.svg");
    analyze(&["flame", trace_arg(), "-o", svg.to_str().unwrap()]);
    let text = std::fs::read_to_string(&svg).unwrap();
    // inferno writes the SVG 1.1 doctype; the parser refuses DTDs unless told.
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(&text, options).expect("well-formed SVG");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let titles: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    for name in ["isr_common", "trap", "schedule", "task_crc"] {
        assert!(
            titles.iter().any(|t| t.starts_with(name)),
            "{name} not in the graph"
        );
    }

    // Folded stacks: a root per address space, as `analyze spaces` lists
    // them, and every step once, as self steps of some stack.
    let folded = stdout(&analyze(&["flame", trace_arg(), "--folded", "-o", "-"]));
    let mut total = 0u64;
    let mut roots = HashSet::new();
    for line in folded.lines() {
        let (stack, count) = line.rsplit_once(' ').unwrap();
        total += count.parse::<u64>().unwrap();
        let root = stack.split(';').next().unwrap();
        assert!(root.starts_with("cr3=0x"), "{line}");
        roots.insert(root.trim_start_matches("cr3=").to_string());
    }
    assert_eq!(total, info_steps());
    let spaces: serde_json::Value =
        serde_json::from_slice(&analyze(&["spaces", "--json", trace_arg()]).stdout).unwrap();
    let listed: HashSet<String> = spaces
        .as_array()
        .or_else(|| spaces["spaces"].as_array())
        .unwrap()
        .iter()
        .map(|s| format!("{:#x}", s["cr3"].as_u64().unwrap()))
        .collect();
    assert_eq!(roots, listed);
    assert!(roots.len() > 3, "{roots:?}");
}

#[test]
fn timeline_is_trace_event_json_with_a_track_per_address_space() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("timeline.json");
    analyze(&["timeline", trace_arg(), "-o", json.to_str().unwrap()]);
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).expect("timeline JSON");
    let events = v["traceEvents"].as_array().unwrap();
    let of = |ph: &'static str| events.iter().filter(move |e| e["ph"] == ph);
    assert!(of("M").filter(|e| e["name"] == "thread_name").count() >= 4);
    assert!(of("X").any(|e| e["name"] == "schedule"));
    assert!(of("i").any(|e| e["name"] == "irq 0 (timer)"));
    // Virtual time: the demo was traced with one nanosecond per step.
    let last_end = of("X")
        .map(|e| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(last_end <= info_steps() as f64 / 1000.0 + 1.0);
}

/// Headless Chromium, as the field's pages are tested: no network, no
/// first-run work, a profile of its own.
fn chromium(dir: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.join("chromium").display()
        ))
        .args(args)
        .output()
        .expect("chromium is installed by scripts/test.sh; run that script")
}

#[test]
fn html_report_renders_in_headless_chromium() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    analyze(&["report", trace_arg(), "-o", html.to_str().unwrap()]);
    let page = std::fs::read_to_string(&html).unwrap();
    for loads in ["<script src", "<link", "src=\"http", "url(http"] {
        assert!(!page.contains(loads), "the page loads something: {loads}");
    }
    let url = format!("file://{}#search=memset", html.display());
    let shown = chromium(dir.path(), &["--dump-dom", &url]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let dom = stdout(&shown);
    // The script ran to its end, and the search in the address found the
    // lines that name memset, opening their levels.
    assert!(
        dom.contains("data-ready=\"1\""),
        "the page's script did not finish"
    );
    let matches: u64 = dom
        .split("data-matches=\"")
        .nth(1)
        .and_then(|m| m[..m.find('"')?].parse().ok())
        .expect("the search ran");
    let nest = stdout(&analyze(&["nest", trace_arg()]));
    let in_nest = nest.lines().filter(|l| l.contains("memset")).count() as u64;
    assert!(matches > 0 && matches <= in_nest, "{matches} of {in_nest}");
    // Nothing went wrong in the page's console.
    let log = stderr(&shown);
    let console_error = |line: &str| {
        line.contains("Uncaught") || (line.contains(":CONSOLE") && line.contains("rror"))
    };
    assert!(
        !log.lines().any(console_error),
        "console: {:?}",
        log.lines().find(|l| console_error(l))
    );
    for id in [
        "summary",
        "charts",
        "flame",
        "routines",
        "interrupts",
        "syscalls",
        "mix",
        "nest",
        "listings",
    ] {
        assert!(
            dom.contains(&format!("id=\"{id}\"")),
            "section {id} missing"
        );
    }
    // Numbers with separators; the charts drawn, the busiest routine's bar
    // the longest; the flame graph in its frame.
    let steps = info_steps();
    let grouped = steps
        .to_string()
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join(",");
    assert!(
        dom.contains(&format!("<td>{grouped}</td>")),
        "steps as {grouped}"
    );
    assert_eq!(dom.matches("<svg class=\"chart\"").count(), 3);
    let first_chart = &dom[dom.find("<svg class=\"chart\"").unwrap()..];
    let first_chart = &first_chart[..first_chart.find("</svg>").unwrap()];
    assert!(first_chart.contains(">task_crc</text>"), "{first_chart}");
    let widths: Vec<f64> = first_chart
        .split("<rect ")
        .skip(1)
        .map(|r| {
            let w = r.split("width=\"").nth(1).unwrap();
            w[..w.find('"').unwrap()].parse().unwrap()
        })
        .collect();
    assert!(widths.len() >= 10 && widths[0] > 100.0, "{widths:?}");
    assert!(widths.windows(2).all(|w| w[0] >= w[1]), "{widths:?}");
    assert!(dom.contains("<iframe title=\"flame graph\""));
    assert!(
        page.contains("srcdoc=\"&lt;?xml"),
        "the flame graph's document"
    );
    // A routine links to a listing window of its first call: the window
    // starts in that routine.
    let at = page
        .find("href=\"#listing-0\">")
        .expect("a routine links to its listing");
    let name = &page[at + "href=\"#listing-0\">".len()..];
    let name = &name[..name.find('<').unwrap()];
    let window = &page[page.find("id=\"listing-0\"").unwrap()..];
    let first_step = window
        .lines()
        .find(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|n| n.parse::<u64>().is_ok())
        })
        .unwrap();
    assert!(
        first_step.contains(&format!(" {name}")),
        "{name}: {first_step}"
    );

    // What a person sees: a screenshot of the page as rendered.
    let png = dir.path().join("report.png");
    let shot = chromium(
        dir.path(),
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1400,3000",
            &format!("file://{}", html.display()),
        ],
    );
    assert!(shot.status.success(), "{}", stderr(&shot));
    let image = std::fs::read(&png).unwrap();
    assert_eq!(&image[..8], b"\x89PNG\r\n\x1a\n");
    let (w, h) = (
        u32::from_be_bytes(image[16..20].try_into().unwrap()),
        u32::from_be_bytes(image[20..24].try_into().unwrap()),
    );
    assert_eq!((w, h), (1400, 3000));
    // A blank page compresses to a few kB; this one has tables, charts
    // and a flame graph.
    assert!(image.len() > 100_000, "{} bytes", image.len());
}

#[test]
fn diff_of_a_trace_and_its_own_beginning() {
    if !kvm_available() {
        return;
    }
    // The demo under the step clock runs the same way every time, so a
    // run traced for its first 300,000 steps is the full trace's
    // beginning: B (the full trace) has at least A's steps in every
    // routine, and the changes add up to the steps B has more.
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.vtd");
    let out = run(&[
        "run",
        "--no-input",
        "--trace",
        "--max-steps",
        "300000",
        "--disk",
        short.to_str().unwrap(),
        "--disk-size",
        "64M",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let flame = dir.path().join("diff.svg");
    let json = |a: &str, b: &str, extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["diff", a, b, "--json"];
        args.extend_from_slice(extra);
        serde_json::from_slice(&analyze(&args).stdout).unwrap()
    };
    let d = json(
        short.to_str().unwrap(),
        trace_arg(),
        &["--flame", flame.to_str().unwrap()],
    );
    assert_eq!(d["a"]["steps"], 300_000);
    assert_eq!(d["b"]["steps"].as_u64(), Some(info_steps()));
    let routines = d["routines"].as_array().unwrap();
    let mut sum = 0i64;
    for r in routines {
        let delta = r["self_delta"].as_i64().unwrap();
        assert!(delta >= 0, "{r}");
        assert_eq!(
            r["self_b"].as_i64().unwrap() - r["self_a"].as_i64().unwrap(),
            delta
        );
        sum += delta;
    }
    assert_eq!(sum, info_steps() as i64 - 300_000);
    assert_eq!(
        d["vanished"].as_array().unwrap().len(),
        0,
        "{}",
        d["vanished"]
    );
    // The matrix task runs after the first 300,000 steps.
    assert!(
        d["new"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == "task_matrix"),
        "{}",
        d["new"]
    );
    // B's side is what `analyze stats` says of B.
    let stats: serde_json::Value =
        serde_json::from_slice(&analyze(&["stats", "--json", trace_arg()]).stdout).unwrap();
    for r in stats["routines"].as_array().unwrap() {
        let name = r["name"].as_str().unwrap();
        let row = routines.iter().find(|x| x["name"] == name).unwrap();
        assert_eq!(row["self_b"], r["self_steps"], "{name}");
        assert_eq!(row["total_b"], r["total_steps"], "{name}");
    }
    // The differential flame graph: B's stacks, a routine that ran only
    // in B red (inferno draws more in B as rgb(255,x,x)) with its change.
    let svg = std::fs::read_to_string(&flame).unwrap();
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(&svg, options).expect("well-formed SVG");
    let matrix = doc
        .descendants()
        .filter(|n| n.has_tag_name("g"))
        .find(|g| {
            g.children().any(|c| {
                c.has_tag_name("title") && c.text().is_some_and(|t| t.starts_with("task_matrix "))
            })
        })
        .expect("task_matrix in the graph");
    let title = matrix
        .children()
        .find(|c| c.has_tag_name("title"))
        .and_then(|t| t.text());
    assert!(title.is_some_and(|t| t.contains("; +")), "{title:?}");
    let fill = matrix
        .children()
        .find(|c| c.has_tag_name("rect"))
        .and_then(|r| r.attribute("fill"));
    assert!(fill.is_some_and(|f| f.starts_with("rgb(255,")), "{fill:?}");

    // A trace against itself: nothing changed.
    let same = json(trace_arg(), trace_arg(), &[]);
    for r in same["routines"].as_array().unwrap() {
        assert_eq!(r["self_delta"], 0, "{r}");
        assert_eq!(r["total_delta"], 0, "{r}");
    }
    for table in ["classes", "mnemonics", "interrupts"] {
        for r in same[table].as_array().unwrap() {
            assert_eq!(r["points"], 0.0, "{table}: {r}");
        }
    }
    assert!(same["new"].as_array().unwrap().is_empty());
    let text = stdout(&analyze(&["diff", trace_arg(), trace_arg(), "--top", "3"]));
    assert!(text.contains("B - A: 0 steps (+0.00%)"), "{text}");
}

#[test]
fn bad_input_gets_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.vtd");
    let out = run(&["analyze", "nest", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("nope.vtd"), "{}", stderr(&out));
    let junk = dir.path().join("junk.vtd");
    std::fs::write(&junk, vec![0x5a; 8192]).unwrap();
    let out = run(&["analyze", "stats", junk.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not a vtrace trace"),
        "{}",
        stderr(&out)
    );
    if !kvm_available() {
        return;
    }
    let out = run(&[
        "analyze",
        "nest",
        trace_arg(),
        "--symbols",
        "/no/such/System.map",
    ]);
    // User mistakes have their own statuses (66 missing, 2 a bad
    // argument), not 70's "internal error".
    assert_eq!(out.status.code(), Some(66), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/no/such/System.map"),
        "{}",
        stderr(&out)
    );
    {
        let fifo = dir.path().join("map.fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let out = run(&[
                "analyze",
                "nest",
                trace_arg(),
                "--symbols",
                fifo.to_str().unwrap(),
            ]);
            assert_eq!(out.status.code(), Some(66), "{}", stderr(&out));
        }
    }
    let out = run(&["analyze", "listing", trace_arg(), "--from", "99999999"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("past the trace's last step"),
        "{}",
        stderr(&out)
    );
    // The demo OS has no Linux tasks to filter by.
    let out = run(&["analyze", "stats", trace_arg(), "--pid", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("need a trace that names Linux tasks"),
        "{}",
        stderr(&out)
    );
    // A CPU the trace does not hold is a value that means nothing for it.
    let out = run(&["analyze", "listing", trace_arg(), "--cpu", "3"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("not CPU 3"), "{}", stderr(&out));
    // An output that cannot be made is 73, as the table says, for each
    // command that writes one.
    let unwritable = dir.path().join("no/such/dir/out");
    let unwritable = unwritable.to_str().unwrap();
    for command in [
        &["analyze", "report", trace_arg(), "-o", unwritable][..],
        &["analyze", "nest", trace_arg(), "-o", unwritable],
        &["analyze", "listing", trace_arg(), "-o", unwritable],
    ] {
        let out = run(command);
        assert_eq!(out.status.code(), Some(73), "{command:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("cannot create") && stderr(&out).contains("no/such/dir"),
            "{}",
            stderr(&out)
        );
    }
}

/// A trace analyzed where its kernel is not (a test machine's trace read
/// here, a kernel moved since): without symbols the analysis says none
/// were found for it and how to give them; given them with `--symbols`, it
/// says nothing of the kind (before: the same warning, symbols given or
/// not) and uses them.
#[test]
fn symbols_given_for_a_kernel_not_here_are_no_cause_for_a_warning() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (guest, trace) = mmio_traced_here(dir.path());
    let moved = dir.path().join("moved.elf");
    std::fs::rename(&guest, &moved).unwrap();
    let t = trace.to_str().unwrap();
    let out = run(&["analyze", "stats", "-q", t]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("no symbols found for"), "{err}");
    assert!(err.contains("--symbols FILE"), "{err}");
    let out = run(&[
        "analyze",
        "stats",
        "-q",
        "--json",
        "--symbols",
        moved.to_str().unwrap(),
        t,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let named = stats["routines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["name"].as_str().unwrap_or("0x").starts_with("0x"))
        .count();
    assert!(named > 0, "{}", stats["routines"]);
}
