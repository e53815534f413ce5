//! `analyze timeline` in Perfetto's protobuf format, decoded with
//! Perfetto's own message definitions (its Python package's
//! `perfetto_trace_pb2`, which scripts/test.sh installs), against the
//! trace-event JSON of the same trace: the same slices (name, start, end),
//! instants and tracks.

mod common;

use std::process::Command;

use common::{demo_trace, kvm_available, run, stderr};

/// Decodes a protobuf trace with Perfetto's definitions: JSON of its
/// slices (name, begin, end, in order of their begin), instants (name,
/// time), tracks (process, thread, counter counts) and packets.
const DECODE: &str = r#"
import json, sys
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
t = pb.Trace()
t.ParseFromString(open(sys.argv[1], 'rb').read())
names, open_, slices, instants = {}, {}, [], []
tracks = {'process': 0, 'thread': 0, 'counter': 0}
counters = 0
for p in t.packet:
    for n in p.interned_data.event_names:
        names[n.iid] = n.name
    if p.HasField('track_descriptor'):
        d = p.track_descriptor
        kind = 'thread' if d.HasField('thread') else 'process' if d.HasField('process') else 'counter'
        tracks[kind] += 1
    if not p.HasField('track_event'):
        continue
    e = p.track_event
    name = names.get(e.name_iid, e.name)
    if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
        open_.setdefault(e.track_uuid, []).append((name, p.timestamp))
    elif e.type == pb.TrackEvent.TYPE_SLICE_END:
        name, begin = open_[e.track_uuid].pop()
        slices.append([name, begin, p.timestamp])
    elif e.type == pb.TrackEvent.TYPE_INSTANT:
        instants.append([name, p.timestamp])
    elif e.type == pb.TrackEvent.TYPE_COUNTER:
        counters += 1
print(json.dumps({'slices': sorted(slices), 'instants': sorted(instants), 'tracks': tracks,
                  'counters': counters, 'packets': len(t.packet),
                  'unclosed': sum(len(v) for v in open_.values())}))
"#;

#[test]
fn the_protobuf_timeline_holds_what_the_json_one_does() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = demo_trace().to_str().unwrap();
    let pb = dir.path().join("t.pftrace");
    let json = dir.path().join("t.json");
    for out in [&pb, &json] {
        let o = run(&["analyze", "timeline", trace, "-o", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    // --format overrides the name.
    let forced = dir.path().join("t.out");
    let o = run(&[
        "analyze",
        "timeline",
        trace,
        "--format",
        "perfetto",
        "-o",
        forced.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&forced).unwrap(), std::fs::read(&pb).unwrap());

    let decoded = Command::new("python3")
        .args(["-c", DECODE])
        .arg(&pb)
        .output()
        .unwrap();
    assert!(
        decoded.status.success(),
        "Perfetto's definitions (scripts/test.sh installs them): {}",
        stderr(&decoded)
    );
    let got: serde_json::Value = serde_json::from_slice(&decoded.stdout).unwrap();

    let text = std::fs::read_to_string(&json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let ns = |us: &serde_json::Value| (us.as_f64().unwrap() * 1000.0).round() as u64;
    let mut slices: Vec<(String, u64, u64)> = events
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            let begin = ns(&e["ts"]);
            (
                e["name"].as_str().unwrap().to_string(),
                begin,
                begin + ns(&e["dur"]),
            )
        })
        .collect();
    slices.sort();
    let mut instants: Vec<(String, u64)> = events
        .iter()
        .filter(|e| e["ph"] == "i")
        .map(|e| (e["name"].as_str().unwrap().to_string(), ns(&e["ts"])))
        .collect();
    instants.sort();
    let meta = |name: &str| {
        events
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == name)
            .count()
    };

    let got_slices: Vec<(String, u64, u64)> =
        serde_json::from_value(got["slices"].clone()).unwrap();
    let got_instants: Vec<(String, u64)> = serde_json::from_value(got["instants"].clone()).unwrap();
    assert!(slices.len() > 100, "{}", slices.len());
    assert_eq!(got_slices, slices);
    assert_eq!(got_instants, instants);
    assert_eq!(got["unclosed"], 0);
    assert_eq!(got["tracks"]["process"], meta("process_name"));
    assert_eq!(got["tracks"]["thread"], meta("thread_name"));
    assert_eq!(got["tracks"]["counter"], 0);
    // Interned names keep the file smaller than the JSON.
    let (pb_len, json_len) = (std::fs::metadata(&pb).unwrap().len(), text.len() as u64);
    assert!(
        pb_len < json_len,
        "{pb_len} bytes of protobuf, {json_len} of JSON"
    );
}

/// Probe fires are instants on a track per probe, with their typed values
/// as the event's arguments, in both formats.
#[test]
fn probe_fires_are_instants_on_their_probes_tracks() {
    if !kvm_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("p.vtd");
    let d = disk.to_str().unwrap();
    let out = run(&[
        "run",
        "--no-input",
        "--trace",
        "--probe",
        "fnret:kprintf",
        "--probe",
        "fn:kprintf(arg1:string)",
        "--disk",
        d,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let counts = run(&["analyze", "probes", d, "--json"]);
    let counts: serde_json::Value = serde_json::from_slice(&counts.stdout).unwrap();
    let fired = |probe: &str| {
        counts["probes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["probe"] == probe)
            .unwrap()["count"]
            .as_u64()
            .unwrap()
    };
    let pb = dir.path().join("p.pftrace");
    let json = dir.path().join("p.json");
    for out in [&pb, &json] {
        let o = run(&["analyze", "timeline", d, "-o", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let decoded = Command::new("python3")
        .args(["-c", DECODE])
        .arg(&pb)
        .output()
        .unwrap();
    assert!(decoded.status.success(), "{}", stderr(&decoded));
    let got: serde_json::Value = serde_json::from_slice(&decoded.stdout).unwrap();
    let instants = got["instants"].as_array().unwrap();
    for probe in ["fn:kprintf", "fnret:kprintf"] {
        let n = instants.iter().filter(|i| i[0] == probe).count() as u64;
        assert_eq!(n, fired(probe), "{probe}");
    }
    let text = std::fs::read_to_string(&json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let first = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "fn:kprintf")
        .unwrap();
    assert_eq!(first["args"]["arg1"], "\"vtrace demo OS\\n\"", "{first}");
}
