//! Records through the recorder, the writer thread and the disk, and back
//! through the reader: order, wrap, fullness, damage and digests.

use std::os::unix::fs::FileExt;
use std::path::Path;

use vtrace_storage::{
    summarize, CpuMode, Event, InsnBytes, Record, Recorder, Regs, Step, TraceReader, TraceReason,
};
use vtrace_storage::{DiskWriter, SUPERBLOCK_LEN};

/// A deterministic pseudo-program: loops with changing registers and the
/// occasional event, so chunks compress like real traces (not perfectly).
fn records(n: u64) -> Vec<Record> {
    let mut out = vec![Record::Event(Event::TraceStart(TraceReason::CommandLine))];
    let mut x = 0x1234_5678u64;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut regs = Regs::default();
        regs.gpr[0] = i;
        regs.gpr[1] = x & 0xffff;
        regs.rflags = 0x202;
        out.push(Record::Step(Step {
            pc: 0x1000 + (i % 50) * 3,
            bytes: InsnBytes::new(&[0x48, 0x01, (i % 50) as u8]).unwrap(),
            cr3: 0x9000,
            mode: CpuMode::Long64,
            cpl: 0,
            regs,
        }));
        if i % 1000 == 999 {
            out.push(Record::Event(Event::Interrupt {
                vector: 32,
                error_code: None,
                source: vtrace_storage::InterruptSource::Injected,
            }));
        }
    }
    out.push(Record::Event(Event::TraceStop(TraceReason::GuestExit)));
    out
}

fn write(
    path: &Path,
    size: u64,
    slot: u32,
    wrap: bool,
    recs: &[Record],
) -> vtrace_storage::WriterReport {
    let disk = DiskWriter::create(path, size, slot, wrap, "test: synthetic").unwrap();
    let mut rec = Recorder::start(disk);
    for r in recs {
        rec.record(r);
    }
    rec.finish().unwrap()
}

fn read_all(path: &Path) -> Vec<Record> {
    let reader = TraceReader::open(path).unwrap();
    (0..reader.segments().len())
        .flat_map(|i| reader.decode(i).unwrap())
        .collect()
}

#[test]
fn round_trip_through_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.vtd");
    let recs = records(200_000);
    let report = write(&path, 64 << 20, 64 << 10, false, &recs);
    assert!(report.segments > 3, "several segments: {report:?}");
    assert_eq!(report.dropped_chunks, 0);
    assert_eq!(read_all(&path), recs);

    let reader = TraceReader::open(&path).unwrap();
    let s = summarize(&reader, |_, _| {});
    assert_eq!(s.steps, 200_000);
    assert_eq!(s.events["interrupt"], 200);
    assert!(s.clean_end && s.problems.is_empty(), "{:?}", s.problems);
    assert_eq!(s.stop_reason(), Some(&TraceReason::GuestExit));
    assert!(
        s.bytes_per_step() < 4.0,
        "{} bytes per step",
        s.bytes_per_step()
    );
    assert_eq!(s.metadata, "test: synthetic");
}

#[test]
fn digest_ignores_segmentation() {
    let dir = tempfile::tempdir().unwrap();
    let recs = records(50_000);
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    write(&a, 16 << 20, 16 << 10, false, &recs);
    write(&b, 16 << 20, 256 << 10, false, &recs);
    let digest = |p: &Path| summarize(&TraceReader::open(p).unwrap(), |_, _| {}).digest;
    assert_eq!(digest(&a), digest(&b));
    let mut other = recs.clone();
    other.insert(10, Record::Event(Event::Mark { id: 1, value: 2 }));
    let c = dir.path().join("c");
    write(&c, 16 << 20, 16 << 10, false, &other);
    assert_ne!(digest(&a), digest(&c));
}

