//! Where a timeline's events go ([`TimelineOut`]): Chrome's trace-event
//! JSON here ([`JsonOut`]), Perfetto's protobuf in `perfetto.rs`. The
//! timeline says what happened; these say how it is written.

use std::io::Write;

/// An event's argument.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg<'a> {
    /// A number.
    U64(u64),
    /// Text.
    Text(&'a str),
}

/// A span of time on a thread track: a routine call, a task on a CPU.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slice<'a> {
    pub(crate) pid: u32,
    pub(crate) tid: u32,
    pub(crate) name: &'a str,
    pub(crate) cat: &'static str,
    pub(crate) ts_ns: u64,
    pub(crate) dur_ns: u64,
    pub(crate) args: &'a [(&'a str, Arg<'a>)],
}

/// A moment: an interrupt, a system call, a mark.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Instant<'a> {
    pub(crate) pid: u32,
    pub(crate) tid: u32,
    pub(crate) name: &'a str,
    pub(crate) cat: &'static str,
    pub(crate) ts_ns: u64,
    /// On the process's track rather than the thread's.
    pub(crate) global: bool,
    pub(crate) args: &'a [(&'a str, Arg<'a>)],
}

/// Where the timeline goes: trace-event JSON, or Perfetto's protobuf.
pub(crate) trait TimelineOut {
    /// Names process `pid`.
    fn process(&mut self, pid: u32, name: &str) -> std::io::Result<()>;
    /// Names thread `tid` of `pid`.
    fn thread(&mut self, pid: u32, tid: u32, name: &str) -> std::io::Result<()>;
    /// A span.
    fn slice(&mut self, s: &Slice<'_>) -> std::io::Result<()>;
    /// A moment.
    fn instant(&mut self, i: &Instant<'_>) -> std::io::Result<()>;
    /// Counter `name` of process `pid` (its value called `key`) is
    /// `value` from `ts_ns` on.
    fn counter(
        &mut self,
        pid: u32,
        name: &str,
        key: &str,
        ts_ns: u64,
        value: f64,
    ) -> std::io::Result<()>;
    /// Ends the file.
    fn finish(&mut self) -> std::io::Result<()>;
}

/// Trace-event JSON ("Chrome JSON"): one object an event, times in µs.
pub(crate) struct JsonOut<W: Write> {
    pub(crate) out: W,
    pub(crate) events: u64,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn json_args(args: &[(&str, Arg<'_>)]) -> serde_json::Value {
    let map: serde_json::Map<String, serde_json::Value> = args
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Arg::U64(n) => serde_json::Value::from(*n),
                Arg::Text(t) => serde_json::Value::from(*t),
            };
            (k.to_string(), v)
        })
        .collect();
    serde_json::Value::Object(map)
}

impl<W: Write> JsonOut<W> {
    fn emit(&mut self, event: &serde_json::Value) -> std::io::Result<()> {
        let sep: &[u8] = if self.events == 0 { b"\n" } else { b",\n" };
        self.out.write_all(sep)?;
        serde_json::to_writer(&mut self.out, event)?;
        self.events += 1;
        Ok(())
    }
}

impl<W: Write> TimelineOut for JsonOut<W> {
    fn process(&mut self, pid: u32, name: &str) -> std::io::Result<()> {
        self.emit(&serde_json::json!({
            "ph": "M", "name": "process_name", "pid": pid, "args": { "name": name }
        }))
    }

    fn thread(&mut self, pid: u32, tid: u32, name: &str) -> std::io::Result<()> {
        self.emit(&serde_json::json!({
            "ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": { "name": name }
        }))
    }

    fn slice(&mut self, s: &Slice<'_>) -> std::io::Result<()> {
        self.emit(&serde_json::json!({
            "name": s.name, "cat": s.cat, "ph": "X", "ts": us(s.ts_ns), "dur": us(s.dur_ns),
            "pid": s.pid, "tid": s.tid, "args": json_args(s.args)
        }))
    }

    fn instant(&mut self, i: &Instant<'_>) -> std::io::Result<()> {
        self.emit(&serde_json::json!({
            "name": i.name, "cat": i.cat, "ph": "i", "s": if i.global { "g" } else { "t" },
            "ts": us(i.ts_ns), "pid": i.pid, "tid": i.tid, "args": json_args(i.args)
        }))
    }

    fn counter(
        &mut self,
        pid: u32,
        name: &str,
        key: &str,
        ts_ns: u64,
        value: f64,
    ) -> std::io::Result<()> {
        // A whole number (a count, an integer variable) stays one: JSON
        // readers take `2.0` as a float.
        let value = match value.fract() == 0.0 && value.abs() < 9.0e15 {
            true => serde_json::Value::from(value as i64),
            false => serde_json::Value::from(value),
        };
        self.emit(&serde_json::json!({
            "name": name, "ph": "C", "ts": us(ts_ns), "pid": pid, "args": { key: value }
        }))
    }

    fn finish(&mut self) -> std::io::Result<()> {
        writeln!(self.out, "\n]}}")
    }
}
