//! The gdb servers (`vtrace analyze gdb`, `vtrace run --gdb`) against what
//! a careless or hostile client sends, and the run's signals while gdb
//! holds the guest: each answered in bounded time and memory, nothing
//! lost.

mod common;

use std::path::Path;
use std::time::Duration;

use common::gdb::{gdb, run_with_gdb, serve, RawGdb};
use common::*;

/// Long enough for any answer on a loaded 2-core host; a server that takes
/// longer hangs.
const HANG: Duration = Duration::from_secs(120);

#[test]
fn watchpoints_over_any_range_are_answered_at_once() {
    if !kvm_available() {
        return;
    }
    let (mut server, address, said) = serve(demo_trace(), &[]);
    let mut raw = RawGdb::connect(&address);
    // A write watch longer than gdb can compare is refused, saying why.
    assert!(raw.ask("Z2,0,7fffffffffffffff").starts_with('E'));
    // An access watch over the whole address space stops at the first
    // access: the demo's first instruction that touches memory.
    assert_eq!(raw.ask("Z4,0,7fffffffffffffff"), "OK");
    let stop = raw.ask("vCont;c");
    assert!(
        stop.starts_with("T05") && stop.contains("awatch:"),
        "{stop}"
    );
    assert_eq!(raw.ask("z4,0,7fffffffffffffff"), "OK");
    // A read watch over the upper half, which the demo never touches,
    // searches the whole trace to its end.
    assert_eq!(raw.ask("Z3,ffff800000000000,7fffffffffff"), "OK");
    assert_eq!(raw.ask("vCont;c"), "T05replaylog:end;");
    assert_eq!(raw.ask("bc"), "T05replaylog:begin;");
    raw.send("k");
    assert!(ended_within(&mut server, HANG).success());
    assert!(said
        .join()
        .unwrap()
        .contains("use `awatch` (stops at every access, whatever its length)"),);

    // gdb itself: `watch` over a gigabyte cannot be inserted (before, gdb
    // resumed by itself at each of the trace's stores); `awatch` stops.
    let (mut server, address, _) = serve(demo_trace(), &[]);
    let said = gdb(
        &address,
        None,
        &[
            "watch -l *(char(*)[0x40000000])0x200000",
            "continue",
            "delete",
            "awatch -l *(char(*)[0x40000000])0x200000",
            "continue",
        ],
    );
    assert!(ended_within(&mut server, HANG).success(), "{said}");
    assert!(
        said.contains("Could not insert hardware watchpoint 1"),
        "{said}"
    );
    assert!(said.contains("Value = <unreadable>"), "{said}");
    assert!(said.contains(" in memset ("), "{said}");
}

/// `$` and then bytes with no `#`: 64 MiB offered.
fn pour_an_endless_packet(raw: &mut RawGdb) -> usize {
    assert!(raw.ask("?").starts_with('T'));
    raw.pour(b"$", 1) + raw.pour(&[b'a'; 1 << 16], 1024)
}

#[test]
fn a_packet_that_never_ends_is_cut_off() {
    if !kvm_available() {
        return;
    }
    let (mut server, address, said) = serve(demo_trace(), &[]);
    let mut raw = RawGdb::connect(&address);
    let taken = pour_an_endless_packet(&mut raw);
    // The server hung up: what it took is what the sockets buffer, not
    // the 64 MiB.
    assert!(taken < 32 << 20, "took {taken} bytes");
    let status = ended_within(&mut server, HANG);
    let said = said.join().unwrap();
    assert!(!status.success(), "{said}");
    assert!(said.contains("oversized packet"), "{said}");

    // Live, the connection goes and the guest runs on to its end.
    let (mut run, address, said) = run_with_gdb(&["--gdb-wait"]);
    let taken = pour_an_endless_packet(&mut RawGdb::connect(&address));
    assert!(taken < 32 << 20, "took {taken} bytes");
    let status = ended_within(&mut run, HANG);
    let said = said.join().unwrap();
    assert!(status.success(), "{said}");
    assert!(said.contains("oversized packet"), "{said}");
    assert!(said.contains("guest exited with status 0"), "{said}");
}

