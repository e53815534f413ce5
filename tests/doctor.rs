//! `vtrace doctor` on this host: its findings are the facts the rest of
//! the suite depends on where KVM is paravirtual.

mod common;

use common::*;

#[test]
fn doctor_reports_what_this_host_lets_a_tracer_see() {
    if !kvm_available() {
        return;
    }
    let o = run(&["doctor", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let d: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Every host the suite runs on steps kernel code.
    assert_eq!(d["kernel_stepping"]["works"], true, "{d}");
    assert_eq!(d["kernel_stepping"]["expected"], 1002, "{d}");
    assert!(d["step_rate"].as_f64() > Some(1000.0), "{d}");
    let names: Vec<&str> = d["instructions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"cmpxchg16b") && names.contains(&"int3"),
        "{d}"
    );
    if d["kind"] == "paravirtual" {
        // What the project's machines do (measured when they were set up):
        // kernel code emulated, user mode not intercepted, SYSCALL landing
        // at CPL 3, breakpoints exit, INT3 and CMPXCHG16B beyond the
        // emulator.
        assert_eq!(d["kernel_code_emulated"], true, "{d}");
        assert_eq!(d["user_stepping"]["works"], false, "{d}");
        assert_eq!(d["syscall_enters_kernel"], false, "{d}");
        assert_eq!(d["breakpoints_exit"], true, "{d}");
        // A data breakpoint on a store KVM's emulator made: no exit.
        assert_eq!(d["watchpoints_exit"], false, "{d}");
        let lacks = d["emulator_lacks"].as_array().unwrap();
        assert!(lacks.contains(&"int3".into()), "{d}");
        assert!(lacks.contains(&"cmpxchg16b".into()), "{d}");
        // What a stock Linux's first return to user mode runs here.
        assert!(lacks.contains(&"fnclex".into()), "{d}");
        let linux = d["trace_shows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["what"] == "a Linux kernel")
            .map(|r| r["verdict"].to_string())
            .unwrap_or_default();
        assert!(linux.contains("its user space cannot run"), "{linux}");
        assert!(
            linux.contains("FNCLEX") && linux.contains("CPL 3"),
            "{linux}"
        );
    } else {
        assert_eq!(d["user_stepping"]["works"], true, "{d}");
        assert_eq!(d["trap_flag_stepping"], true, "{d}");
        assert_eq!(d["syscall_enters_kernel"], true, "{d}");
    }

    let o = run(&["doctor"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for row in [
        "kernel code (CPL 0)",
        "user code (CPL 3)",
        "--start-at, --stop-at",
        "a Linux kernel",
    ] {
        assert!(text.contains(row), "{row}:\n{text}");
    }
}
