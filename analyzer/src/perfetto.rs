//! The timeline in Perfetto's own protobuf trace format, which the
//! Perfetto UI and trace processor read far faster and smaller than
//! trace-event JSON. The messages are the subset of
//! `protos/perfetto/trace/perfetto_trace.proto` a timeline needs, field
//! numbers as there, encoded by prost; the file is a `Trace`, written a
//! packet at a time (a `Trace` of one packet, concatenated: protobuf
//! merges repeated fields).
//!
//! Tracks: a process track per Perfetto process (its pid), a thread track
//! per thread under it, a counter track per counter. Slices are
//! `TYPE_SLICE_BEGIN`/`TYPE_SLICE_END` pairs written when the call ends
//! (the trace processor sorts by time); their names are interned once per
//! name (`EventName`), so a routine called a million times costs its name
//! once.

use std::io::Write;

use prost::Message;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::timeline_out::{Arg, Instant, Slice, TimelineOut};

/// `Trace`: the file.
#[derive(Clone, PartialEq, Message)]
struct Trace {
    #[prost(message, repeated, tag = "1")]
    packet: Vec<TracePacket>,
}

/// `TracePacket`: one record of the trace.
#[derive(Clone, PartialEq, Message)]
struct TracePacket {
    #[prost(uint64, optional, tag = "8")]
    timestamp: Option<u64>,
    #[prost(uint32, optional, tag = "10")]
    trusted_packet_sequence_id: Option<u32>,
    #[prost(message, optional, tag = "11")]
    track_event: Option<TrackEvent>,
    #[prost(message, optional, tag = "12")]
    interned_data: Option<InternedData>,
    #[prost(uint32, optional, tag = "13")]
    sequence_flags: Option<u32>,
    #[prost(message, optional, tag = "60")]
    track_descriptor: Option<TrackDescriptor>,
}

/// `TrackDescriptor`: a track, its parent and what it belongs to.
#[derive(Clone, PartialEq, Message)]
struct TrackDescriptor {
    #[prost(uint64, optional, tag = "1")]
    uuid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    name: Option<String>,
    #[prost(message, optional, tag = "3")]
    process: Option<ProcessDescriptor>,
    #[prost(message, optional, tag = "4")]
    thread: Option<ThreadDescriptor>,
    #[prost(uint64, optional, tag = "5")]
    parent_uuid: Option<u64>,
    #[prost(message, optional, tag = "8")]
    counter: Option<CounterDescriptor>,
}

/// `ProcessDescriptor`.
#[derive(Clone, PartialEq, Message)]
struct ProcessDescriptor {
    #[prost(int32, optional, tag = "1")]
    pid: Option<i32>,
    #[prost(string, optional, tag = "6")]
    process_name: Option<String>,
}

/// `ThreadDescriptor`.
#[derive(Clone, PartialEq, Message)]
struct ThreadDescriptor {
    #[prost(int32, optional, tag = "1")]
    pid: Option<i32>,
    #[prost(int32, optional, tag = "2")]
    tid: Option<i32>,
    #[prost(string, optional, tag = "5")]
    thread_name: Option<String>,
}

/// `CounterDescriptor` (empty: a plain counter).
#[derive(Clone, PartialEq, Message)]
struct CounterDescriptor {}

/// `TrackEvent`: a slice's begin or end, an instant, a counter value.
#[derive(Clone, PartialEq, Message)]
struct TrackEvent {
    #[prost(message, repeated, tag = "4")]
    debug_annotations: Vec<DebugAnnotation>,
    #[prost(int32, optional, tag = "9")]
    r#type: Option<i32>,
    #[prost(uint64, optional, tag = "10")]
    name_iid: Option<u64>,
    #[prost(uint64, optional, tag = "11")]
    track_uuid: Option<u64>,
    #[prost(string, repeated, tag = "22")]
    categories: Vec<String>,
    #[prost(string, optional, tag = "23")]
    name: Option<String>,
    #[prost(double, optional, tag = "44")]
    double_counter_value: Option<f64>,
}

/// `DebugAnnotation`: a named argument of an event.
#[derive(Clone, PartialEq, Message)]
struct DebugAnnotation {
    #[prost(uint64, optional, tag = "1")]
    name_iid: Option<u64>,
    #[prost(uint64, optional, tag = "3")]
    uint_value: Option<u64>,
    #[prost(string, optional, tag = "6")]
    string_value: Option<String>,
    #[prost(string, optional, tag = "10")]
    name: Option<String>,
}

/// `InternedData`: names given once, referred to by id.
#[derive(Clone, PartialEq, Message)]
struct InternedData {
    #[prost(message, repeated, tag = "2")]
    event_names: Vec<EventName>,
    #[prost(message, repeated, tag = "3")]
    debug_annotation_names: Vec<DebugAnnotationName>,
}

/// `DebugAnnotationName`.
#[derive(Clone, PartialEq, Message)]
struct DebugAnnotationName {
    #[prost(uint64, optional, tag = "1")]
    iid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    name: Option<String>,
}

