//! `vtrace analyze gdb`'s server against what a client sends: the input is
//! the byte stream from gdb (acks, packets, interrupts, garbage), served
//! over the demo's first 3,000 steps until it ends. Any packet may come,
//! in any order; every one must be answered or refused, in bounded time
//! and memory (packets over the server's buffer end the session).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vtrace_analyzer::{Replay, Trace};
use vtrace_gdb::{serve_trace_bytes, TraceTarget};

#[path = "disk_file.rs"]
mod disk_file;

/// A real trace: the analysis targets' seed.
const TRACE: &[u8] = include_bytes!("../seeds/analysis/demo-3000.vtd");

fuzz_target!(|data: &[u8]| {
    let path = disk_file::write(TRACE).expect("write the trace");
    let trace = Trace::open(path).expect("the seed trace opens");
    let replay = Replay::open(trace, Vec::new(), &|_, _| {}).expect("the seed trace replays");
    let at = replay.first().expect("the seed trace has steps");
    let mut target = TraceTarget::new(replay, at);
    let _ = serve_trace_bytes(&mut target, data);
});
