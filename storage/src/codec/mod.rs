//! The payload of one segment: records, delta-coded.
//!
//! Each record starts with a tag byte. Steps (tag < 0x80) carry only what
//! changed since the previous step of the segment:
//!
//! | tag bit | then |
//! |---|---|
//! | `PC` | the pc, as a zigzag delta from the predicted pc (previous pc + its length) |
//! | `BYTES` | the instruction bytes (length, bytes), when the code cache does not already hold them for this pc |
//! | `CONTEXT` | CR3, mode and CPL |
//! | `REGS` | a mask of changed registers, then per register a zigzag delta (RFLAGS: an XOR) |
//!
//! Events have tags 0x80 and up (`events.rs`, with their table). An encoder starts from an all-zero state
//! and an empty code cache, so the first step of every segment is a
//! keyframe and a segment decodes on its own.
//!
//! A trace of several CPUs names the CPU of the records that follow with
//! an [`Event::Cpu`]; each CPU's steps are delta-coded against that CPU's
//! previous step (its first in a segment is a keyframe), and the code
//! cache is shared.
//!
//! The code cache is direct-mapped by pc (a fixed table, no allocation per
//! step): encoder and decoder update it identically, so a collision costs
//! the instruction bytes again, never a wrong decode.

use crate::record::{
    CpuMode, Event, InsnBytes, Record, RecordRef, Regs, Step, MAX_CPUS, REG_COUNT,
};
use crate::varint::{self, unzigzag, zigzag};

mod events;

const TAG_PC: u8 = 0x01;
const TAG_BYTES: u8 = 0x02;
const TAG_CONTEXT: u8 = 0x04;
const TAG_REGS: u8 = 0x08;
const STEP_TAG_MASK: u8 = 0x0f;

const CODE_CACHE_SLOTS: usize = 8192;

/// The most bytes one step takes: its tag, a pc delta, the instruction's
/// bytes with their length, the context, the register mask and a delta
/// for each of the 17 registers (a varint is at most 10 bytes).
const MAX_STEP_LEN: usize = 1 + 10 + 16 + 12 + 3 + REG_COUNT * 10;

/// Writes `v` as a varint at `buf[*at..]`, as [`varint::put`] does.
fn put_varint(buf: &mut [u8; MAX_STEP_LEN], at: &mut usize, mut v: u64) {
    while v >= 0x80 {
        buf[*at] = v.to_le_bytes()[0] | 0x80;
        *at += 1;
        v >>= 7;
    }
    buf[*at] = v.to_le_bytes()[0];
    *at += 1;
}

fn slot(pc: u64) -> usize {
    // Masked to the table first, so it fits any usize.
    usize::try_from((pc ^ (pc >> 13)) & (CODE_CACHE_SLOTS as u64 - 1)).unwrap_or(0)
}

/// Delta-coding state shared, in mirror image, by encoder and decoder.
/// The deltas of a step are against the previous step of its CPU: the
/// registers, context and predicted pc here are the current CPU's, the
/// other CPUs' wait in `parked` (the code cache is shared).
#[derive(Clone)]
struct State {
    regs: Regs,
    context: Option<(u64, CpuMode, u8)>,
    predicted_pc: u64,
    code: Vec<(u64, InsnBytes)>,
    cpu: u32,
    /// By CPU number, as far as a CPU was named; the current CPU's entry
    /// is stale.
    parked: Vec<CpuDelta>,
}

/// One CPU's delta base, while another CPU's steps are coded.
#[derive(Clone, Copy, Default)]
struct CpuDelta {
    regs: Regs,
    context: Option<(u64, CpuMode, u8)>,
    predicted_pc: u64,
}

impl State {
    fn new() -> State {
        State {
            regs: Regs::default(),
            context: None,
            predicted_pc: 0,
            code: vec![(u64::MAX, InsnBytes::default()); CODE_CACHE_SLOTS],
            cpu: 0,
            parked: Vec::new(),
        }
    }

