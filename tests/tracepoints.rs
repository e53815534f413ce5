//! The kernel's own tracepoints: listed from Debian's kernel image (its
//! kallsyms, jump table, event data and BTF), and refused with a reason
//! where a `tp:` probe names none. `run_linux.rs` fires
//! `tp:sched:sched_switch` on a booting Linux and checks each fire
//! against the tasks the trace shows switching.

mod common;

use common::*;

/// `vtrace probes list --kernel KERNEL ARGS... --json`.
fn listing(args: &[&str]) -> serde_json::Value {
    let kernel = test_kernel();
    let mut all = vec![
        "probes",
        "list",
        "--kernel",
        kernel.to_str().unwrap(),
        "--json",
    ];
    all.extend_from_slice(args);
    let out = run(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `vtrace analyze symbolize` of a listed site, with `kernel`'s symbols.
fn symbolize(kernel: &std::path::Path, site: &serde_json::Value) -> std::process::Output {
    run(&[
        "analyze",
        "symbolize",
        "--symbols",
        kernel.to_str().unwrap(),
        site.as_str().unwrap(),
    ])
}

/// A listed tracepoint's parameters: (name, type).
fn parameters(t: &serde_json::Value) -> Vec<(&str, &str)> {
    t["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["type"].as_str().unwrap()))
        .collect()
}

/// sched_switch as include/trace/events/sched.h of Linux 6.1 declares
/// it: `TP_PROTO(bool preempt, struct task_struct *prev, struct
/// task_struct *next, unsigned int prev_state)`, and its record's fields
/// (`__array(char, prev_comm, TASK_COMM_LEN)`, `__field(pid_t,
/// prev_pid)`, ...), the comm and pid ones assigned from the tasks
/// (`memcpy(__entry->prev_comm, prev->comm, ...)`, `__entry->prev_pid =
/// prev->pid`); its one site is in `__schedule`.
#[test]
fn tracepoints_are_listed_with_parameters_fields_and_sites() {
    let all = listing(&[]);
    let tps: Vec<&serde_json::Value> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["probe"].as_str().unwrap().starts_with("tp:"))
        .collect();
    // Debian's cloud kernel has several hundred (693 in 6.1.0-56).
    assert!(tps.len() > 300, "{}", tps.len());
    let names: Vec<&str> = tps.iter().map(|t| t["probe"].as_str().unwrap()).collect();
    for expected in [
        "tp:sched:sched_switch",
        "tp:irq:irq_handler_entry",
        "tp:raw_syscalls:sys_enter",
        "tp:sched:sched_process_fork",
    ] {
        assert!(names.contains(&expected), "{expected}: {names:?}");
    }

    let switch = listing(&["tp:sched:sched_switch"]);
    let switch = &switch[0];
    assert_eq!(
        parameters(switch),
        [
            ("preempt", "bool"),
            ("prev", "struct task_struct *"),
            ("next", "struct task_struct *"),
            ("prev_state", "unsigned int")
        ]
    );
    let field = |name: &str| {
        switch["fields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("{name}: {switch}"))
            .clone()
    };
    assert_eq!(field("prev_comm")["from"], "prev->comm");
    assert_eq!(field("next_pid")["from"], "next->pid");
    assert_eq!(field("prev_pid")["type"], "pid_t");
    assert_eq!(switch["site_states"], serde_json::json!(["fires"]));
    assert_eq!(switch["gated"], false);
    // kernel/entry/common.c calls trace_sys_enter() only for a task whose
    // syscall work has SYSCALL_WORK_SYSCALL_TRACEPOINT, which the
    // tracepoint's regfunc sets when a probe registers.
    let enter = listing(&["tp:raw_syscalls:sys_enter"]);
    assert_eq!(enter[0]["gated"], true, "{enter}");

    // The site, symbolized with the kernel's own symbols.
    let kernel = test_kernel();
    let out = symbolize(&kernel, &switch["sites"][0]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("__schedule+"), "{}", stdout(&out));

    // A pattern shows each in full, in words.
    let kernel = test_kernel();
    let text = stdout(&run(&[
        "probes",
        "list",
        "--kernel",
        kernel.to_str().unwrap(),
        "tp:sched:sched_switch",
    ]));
    assert!(
        text.contains("char[TASK_COMM_LEN] prev_comm (read from prev->comm)"),
        "{text}"
    );
    assert!(text.contains("fires"), "{text}");

    // The system call events, which the kernel makes from the gated
    // raw_syscalls:*, fire at the call's own routine, with the arguments
    // of fs/open.c's `SYSCALL_DEFINE4(openat, int, dfd, const char __user
    // *, filename, int, flags, umode_t, mode)`, tracefs's fields.
    let both = listing(&["tp:syscalls:sys_e*_openat"]);
    let (enter, exit) = (&both[0], &both[1]);
    assert_eq!(enter["probe"], "tp:syscalls:sys_enter_openat", "{both}");
    assert_eq!(
        parameters(enter),
        [
            ("dfd", "int"),
            ("filename", "const char *"),
            ("flags", "int"),
            ("mode", "umode_t")
        ]
    );
    let names = |t: &serde_json::Value| -> Vec<String> {
        t["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(enter),
        ["__syscall_nr", "dfd", "filename", "flags", "mode"]
    );
    assert_eq!(enter["fires_at"], "syscall_entry");
    assert_eq!(names(exit), ["__syscall_nr", "ret"]);
    // openat is system call 257 on x86-64 (asm/unistd_64.h); the entry
    // reads it from the saved registers, the return knows it from the
    // table the kernel dispatches through.
    assert_eq!(
        exit["fields"][0]["from"], "its index in sys_call_table: 257",
        "{exit}"
    );
    assert_eq!(exit["fires_at"], "syscall_return");
    assert_eq!(enter["sites"], exit["sites"]);
    let out = symbolize(&kernel, &enter["sites"][0]);
    assert_eq!(
        stdout(&out).split_whitespace().nth(1),
        Some("__x64_sys_openat")
    );
}

/// A `tp:` probe that names no tracepoint, or one without its system, or
/// asks values of a glob, of a field its parameters lack, or of a
/// system call's return, is refused
/// before the guest boots, saying what to write instead.
#[test]
fn tracepoint_probes_that_name_nothing_are_refused() {
    if !kvm_available() {
        return;
    }
    let kernel = test_kernel();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("no.vtd");
    let refused = |probe: &str, says: &str| {
        let out = run(&[
            "run",
            "--no-input",
            "--trace",
            "--kernel",
            kernel.to_str().unwrap(),
            "--disk",
            disk.to_str().unwrap(),
            "--probe",
            probe,
        ]);
        assert_eq!(out.status.code(), Some(2), "{probe}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{probe}: {}", stderr(&out));
        assert!(!disk.exists(), "{probe}: a refused run leaves no disk");
    };
    refused("tp:sched_switch", "with its system: tp:sched:sched_switch");
    refused("tp:sched:no_such_tp", "matches none of the");
    refused("tp:sched:sched_sw*(prev->comm)", "names one tracepoint");
    refused("tp:sched:sched_switch(prev->nothing)", "no field nothing");
    refused("tp:sched:sched_switch(other)", "has no parameter other");
    refused(
        "tp:raw_syscalls:sys_enter",
        "only while a probe is registered in the guest",
    );
    refused(
        "tp:syscalls:sys_enter_openat(path)",
        "has no field path (it has: __syscall_nr, dfd, filename, flags, mode)",
    );
    refused(
        "tp:syscalls:sys_enter_openat(filename->x)",
        "not followed (`->`)",
    );
    refused(
        "tp:syscalls:sys_exit_openat(ret)",
        "a return event reads no values",
    );
    // The demo OS has no kallsyms to find tracepoints by.
    let out = run(&[
        "run",
        "--no-input",
        "--trace",
        "--probe",
        "tp:sched:sched_switch",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("kallsyms"), "{}", stderr(&out));
}