/// `records(n)` with a task switch every 7,000 steps and a rename.
fn records_with_tasks(n: u64) -> Vec<Record> {
    let mut out = Vec::new();
    let mut steps = 0u64;
    for r in records(n) {
        if matches!(r, Record::Step(_)) {
            if steps % 7000 == 100 {
                let tid = 1 + (steps / 7000) as u32 % 3;
                out.push(Record::Event(Event::Task {
                    tid,
                    pid: tid,
                    comm: format!("task{tid}"),
                }));
            }
            if steps == 3000 {
                out.push(Record::Event(Event::TaskName {
                    tid: 1,
                    comm: "renamed".into(),
                }));
            }
            steps += 1;
        }
        out.push(r);
    }
    out
}

#[test]
fn every_segment_names_the_task_it_begins_in() {
    let dir = tempfile::tempdir().unwrap();
    let recs = records_with_tasks(60_000);
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    write(&a, 16 << 20, 16 << 10, false, &recs);
    write(&b, 16 << 20, 64 << 10, false, &recs);

    let reader = TraceReader::open(&a).unwrap();
    assert!(reader.segments().len() > 4);
    let mut running: Option<(u32, String)> = None;
    let mut without = Vec::new();
    for i in 0..reader.segments().len() {
        let segment = reader.decode(i).unwrap();
        match (&segment[0], &running) {
            (Record::Event(Event::Running { tid, pid, comm }), Some((t, c))) => {
                assert_eq!((tid, pid, comm), (t, t, c), "segment {i}");
            }
            (first, None) => assert!(
                !matches!(first, Record::Event(Event::Running { .. })),
                "segment {i} names a task before any was named"
            ),
            (first, Some(_)) => panic!("segment {i} begins with {first:?}"),
        }
        for r in segment {
            match &r {
                Record::Event(Event::Running { .. }) => continue,
                Record::Event(Event::Task { tid, comm, .. }) => {
                    running = Some((*tid, comm.clone()))
                }
                Record::Event(Event::TaskName { tid, comm }) => {
                    if let Some((_, c)) = running.as_mut().filter(|(t, _)| t == tid) {
                        c.clone_from(comm);
                    }
                }
                _ => {}
            }
            without.push(r);
        }
    }
    assert_eq!(
        without, recs,
        "besides the Running events, the records as given"
    );
    let summary = |p: &Path| summarize(&TraceReader::open(p).unwrap(), |_, _| {});
    let (sa, sb) = (summary(&a), summary(&b));
    assert_eq!(
        sa.digest, sb.digest,
        "the digest ignores where segments begin"
    );
    assert_eq!(sa.events, sb.events);
    assert!(!sa.events.contains_key("running"));
}