    /// The steps that follow are CPU `cpu`'s (at most [`MAX_CPUS`]): its
    /// delta base comes back, or a keyframe's where it has none yet.
    fn switch_cpu(&mut self, cpu: u32) {
        if cpu == self.cpu || cpu >= MAX_CPUS {
            return;
        }
        let needed = usize::try_from(cpu.max(self.cpu)).unwrap_or(0) + 1;
        if self.parked.len() < needed {
            self.parked.resize(needed, CpuDelta::default());
        }
        let here = usize::try_from(self.cpu).unwrap_or(0);
        self.parked[here] = CpuDelta {
            regs: self.regs,
            context: self.context,
            predicted_pc: self.predicted_pc,
        };
        let there = self.parked[usize::try_from(cpu).unwrap_or(0)];
        (self.regs, self.context, self.predicted_pc) =
            (there.regs, there.context, there.predicted_pc);
        self.cpu = cpu;
    }
}

/// Builds one segment's payload from records.
pub struct SegmentEncoder {
    out: Vec<u8>,
    /// Where a step's bytes are put together, kept so it is not zeroed
    /// for every step.
    scratch: [u8; MAX_STEP_LEN],
    state: State,
    steps: u64,
    events: u64,
}

impl std::fmt::Debug for SegmentEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentEncoder").finish_non_exhaustive()
    }
}

impl Default for SegmentEncoder {
    fn default() -> Self {
        Self::new()
    }
}

impl SegmentEncoder {
    /// An encoder with an empty payload, its state all zero.
    pub fn new() -> Self {
        SegmentEncoder {
            out: Vec::with_capacity(1 << 20),
            scratch: [0; MAX_STEP_LEN],
            state: State::new(),
            steps: 0,
            events: 0,
        }
    }

    /// Raw (uncompressed) payload bytes so far.
    pub fn len(&self) -> usize {
        self.out.len()
    }

    /// Whether nothing was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// Steps pushed.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Events pushed.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Appends a step or an event.
    pub fn push(&mut self, record: &Record) {
        match record {
            Record::Step(s) => self.push_step(s),
            Record::Event(e) => self.push_event(e),
        }
    }

    /// Appends a step, coding only what changed since the last one.
    ///
    /// Called for every step on the vCPU thread, so it builds the step's
    /// bytes in a stack buffer and appends them once, and finds the
    /// changed registers without a branch each: pushing byte by byte and
    /// testing registers one at a time made it some 340 instructions a
    /// step, the largest part of the tracer's own work.
    pub fn push_step(&mut self, step: &Step) {
        let st = &mut self.state;
        let buf = &mut self.scratch;
        let mut at = 1;
        let mut tag = 0u8;
        if step.pc != st.predicted_pc {
            tag |= TAG_PC;
            put_varint(
                buf,
                &mut at,
                zigzag(step.pc.wrapping_sub(st.predicted_pc) as i64),
            );
        }
        let cached = &mut st.code[slot(step.pc)];
        if cached.0 != step.pc || cached.1 != step.bytes {
            tag |= TAG_BYTES;
            let bytes = step.bytes.as_slice();
            buf[at] = step.bytes.len_byte();
            buf[at + 1..at + 1 + bytes.len()].copy_from_slice(bytes);
            at += 1 + bytes.len();
            *cached = (step.pc, step.bytes);
        }
        // Field by field: comparing the Option of a tuple cost 40
        // instructions a step.
        let same_context = match st.context {
            Some((cr3, mode, cpl)) => cr3 == step.cr3 && mode == step.mode && cpl == step.cpl,
            None => false,
        };
        if !same_context {
            tag |= TAG_CONTEXT;
            put_varint(buf, &mut at, step.cr3);
            buf[at] = step.mode as u8;
            buf[at + 1] = step.cpl;
            at += 2;
            st.context = Some((step.cr3, step.mode, step.cpl));
        }
        let (new, old) = (&step.regs, &mut st.regs);
        let mut mask = u32::from(new.rflags != old.rflags) << 16;
        for (i, (n, o)) in new.gpr.iter().zip(&old.gpr).enumerate() {
            mask |= u32::from(n != o) << i;
        }
        if mask != 0 {
            tag |= TAG_REGS;
            put_varint(buf, &mut at, u64::from(mask));
            // Only the changed registers are copied: the whole set is a
            // memcpy call.
            let mut left = mask & 0xffff;
            while left != 0 {
                let i = left.trailing_zeros() as usize;
                left &= left - 1;
                let delta = new.gpr[i].wrapping_sub(old.gpr[i]) as i64;
                put_varint(buf, &mut at, zigzag(delta));
                old.gpr[i] = new.gpr[i];
            }
            if mask & (1 << 16) != 0 {
                put_varint(buf, &mut at, new.rflags ^ old.rflags);
                old.rflags = new.rflags;
            }
        }
        buf[0] = tag;
        self.out.extend_from_slice(&buf[..at]);
        st.predicted_pc = step.pc.wrapping_add(step.bytes.len() as u64);
        self.steps += 1;
    }