/// `EventName`.
#[derive(Clone, PartialEq, Message)]
struct EventName {
    #[prost(uint64, optional, tag = "1")]
    iid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    name: Option<String>,
}

/// `TrackEvent.Type`.
const SLICE_BEGIN: i32 = 1;
const SLICE_END: i32 = 2;
const INSTANT: i32 = 3;
const COUNTER: i32 = 4;

/// `TracePacket.SequenceFlags`.
const INCREMENTAL_STATE_CLEARED: u32 = 1;
const NEEDS_INCREMENTAL_STATE: u32 = 2;

/// The one packet sequence this writer makes.
const SEQUENCE: u32 = 1;

/// Writes the timeline as a Perfetto protobuf trace.
pub(crate) struct ProtoOut<W: Write> {
    out: W,
    /// Tracks described so far, by uuid.
    tracks: FxHashSet<u64>,
    /// Interned event names.
    names: FxHashMap<String, u64>,
    /// Interned argument names.
    arg_names: FxHashMap<String, u64>,
    /// Whether the first packet (which clears the sequence's state) is
    /// written.
    started: bool,
}

impl<W: Write> ProtoOut<W> {
    /// A writer to `out`.
    pub(crate) fn new(out: W) -> Self {
        ProtoOut {
            out,
            tracks: FxHashSet::default(),
            names: FxHashMap::default(),
            arg_names: FxHashMap::default(),
            started: false,
        }
    }

    fn packet(&mut self, mut packet: TracePacket) -> std::io::Result<()> {
        packet.trusted_packet_sequence_id = Some(SEQUENCE);
        if !self.started {
            self.started = true;
            packet.sequence_flags =
                Some(packet.sequence_flags.unwrap_or(0) | INCREMENTAL_STATE_CLEARED);
        }
        let trace = Trace {
            packet: vec![packet],
        };
        self.out.write_all(&trace.encode_to_vec())
    }

    fn process_uuid(pid: u32) -> u64 {
        u64::from(pid) << 32
    }

    fn thread_uuid(pid: u32, tid: u32) -> u64 {
        (u64::from(pid) << 32) | u64::from(tid).saturating_add(1)
    }

    /// Describes the process track of `pid` (named where `name` is).
    fn describe_process(&mut self, pid: u32, name: Option<&str>) -> std::io::Result<u64> {
        let uuid = Self::process_uuid(pid);
        if name.is_none() && self.tracks.contains(&uuid) {
            return Ok(uuid);
        }
        self.tracks.insert(uuid);
        self.packet(TracePacket {
            track_descriptor: Some(TrackDescriptor {
                uuid: Some(uuid),
                process: Some(ProcessDescriptor {
                    pid: Some(pid as i32),
                    process_name: name.map(str::to_string),
                }),
                ..Default::default()
            }),
            ..Default::default()
        })?;
        Ok(uuid)
    }

    /// Describes the thread track of `tid` in `pid`.
    fn describe_thread(&mut self, pid: u32, tid: u32, name: Option<&str>) -> std::io::Result<u64> {
        let uuid = Self::thread_uuid(pid, tid);
        if name.is_none() && self.tracks.contains(&uuid) {
            return Ok(uuid);
        }
        self.describe_process(pid, None)?;
        self.tracks.insert(uuid);
        // The uuid comes from (pid, tid): a thread number that stands in
        // several processes (an address space's track 1 beside Linux's
        // init) still makes a track of its own.
        self.packet(TracePacket {
            track_descriptor: Some(TrackDescriptor {
                uuid: Some(uuid),
                parent_uuid: Some(Self::process_uuid(pid)),
                thread: Some(ThreadDescriptor {
                    pid: Some(pid as i32),
                    tid: Some(tid as i32),
                    thread_name: name.map(str::to_string),
                }),
                ..Default::default()
            }),
            ..Default::default()
        })?;
        Ok(uuid)
    }

    /// The interned id of event name `name`, added to `data` where this
    /// is its first use.
    fn intern(&mut self, name: &str, data: &mut InternedData) -> u64 {
        if let Some(iid) = self.names.get(name) {
            return *iid;
        }
        let iid = self.names.len() as u64 + 1;
        self.names.insert(name.to_string(), iid);
        data.event_names.push(EventName {
            iid: Some(iid),
            name: Some(name.to_string()),
        });
        iid
    }

    /// The interned id of argument name `name`, as [`Self::intern`].
    fn intern_arg(&mut self, name: &str, data: &mut InternedData) -> u64 {
        if let Some(iid) = self.arg_names.get(name) {
            return *iid;
        }
        let iid = self.arg_names.len() as u64 + 1;
        self.arg_names.insert(name.to_string(), iid);
        data.debug_annotation_names.push(DebugAnnotationName {
            iid: Some(iid),
            name: Some(name.to_string()),
        });
        iid
    }