/// `records(n)` on three CPUs: the CPU changes every 1 to 5 steps, in a
/// fixed pseudo-random pattern, each CPU in its own address space.
fn records_on_cpus(n: u64) -> Vec<Record> {
    let mut out = Vec::new();
    let (mut cpu, mut steps) = (0u32, 0u64);
    for r in records(n) {
        match r {
            Record::Step(mut step) => {
                if steps % 5 == 0 || steps % 7 == 3 {
                    cpu = (cpu + 1 + (steps % 2) as u32) % 3;
                    out.push(Record::Event(Event::Cpu(cpu)));
                }
                step.cr3 = 0x9000 + u64::from(cpu) * 0x1000;
                step.regs.gpr[2] = u64::from(cpu);
                steps += 1;
                out.push(Record::Step(step));
            }
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_segment_names_the_cpu_it_begins_on_and_the_digest_does_not_care() {
    let dir = tempfile::tempdir().unwrap();
    let recs = records_on_cpus(60_000);
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    write(&a, 16 << 20, 16 << 10, false, &recs);
    write(&b, 16 << 20, 64 << 10, false, &recs);

    // Each segment decodes on its own: its steps' CPU is known from its
    // own records (step registers say which CPU ran them here), CPU 0
    // where none is named.
    let reader = TraceReader::open(&a).unwrap();
    assert!(reader.segments().len() > 4);
    let mut all = Vec::new();
    for i in 0..reader.segments().len() {
        let mut cpu = 0;
        all.push(Record::Event(Event::Cpu(0)));
        for r in reader.decode(i).unwrap() {
            match &r {
                Record::Event(Event::Cpu(c)) => cpu = *c,
                Record::Step(step) => assert_eq!(step.regs.gpr[2], u64::from(cpu), "segment {i}"),
                _ => {}
            }
            all.push(r);
        }
    }
    // The records as given, but for the CPU events that change nothing:
    // one that repeats the CPU, one that another follows at once.
    let switches_only = |records: &[Record]| {
        let mut current = None;
        let mut out: Vec<Record> = Vec::new();
        for r in records {
            if let Record::Event(Event::Cpu(c)) = r {
                if let Some(Record::Event(Event::Cpu(_))) = out.last() {
                    out.pop();
                    current = out.iter().rev().find_map(|r| match r {
                        Record::Event(Event::Cpu(c)) => Some(*c),
                        _ => None,
                    });
                }
                if current == Some(*c) {
                    continue;
                }
                current = Some(*c);
            }
            out.push(r.clone());
        }
        out
    };
    let mut given = vec![Record::Event(Event::Cpu(0))];
    given.extend(recs.iter().cloned());
    let (all, given) = (switches_only(&all), switches_only(&given));
    let first_difference = all.iter().zip(&given).position(|(a, b)| a != b);
    assert!(
        all.len() == given.len() && first_difference.is_none(),
        "{} records read, {} given; first difference at {first_difference:?}: {:?}",
        all.len(),
        given.len(),
        first_difference.map(|i| (&all[i - 2..i + 2], &given[i - 2..i + 2]))
    );

    let summary = |p: &Path| summarize(&TraceReader::open(p).unwrap(), |_, _| {});
    let (sa, sb) = (summary(&a), summary(&b));
    assert_eq!(
        sa.digest, sb.digest,
        "the digest ignores where segments begin"
    );
    assert_eq!(sa.steps_by_cpu, sb.steps_by_cpu);
    assert_eq!(sa.steps_by_cpu.values().sum::<u64>(), 60_000);
    assert_eq!(sa.steps_by_cpu.len(), 3);
    // The same steps on other CPUs are another trace.
    let moved: Vec<Record> = recs
        .iter()
        .map(|r| match r {
            Record::Event(Event::Cpu(c)) => Record::Event(Event::Cpu((c + 1) % 3)),
            other => other.clone(),
        })
        .collect();
    let c = dir.path().join("c");
    write(&c, 16 << 20, 16 << 10, false, &moved);
    assert_ne!(summary(&c).digest, sa.digest);
}

/// Where each CPU runs its own tasks, every segment opens with the task
/// each CPU ran there: a per-segment reader knows, for every CPU, whose
/// steps it reads.
#[test]
fn every_segment_names_the_task_of_each_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let mut recs = Vec::new();
    let mut steps = 0u64;
    for r in records_on_cpus(60_000) {
        if let Record::Step(_) = r {
            // Now and then the CPU just named switches: task 10 × CPU + k.
            if steps % 997 == 7 {
                let cpu = recs
                    .iter()
                    .rev()
                    .find_map(|r| match r {
                        Record::Event(Event::Cpu(c)) => Some(*c),
                        _ => None,
                    })
                    .unwrap_or(0);
                let tid = 10 * cpu + (steps / 997 % 4) as u32;
                recs.push(Record::Event(Event::Task {
                    tid,
                    pid: tid,
                    comm: format!("t{tid}"),
                }));
            }
            steps += 1;
        }
        recs.push(r);
    }
    let path = dir.path().join("t.vtd");
    write(&path, 16 << 20, 16 << 10, false, &recs);
    let reader = TraceReader::open(&path).unwrap();
    assert!(reader.segments().len() > 4);
    // Each CPU's task as the records so far named it.
    let mut expected: std::collections::BTreeMap<u32, u32> = Default::default();
    let mut named_all = false;
    for i in 0..reader.segments().len() {
        let segment = reader.decode(i).unwrap();
        let mut opened: std::collections::BTreeMap<u32, u32> = Default::default();
        let mut cpu = 0;
        let mut head = true;
        for r in &segment {
            match r {
                Record::Event(Event::Cpu(c)) => cpu = *c,
                Record::Event(Event::Running { tid, .. }) => {
                    assert!(head, "segment {i}: a Running event after its first step");
                    opened.insert(cpu, *tid);
                }
                Record::Event(Event::Task { tid, .. }) => {
                    expected.insert(cpu, *tid);
                }
                Record::Step(step) => {
                    if head {
                        // The head holds only Running events: `expected`
                        // is still as the segments before left it.
                        assert_eq!(opened, expected, "segment {i}");
                    }
                    head = false;
                    assert_eq!(step.regs.gpr[2], u64::from(cpu), "segment {i}");
                }
                _ => {}
            }
        }
        named_all |= opened.len() == 3;
    }
    assert_eq!(expected.len(), 3, "each CPU ran tasks: {expected:?}");
    assert!(named_all, "some segment opens with all three CPUs' tasks");
}

#[test]
fn wrap_keeps_the_newest_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.vtd");
    let recs = records(300_000);
    let size = SUPERBLOCK_LEN + 8 * (16 << 10);
    write(&path, size, 16 << 10, true, &recs);
    let got = read_all(&path);
    assert!(got.len() < recs.len(), "older records were overwritten");
    assert_eq!(
        &recs[recs.len() - got.len()..],
        &got[..],
        "what is left is the end of the trace"
    );
    let s = summarize(&TraceReader::open(&path).unwrap(), |_, _| {});
    assert!(s.clean_end, "{:?}", s.problems);
}

#[test]
fn nearly_full_comes_before_anything_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.vtd");
    let disk =
        DiskWriter::create(&path, SUPERBLOCK_LEN + 40 * (16 << 10), 16 << 10, false, "").unwrap();
    let mut rec = Recorder::start(disk);
    let mut written = 0u64;
    for r in records(10_000_000) {
        if rec.nearly_full() {
            break;
        }
        rec.record(&r);
        written += 1;
    }
    rec.event(&Event::TraceStop(TraceReason::DiskFull));
    let report = rec.finish().unwrap();
    assert_eq!(report.dropped_chunks, 0, "{report:?}");
    assert!(written < 10_000_000);
    let s = summarize(&TraceReader::open(&path).unwrap(), |_, _| {});
    assert_eq!(s.stop_reason(), Some(&TraceReason::DiskFull));
    assert!(s.clean_end);
}