    /// Appends an event.
    pub fn push_event(&mut self, event: &Event) {
        if let Event::Cpu(cpu) = event {
            self.state.switch_cpu(*cpu);
        }
        events::put_event(&mut self.out, event);
        self.events += 1;
    }

    /// The finished payload; the encoder starts a new keyframe.
    pub fn take(&mut self) -> Vec<u8> {
        self.state = State::new();
        self.steps = 0;
        self.events = 0;
        std::mem::replace(&mut self.out, Vec::with_capacity(1 << 20))
    }
}

fn put_bytes(o: &mut Vec<u8>, b: &[u8]) {
    varint::put(o, b.len() as u64);
    o.extend_from_slice(b);
}

/// A payload that does not decode: where and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("segment payload corrupt at byte {offset}: {what}")]
pub struct DecodeError {
    /// Byte offset in the payload where decoding failed.
    pub offset: usize,
    /// What was wrong there.
    pub what: &'static str,
}

/// Reads records back from one segment's payload: borrowed, one at a time,
/// with [`next_ref`](SegmentDecoder::next_ref), or owned, as an iterator.
pub struct SegmentDecoder<'a> {
    input: &'a [u8],
    pos: usize,
    /// The code cache and context; its `regs` are unused here, the
    /// registers live in `step`.
    state: State,
    failed: bool,
    /// The last step decoded: the base the next step's deltas apply to, and
    /// what `next_ref` lends out.
    step: Step,
    /// The last event decoded.
    event: Event,
}

impl<'a> std::fmt::Debug for SegmentDecoder<'a> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentDecoder").finish_non_exhaustive()
    }
}

impl<'a> SegmentDecoder<'a> {
    /// A decoder of one segment's payload, from its first record.
    pub fn new(input: &'a [u8]) -> Self {
        SegmentDecoder {
            input,
            pos: 0,
            state: State::new(),
            failed: false,
            step: Step::default(),
            event: Event::Halt,
        }
    }