/// The kernel ELF a live run wrote for gdb, as it said.
fn symbols_file(said: &str) -> &Path {
    let line = said
        .lines()
        .find_map(|l| l.split("gdb loads the kernel's symbols from ").nth(1))
        .expect("the run says where gdb's symbols are");
    Path::new(line.split(" (").next().unwrap())
}

#[test]
fn a_signal_while_gdb_holds_the_guest_ends_the_run_with_its_trace() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("held.vtd");
    let control = dir.path().join("c.sock");
    let traced = |disk: &Path| {
        run_with_gdb(&[
            "--gdb-wait",
            "--trace",
            "--disk",
            disk.to_str().unwrap(),
            "--disk-size",
            "64M",
            "--control",
            control.to_str().unwrap(),
        ])
    };

    // Held by gdb after 200 single steps.
    let (mut run, address, said) = traced(&disk);
    let mut raw = RawGdb::connect(&address);
    for _ in 0..200 {
        // A live target has one thread: its stop replies say only the signal.
        assert_eq!(raw.ask("vCont;s"), "S05");
    }
    signal(&run, libc::SIGTERM);
    let status = ended_within(&mut run, HANG);
    let said = said.join().unwrap();
    assert_eq!(status.code(), Some(143), "{said}");
    assert!(said.contains("stopped by SIGTERM"), "{said}");
    let info = info_json(&disk);
    assert!(info["steps"].as_u64().unwrap() >= 200, "{info}");
    assert!(!control.exists(), "the control socket stayed");
    assert!(!symbols_file(&said).exists(), "gdb's ELF stayed");

    // Running under gdb's `continue`: gdb hears that the guest ended by
    // the signal (`X0f`, SIGTERM).
    let disk = dir.path().join("continued.vtd");
    let (mut run, address, said) = traced(&disk);
    let mut raw = RawGdb::connect(&address);
    raw.send("vCont;c");
    std::thread::sleep(Duration::from_millis(500));
    signal(&run, libc::SIGTERM);
    let stop = raw.reply().expect("a stop reply");
    let status = ended_within(&mut run, HANG);
    let said = said.join().unwrap();
    assert_eq!(status.code(), Some(143), "{said}");
    assert_eq!(stop, "X0f", "{said}");
    assert!(info_json(&disk)["steps"].as_u64().unwrap() > 0);
}

fn signal(child: &std::process::Child, signal: i32) {
    // SAFETY: kill on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

/// gdb's `disconnect` (or gdb gone) ends a session as `detach` does:
/// status 0, said, and a live guest runs on to its end.
#[test]
fn gdbs_disconnect_ends_a_session_as_detach_does() {
    if !kvm_available() {
        return;
    }
    let (mut server, address, said) = serve(demo_trace(), &[]);
    gdb(&address, None, &["stepi", "disconnect"]);
    assert!(ended_within(&mut server, HANG).success());
    assert!(said.join().unwrap().contains("vtrace: gdb disconnected"));

    let (mut run, address, said) = run_with_gdb(&["--gdb-wait"]);
    gdb(&address, None, &["stepi", "disconnect"]);
    assert!(ended_within(&mut run, HANG).success());
    let said = said.join().unwrap();
    assert!(said.contains("vtrace: gdb disconnected"), "{said}");
    assert!(said.contains("guest exited with status 0"), "{said}");
}

/// A run's gdb Unix socket goes with the run, so the next run can make it
/// again.
#[test]
fn a_runs_gdb_socket_goes_with_it() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("gdb.sock");
    for _ in 0..2 {
        let out = run(&["run", "--no-input", "-q", "--gdb", socket.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(!socket.exists(), "the gdb socket stayed");
    }
}

/// A gdb port off loopback is said to serve the guest to the network.
#[test]
fn a_gdb_port_open_to_the_network_is_warned_of() {
    if !kvm_available() {
        return;
    }
    let out = run(&["run", "--no-input", "-q", "--gdb", "0.0.0.0:0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("gdb's port is open to other machines (0.0.0.0)"),
        "{}",
        stderr(&out)
    );
    let out = run(&["run", "--no-input", "-q", "--gdb", "127.0.0.1:0"]);
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
}