#[test]
fn a_flipped_byte_is_reported_with_its_segment_and_the_rest_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.vtd");
    let recs = records(200_000);
    write(&path, 64 << 20, 64 << 10, false, &recs);
    let reader = TraceReader::open(&path).unwrap();
    let victim = reader.segments()[1].found;
    let whole = summarize(&reader, |_, _| {}).steps;
    drop(reader);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let at = victim.offset + 64 + 100;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x01], at).unwrap();

    let s = summarize(&TraceReader::open(&path).unwrap(), |_, _| {});
    assert_eq!(s.problems.len(), 1, "{:?}", s.problems);
    assert!(
        s.problems[0].contains(&format!("segment {}", victim.header.seq)),
        "{:?}",
        s.problems
    );
    assert_eq!(
        s.steps,
        whole - victim.header.steps,
        "every other segment still reads"
    );
}

#[test]
fn a_torn_tail_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.vtd");
    let mut recs = records(200_000);
    recs.pop(); // no stop record: the VMM "died"
    write(&path, 64 << 20, 64 << 10, false, &recs);
    let reader = TraceReader::open(&path).unwrap();
    let last = *reader.segments().last().map(|s| &s.found).unwrap();
    drop(reader);
    // Cut the last segment's payload short, as a kill mid-write would.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(
        &vec![0u8; 512],
        last.offset + 64 + u64::from(last.header.stored_len) / 2,
    )
    .unwrap();
    let s = summarize(&TraceReader::open(&path).unwrap(), |_, _| {});
    assert!(!s.clean_end);
    assert!(
        s.problems.iter().any(|p| p.starts_with("torn tail")),
        "{:?}",
        s.problems
    );
    assert!(
        s.problems
            .iter()
            .any(|p| p.contains("did not shut down cleanly")),
        "{:?}",
        s.problems
    );
    assert!(s.steps > 0);
}