    /// The next record, borrowed until the next call; `None` at the end or
    /// after an error.
    pub fn next_ref(&mut self) -> Option<Result<RecordRef<'_>, DecodeError>> {
        if self.failed || self.pos >= self.input.len() {
            return None;
        }
        let result = self.byte().and_then(|tag| {
            if tag < 0x80 {
                self.step(tag).map(|()| true)
            } else {
                self.event = self.event(tag)?;
                if let Event::Cpu(cpu) = self.event {
                    // The registers of the decoder's delta base live in
                    // `step`.
                    self.state.regs = self.step.regs;
                    self.state.switch_cpu(cpu);
                    self.step.regs = self.state.regs;
                }
                Ok(false)
            }
        });
        Some(match result {
            Ok(true) => Ok(RecordRef::Step(&self.step)),
            Ok(false) => Ok(RecordRef::Event(&self.event)),
            Err(e) => {
                self.failed = true;
                Err(e)
            }
        })
    }

    fn err(&self, what: &'static str) -> DecodeError {
        DecodeError {
            offset: self.pos,
            what,
        }
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = *self
            .input
            .get(self.pos)
            .ok_or_else(|| self.err("truncated"))?;
        self.pos += 1;
        Ok(b)
    }

    fn var(&mut self) -> Result<u64, DecodeError> {
        varint::get(self.input, &mut self.pos).ok_or_else(|| self.err("bad varint"))
    }

    fn var_u16(&mut self) -> Result<u16, DecodeError> {
        u16::try_from(self.var()?).map_err(|_| self.err("number too large"))
    }

    fn var_u32(&mut self) -> Result<u32, DecodeError> {
        u32::try_from(self.var()?).map_err(|_| self.err("number too large"))
    }

    fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let len = usize::try_from(self.var()?).map_err(|_| self.err("length too large"))?;
        let end = self.pos.checked_add(len).filter(|e| *e <= self.input.len());
        let end = end.ok_or_else(|| self.err("length past the end"))?;
        let b = self.input[self.pos..end].to_vec();
        self.pos = end;
        Ok(b)
    }

    fn text(&mut self) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes()?).map_err(|_| self.err("text is not UTF-8"))
    }

    /// Decodes a step into `self.step`, in place.
    fn step(&mut self, tag: u8) -> Result<(), DecodeError> {
        if tag & !STEP_TAG_MASK != 0 {
            return Err(self.err("unknown step flags"));
        }
        let mut pc = self.state.predicted_pc;
        if tag & TAG_PC != 0 {
            pc = pc.wrapping_add(unzigzag(self.var()?) as u64);
        }
        let bytes = if tag & TAG_BYTES != 0 {
            let len = usize::from(self.byte()?);
            let end = self.pos + len;
            let raw = self
                .input
                .get(self.pos..end)
                .ok_or_else(|| self.err("truncated bytes"))?;
            let b = InsnBytes::new(raw).ok_or_else(|| self.err("instruction length"))?;
            self.pos = end;
            self.state.code[slot(pc)] = (pc, b);
            b
        } else {
            let cached = self.state.code[slot(pc)];
            if cached.0 != pc {
                return Err(self.err("instruction bytes missing"));
            }
            cached.1
        };
        if tag & TAG_CONTEXT != 0 {
            let cr3 = self.var()?;
            let mode = CpuMode::from_u8(self.byte()?).ok_or_else(|| self.err("cpu mode"))?;
            let cpl = self.byte()?;
            self.state.context = Some((cr3, mode, cpl));
        }
        let (cr3, mode, cpl) = self
            .state
            .context
            .ok_or_else(|| self.err("no context in keyframe"))?;
        if tag & TAG_REGS != 0 {
            let mask = self.var()?;
            if mask >> REG_COUNT != 0 {
                return Err(self.err("register mask"));
            }
            // A set bit at a time: a step changes two or three of the 17.
            let mut bits = mask & ((1 << 16) - 1);
            while bits != 0 {
                let i = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let d = self.var()?;
                let r = &mut self.step.regs.gpr[i];
                *r = r.wrapping_add(unzigzag(d) as u64);
            }
            if mask & (1 << 16) != 0 {
                self.step.regs.rflags ^= self.var()?;
            }
        }
        self.state.predicted_pc = pc.wrapping_add(bytes.len() as u64);
        let s = &mut self.step;
        (s.pc, s.bytes, s.cr3, s.mode, s.cpl) = (pc, bytes, cr3, mode, cpl);
        Ok(())
    }
}