    fn event(
        &mut self,
        ts: u64,
        track: u64,
        kind: i32,
        name: Option<&str>,
        cat: Option<&str>,
        args: &[(&str, Arg<'_>)],
    ) -> std::io::Result<()> {
        let mut interned = InternedData::default();
        let name_iid = name.map(|n| self.intern(n, &mut interned));
        let debug_annotations = args
            .iter()
            .map(|(key, value)| DebugAnnotation {
                name_iid: Some(self.intern_arg(key, &mut interned)),
                name: None,
                uint_value: match value {
                    Arg::U64(v) => Some(*v),
                    Arg::Text(_) => None,
                },
                string_value: match value {
                    Arg::Text(t) => Some(t.to_string()),
                    Arg::U64(_) => None,
                },
            })
            .collect();
        self.packet(TracePacket {
            timestamp: Some(ts),
            sequence_flags: Some(NEEDS_INCREMENTAL_STATE),
            interned_data: (interned != InternedData::default()).then_some(interned),
            track_event: Some(TrackEvent {
                r#type: Some(kind),
                track_uuid: Some(track),
                name_iid,
                categories: cat.map(|c| vec![c.to_string()]).unwrap_or_default(),
                debug_annotations,
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

impl<W: Write> TimelineOut for ProtoOut<W> {
    fn process(&mut self, pid: u32, name: &str) -> std::io::Result<()> {
        self.describe_process(pid, Some(name)).map(|_| ())
    }

    fn thread(&mut self, pid: u32, tid: u32, name: &str) -> std::io::Result<()> {
        self.describe_thread(pid, tid, Some(name)).map(|_| ())
    }

    fn slice(&mut self, s: &Slice<'_>) -> std::io::Result<()> {
        let track = self.describe_thread(s.pid, s.tid, None)?;
        self.event(
            s.ts_ns,
            track,
            SLICE_BEGIN,
            Some(s.name),
            Some(s.cat),
            s.args,
        )?;
        let end = s.ts_ns.saturating_add(s.dur_ns);
        self.event(end, track, SLICE_END, None, None, &[])
    }

    fn instant(&mut self, i: &Instant<'_>) -> std::io::Result<()> {
        let track = match i.global {
            true => self.describe_process(i.pid, None)?,
            false => self.describe_thread(i.pid, i.tid, None)?,
        };
        self.event(i.ts_ns, track, INSTANT, Some(i.name), Some(i.cat), i.args)
    }

    fn counter(
        &mut self,
        pid: u32,
        name: &str,
        _key: &str,
        ts_ns: u64,
        value: f64,
    ) -> std::io::Result<()> {
        // A counter track per (process, name), under the process.
        let parent = self.describe_process(pid, None)?;
        let uuid = parent | (1 << 31) | (fxhash(name) & 0x7fff_ffff);
        if self.tracks.insert(uuid) {
            self.packet(TracePacket {
                track_descriptor: Some(TrackDescriptor {
                    uuid: Some(uuid),
                    parent_uuid: Some(parent),
                    name: Some(name.to_string()),
                    counter: Some(CounterDescriptor {}),
                    ..Default::default()
                }),
                ..Default::default()
            })?;
        }
        self.packet(TracePacket {
            timestamp: Some(ts_ns),
            track_event: Some(TrackEvent {
                r#type: Some(COUNTER),
                track_uuid: Some(uuid),
                double_counter_value: Some(value),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn finish(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// A stable hash of a counter's name, for its track's id.
fn fxhash(name: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    name.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_is_a_begin_and_an_end_with_its_name_interned_once() {
        let mut bytes = Vec::new();
        let mut out = ProtoOut::new(&mut bytes);
        let slice = |ts| Slice {
            pid: 7,
            tid: 8,
            name: "schedule",
            cat: "routine",
            ts_ns: ts,
            dur_ns: 5,
            args: &[("first step", Arg::U64(3))],
        };
        out.thread(7, 8, "init").unwrap();
        out.slice(&slice(10)).unwrap();
        out.slice(&slice(20)).unwrap();
        out.counter(7, "runnable tasks", "runnable", 30, 2.0)
            .unwrap();
        out.finish().unwrap();
        let trace = Trace::decode(&bytes[..]).unwrap();
        let events: Vec<&TrackEvent> = trace
            .packet
            .iter()
            .filter_map(|p| p.track_event.as_ref())
            .collect();
        let kinds: Vec<i32> = events.iter().filter_map(|e| e.r#type).collect();
        assert_eq!(
            kinds,
            [SLICE_BEGIN, SLICE_END, SLICE_BEGIN, SLICE_END, COUNTER]
        );
        let interned: Vec<&EventName> = trace
            .packet
            .iter()
            .filter_map(|p| p.interned_data.as_ref())
            .flat_map(|d| &d.event_names)
            .collect();
        assert_eq!(interned.len(), 1);
        assert_eq!(interned[0].name.as_deref(), Some("schedule"));
        assert_eq!(
            trace.packet[0].sequence_flags,
            Some(INCREMENTAL_STATE_CLEARED)
        );
        let ends: Vec<u64> = trace
            .packet
            .iter()
            .filter(|p| p.track_event.as_ref().and_then(|e| e.r#type) == Some(SLICE_END))
            .filter_map(|p| p.timestamp)
            .collect();
        assert_eq!(ends, [15, 25]);
    }
}