impl Iterator for SegmentDecoder<'_> {
    type Item = Result<Record, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_ref().map(|r| r.map(RecordRef::to_record))
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::record::{FunctionEdge, InterruptSource, Mapping, MemoryValue, TraceReason};

    #[test]
    fn insn_bytes_from_a_fetch_buffer_are_its_prefix() {
        let buf: [u8; 15] = std::array::from_fn(|i| 0xf0 | i as u8);
        for len in 1..=15 {
            let from = InsnBytes::from_prefix(&buf, len).unwrap();
            assert_eq!(Some(from), InsnBytes::new(&buf[..len]), "len {len}");
            assert_eq!(from.as_slice(), &buf[..len]);
        }
        assert_eq!(InsnBytes::from_prefix(&buf, 0), None);
        assert_eq!(InsnBytes::from_prefix(&buf, 16), None);
    }

    fn step(pc: u64, bytes: &[u8], rax: u64, rflags: u64) -> Step {
        let mut regs = Regs::default();
        regs.gpr[0] = rax;
        regs.gpr[4] = 0x7000;
        regs.rflags = rflags;
        Step {
            pc,
            bytes: InsnBytes::new(bytes).unwrap(),
            cr3: 0x1000,
            mode: CpuMode::Long64,
            cpl: 0,
            regs,
        }
    }

    fn every_event() -> Vec<Event> {
        vec![
            Event::Interrupt {
                vector: 14,
                error_code: Some(2),
                source: InterruptSource::ReportedByKvm,
            },
            Event::Interrupt {
                vector: 32,
                error_code: None,
                source: InterruptSource::Injected,
            },
            Event::Io {
                port: 0x3f8,
                size: 1,
                write: true,
                value: 0x41,
            },
            Event::Mmio {
                addr: 0xfee0_0000,
                size: 4,
                write: false,
                value: 7,
            },
            Event::Hypercall {
                command: 2,
                args: [1, 2, 3, u64::MAX],
                result: -2,
            },
            Event::Mark { id: 1, value: 99 },
            Event::Log("hello".into()),
            Event::Capture {
                name: "kprintf".into(),
                addr: 0x2000,
                length: 64,
                bytes: vec![1, 2, 3],
            },
            Event::Probe {
                name: "sched:switch".into(),
                pc: 0x10_0123,
                args: vec![1, u64::MAX, 0, 3, 4, 5],
            },
            Event::Probe {
                name: "fn:schedule".into(),
                pc: 0x10_0200,
                args: Vec::new(),
            },
            Event::ProbeValues(vec![
                crate::ProbeField {
                    name: "dfd".into(),
                    value: crate::ProbeValue::Int {
                        value: 0xffff_ff9c,
                        size: 4,
                        signed: true,
                    },
                },
                crate::ProbeField {
                    name: "filename".into(),
                    value: crate::ProbeValue::Text {
                        bytes: b"/init".to_vec(),
                        complete: true,
                    },
                },
                crate::ProbeField {
                    name: "how".into(),
                    value: crate::ProbeValue::Pointer(u64::MAX),
                },
                crate::ProbeField {
                    name: "how->flags".into(),
                    value: crate::ProbeValue::Unavailable { addr: 0x18 },
                },
            ]),
            Event::ProbeValues(Vec::new()),
            Event::Sample {
                virtual_ns: 1_000_000,
                host_ns: 2_000_000_000,
                values: vec![7, u64::MAX, 0],
                pc: None,
            },
            Event::Sample {
                virtual_ns: 3,
                host_ns: 4,
                values: Vec::new(),
                pc: Some((0xffff_ffff_8100_0000, 0x1000)),
            },
            Event::ControlRegister {
                reg: 3,
                value: 0x5000,
            },
            Event::Gap {
                from: 0x10,
                to: 0x20,
            },
            Event::Halt,
            Event::Task {
                tid: 7,
                pid: 5,
                comm: "kworker/0:1".into(),
            },
            Event::TaskName {
                tid: 7,
                comm: "sh".into(),
            },
            Event::Running {
                tid: 7,
                pid: 5,
                comm: "sh".into(),
            },
            Event::Runnable { count: 3 },
            Event::Cpu(3),
            Event::Cpu(0),
            Event::TaskExit {
                tid: 7,
                code: 0x100,
            },
            Event::Mappings {
                pid: 5,
                maps: vec![
                    Mapping {
                        start: 0x40_0000,
                        end: 0x40_1000,
                        offset: 0,
                        path: "/bin/busybox".into(),
                    },
                    Mapping {
                        start: 0x7fff_f000_0000,
                        end: 0x7fff_f002_3000,
                        offset: 0x1000,
                        path: "/lib/x86_64-linux-gnu/libc.so.6".into(),
                    },
                ],
            },
            Event::Mappings {
                pid: 6,
                maps: Vec::new(),
            },
            Event::TraceStart(TraceReason::Hypercall { pass: 3 }),
            Event::TraceStop(TraceReason::Other("disk".into())),
            Event::TraceStop(TraceReason::Exception(13)),
            Event::TraceStop(TraceReason::UserQuit),
            Event::TraceStop(TraceReason::Signal(2)),
            Event::TraceStart(TraceReason::Function {
                name: "task_sieve".into(),
                edge: FunctionEdge::Entry,
            }),
            Event::TraceStop(TraceReason::Function {
                name: "kprintf".into(),
                edge: FunctionEdge::SwitchedOut,
            }),
        ]
    }

    fn round_trip(records: &[Record]) -> Vec<u8> {
        let mut enc = SegmentEncoder::new();
        for r in records {
            enc.push(r);
        }
        let payload = enc.take();
        let back: Vec<Record> = SegmentDecoder::new(&payload).map(|r| r.unwrap()).collect();
        assert_eq!(back, records);
        payload
    }

    #[test]
    fn steps_and_every_event_round_trip() {
        let mut records = vec![Record::Step(step(0x1000, &[0x48, 0xff, 0xc0], 1, 0x202))];
        records.extend(every_event().into_iter().map(Record::Event));
        records.push(Record::Step(step(0x1003, &[0xeb, 0xfb], 1, 0x206)));
        records.push(Record::Step(step(0x1000, &[0x48, 0xff, 0xc0], 2, 0x202)));
        round_trip(&records);
    }

    #[test]
    fn a_loop_costs_a_few_bytes_per_step() {
        // inc rax; jmp back: after the first pass only the tag, the mask and
        // one delta per step remain.
        let mut records = Vec::new();
        for i in 0..1000u64 {
            records.push(Record::Step(step(
                0x1000,
                &[0x48, 0xff, 0xc0],
                i + 1,
                0x202,
            )));
            records.push(Record::Step(step(0x1003, &[0xeb, 0xfb], i + 1, 0x202)));
        }
        let payload = round_trip(&records);
        let per_step = payload.len() as f64 / records.len() as f64;
        assert!(per_step < 3.0, "{per_step} bytes per step");
    }

    #[test]
    fn every_segment_starts_with_a_keyframe() {
        let mut enc = SegmentEncoder::new();
        enc.push_step(&step(0x1000, &[0x90], 5, 2));
        enc.push_step(&step(0x1001, &[0x90], 5, 2));
        let first = enc.take();
        enc.push_step(&step(0x1002, &[0x90], 5, 2));
        let second = enc.take();
        let decoded: Vec<Record> = SegmentDecoder::new(&second).map(|r| r.unwrap()).collect();
        assert_eq!(decoded, vec![Record::Step(step(0x1002, &[0x90], 5, 2))]);
        assert!(second.len() > 4, "keyframe carries full state");
        assert!(
            first.len() > second.len(),
            "the second step of the first segment was a delta"
        );
    }

    #[test]
    fn each_cpu_is_delta_coded_against_its_own_last_step() {
        // Two CPUs in lockstep, each in its own loop with its own
        // registers: interleaved, each step still costs what it would alone.
        let mut records = Vec::new();
        for i in 0..500u64 {
            records.push(Record::Event(Event::Cpu(0)));
            records.push(Record::Step(step(0x1000, &[0x48, 0xff, 0xc0], i, 0x202)));
            records.push(Record::Event(Event::Cpu(1)));
            let mut other = step(0x9000 + (i % 2) * 3, &[0x48, 0xff, 0xc0], 1 << 40, 0x46);
            other.regs.gpr[4] = 0x8000 + i;
            other.cr3 = 0x5000;
            records.push(Record::Step(other));
        }
        let payload = round_trip(&records);
        let steps = 1000.0;
        // A CPU event (2 bytes) and a step (tag, mask and a delta or two)
        // a step; against one stream of the two, each would carry its pc,
        // CR3 and three full registers.
        let per_step = payload.len() as f64 / steps;
        assert!(per_step < 8.0, "{per_step} bytes per step");
    }

    #[test]
    fn a_cpus_first_step_in_a_segment_is_a_keyframe() {
        let mut enc = SegmentEncoder::new();
        enc.push_step(&step(0x1000, &[0x90], 5, 2));
        enc.push_event(&Event::Cpu(2));
        let mut on_two = step(0x2000, &[0x90], 7, 2);
        on_two.cr3 = 0x9000;
        enc.push_step(&on_two);
        let payload = enc.take();
        let decoded: Vec<Record> = SegmentDecoder::new(&payload).map(|r| r.unwrap()).collect();
        assert_eq!(
            decoded[2],
            Record::Step(on_two),
            "CR3 and registers in full"
        );
        // A CPU number from a crafted file cannot make the decoder
        // allocate its way to a gigabyte.
        let mut crafted = vec![events::EV_CPU];
        varint::put(&mut crafted, u64::from(MAX_CPUS));
        let err = SegmentDecoder::new(&crafted).next().unwrap().unwrap_err();
        assert_eq!(err.what, "CPU number too large");
    }

    /// Typed probe values from a crafted file: each bound is checked
    /// before anything is built on it.
    #[test]
    fn crafted_probe_values_are_refused_with_the_reason() {
        let decode = |bytes: &[u8]| SegmentDecoder::new(bytes).next().unwrap().unwrap_err().what;
        let ev = events::EV_PROBE_VALUES;
        assert_eq!(decode(&[ev, 9]), "probe with more than 8 typed values");
        assert_eq!(
            decode(&[ev, 1, 1, b'x', 0, 3, 0, 5]),
            "probe integer of a size not 1, 2, 4 or 8"
        );
        assert_eq!(decode(&[ev, 1, 1, b'x', 7]), "unknown probe value kind");
        let mut long = vec![ev, 1, 1, b'x', 2, 1];
        varint::put(&mut long, 257);
        long.extend(std::iter::repeat_n(b'a', 257));
        assert_eq!(decode(&long), "probe text longer than 256 bytes");
        let mut huge = vec![ev, 1, 1, b'x', 2, 1];
        varint::put(&mut huge, u64::MAX);
        assert_eq!(decode(&huge), "length past the end");
    }

    /// Recorded memory values round-trip, and a crafted file's are
    /// checked before anything is built on them.
    #[test]
    fn memory_values_round_trip_and_crafted_ones_are_refused() {
        let values = vec![
            MemoryValue {
                addr: 0xffff_8880_0000_1000,
                size: 4,
                write: false,
                value: Some(0xdead_beef),
            },
            MemoryValue {
                addr: 0x7fff_0000,
                size: 8,
                write: true,
                value: None,
            },
        ];
        round_trip(&[
            Record::Event(Event::MemoryValues(values)),
            Record::Step(step(0x1000, &[0x90], 0, 2)),
        ]);
        let decode = |bytes: &[u8]| SegmentDecoder::new(bytes).next().unwrap().unwrap_err().what;
        let ev = events::EV_MEMORY_VALUES;
        assert_eq!(decode(&[ev, 9]), "more than 8 memory values");
        assert_eq!(decode(&[ev, 1, 4, 1, 0]), "memory value with unknown flags");
        assert_eq!(
            decode(&[ev, 1, 0, 9, 0]),
            "memory value of a size not 1 to 8"
        );
        assert_eq!(
            decode(&[ev, 1, 2, 1, 0, 0x80, 2]),
            "memory value wider than its size"
        );
        assert_eq!(decode(&[ev, 2, 2, 1, 0, 7]), "truncated");
    }

    #[test]
    fn code_cache_collisions_resend_bytes() {
        // Two pcs in the same slot, alternating.
        let a = 0x1000u64;
        let b = (a + 1..).find(|&b| slot(b) == slot(a)).unwrap();
        let records: Vec<Record> = (0..10)
            .map(|i| {
                Record::Step(step(
                    if i % 2 == 0 { a } else { b },
                    &[0x90 + i as u8 % 2],
                    0,
                    2,
                ))
            })
            .collect();
        round_trip(&records);
    }

    #[test]
    fn corruption_is_an_error_not_a_panic() {
        let mut enc = SegmentEncoder::new();
        for i in 0..100 {
            enc.push_step(&step(0x1000 + i, &[0x90], i, 2));
            enc.push_event(&Event::Log("x".repeat(i as usize)));
        }
        let payload = enc.take();
        for cut in [1, 7, payload.len() / 2, payload.len() - 1] {
            let last = SegmentDecoder::new(&payload[..cut]).last().unwrap();
            assert!(last.is_err(), "truncated at {cut}");
        }
        let mut bad = payload.clone();
        bad[0] = 0xff;
        let err = SegmentDecoder::new(&bad).next().unwrap().unwrap_err();
        assert_eq!(err.offset, 1);
        // Flipping bytes anywhere never panics.
        for i in 0..payload.len() {
            let mut flipped = payload.clone();
            flipped[i] ^= 0x5a;
            for r in SegmentDecoder::new(&flipped) {
                if r.is_err() {
                    break;
                }
            }
        }
    }
}
