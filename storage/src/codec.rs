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
//! Events have tags 0x80 and up. An encoder starts from an all-zero state
//! and an empty code cache, so the first step of every segment is a
//! keyframe and a segment decodes on its own.
//!
//! The code cache is direct-mapped by pc (a fixed table, no allocation per
//! step): encoder and decoder update it identically, so a collision costs
//! the instruction bytes again, never a wrong decode.

use crate::record::{
    CpuMode, Event, FunctionEdge, InsnBytes, InterruptSource, Mapping, Record, RecordRef, Regs,
    Step, TraceReason, MAX_PROBE_ARGS, MAX_SAMPLE_VALUES, REG_COUNT,
};
use crate::varint::{self, unzigzag, zigzag};

const TAG_PC: u8 = 0x01;
const TAG_BYTES: u8 = 0x02;
const TAG_CONTEXT: u8 = 0x04;
const TAG_REGS: u8 = 0x08;
const STEP_TAG_MASK: u8 = 0x0f;

const EV_INTERRUPT: u8 = 0x80;
const EV_IO: u8 = 0x81;
const EV_MMIO: u8 = 0x82;
const EV_HYPERCALL: u8 = 0x83;
const EV_MARK: u8 = 0x84;
const EV_LOG: u8 = 0x85;
/// name (length, bytes), address, length asked for (varints), the bytes
/// read (length, bytes).
const EV_CAPTURE: u8 = 0x86;
const EV_CONTROL: u8 = 0x87;
const EV_GAP: u8 = 0x88;
const EV_HALT: u8 = 0x89;
/// A reason: its code byte (0 command line, 1 hotkey, 2 control, 3
/// hypercall + pass, 4 address + address, 5 max steps, 6 exception +
/// vector byte, 7 guest exit, 8 disk full, 9 other + text, 10 user quit,
/// 11 signal + number byte, 12 function + edge byte + name).
const EV_START: u8 = 0x8a;
/// A reason, as [`EV_START`].
const EV_STOP: u8 = 0x8b;
/// tid, pid (varints), comm (length, bytes).
const EV_TASK: u8 = 0x8c;
/// tid (varint), comm (length, bytes).
const EV_TASK_NAME: u8 = 0x8d;
/// pid, count (varints), then per mapping: start, length, file offset
/// (varints), path (length, bytes).
const EV_MAPPINGS: u8 = 0x8e;
/// tid, pid (varints), comm (length, bytes).
const EV_RUNNING: u8 = 0x8f;
/// count (varint).
const EV_RUNNABLE: u8 = 0x90;
/// tid, code (varints).
const EV_TASK_EXIT: u8 = 0x91;
/// name (length, bytes), pc (varint), argument count (byte, at most
/// [`MAX_PROBE_ARGS`]), the arguments (varints).
const EV_PROBE: u8 = 0x92;
/// virtual ns, host ns (varints), a flags byte (bit 0: pc and CR3
/// follow, as varints), value count (byte, at most
/// [`MAX_SAMPLE_VALUES`]), the values (varints).
const EV_SAMPLE: u8 = 0x93;

const CODE_CACHE_SLOTS: usize = 8192;

/// The most bytes one step takes: its tag, a pc delta, the instruction's
/// bytes with their length, the context, the register mask and a delta
/// for each of the 17 registers (a varint is at most 10 bytes).
const MAX_STEP_LEN: usize = 1 + 10 + 16 + 12 + 3 + REG_COUNT * 10;

/// Writes `v` as a varint at `buf[*at..]`, as [`varint::put`] does.
fn put_varint(buf: &mut [u8; MAX_STEP_LEN], at: &mut usize, mut v: u64) {
    while v >= 0x80 {
        buf[*at] = (v as u8) | 0x80;
        *at += 1;
        v >>= 7;
    }
    buf[*at] = v as u8;
    *at += 1;
}

fn slot(pc: u64) -> usize {
    ((pc ^ (pc >> 13)) as usize) & (CODE_CACHE_SLOTS - 1)
}

/// Delta-coding state shared, in mirror image, by encoder and decoder.
#[derive(Clone)]
struct State {
    regs: Regs,
    context: Option<(u64, CpuMode, u8)>,
    predicted_pc: u64,
    code: Vec<(u64, InsnBytes)>,
}

impl State {
    fn new() -> State {
        State {
            regs: Regs::default(),
            context: None,
            predicted_pc: 0,
            code: vec![(u64::MAX, InsnBytes::default()); CODE_CACHE_SLOTS],
        }
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
            buf[at] = bytes.len() as u8;
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
        let o = &mut self.out;
        match event {
            Event::Interrupt {
                vector,
                error_code,
                source,
            } => {
                o.extend_from_slice(&[
                    EV_INTERRUPT,
                    *vector,
                    *source as u8,
                    u8::from(error_code.is_some()),
                ]);
                if let Some(e) = error_code {
                    varint::put(o, u64::from(*e));
                }
            }
            Event::Io {
                port,
                size,
                write,
                value,
            } => {
                o.push(EV_IO);
                varint::put(o, u64::from(*port));
                o.extend_from_slice(&[*size, u8::from(*write)]);
                varint::put(o, u64::from(*value));
            }
            Event::Mmio {
                addr,
                size,
                write,
                value,
            } => {
                o.push(EV_MMIO);
                varint::put(o, *addr);
                o.extend_from_slice(&[*size, u8::from(*write)]);
                varint::put(o, *value);
            }
            Event::Hypercall {
                command,
                args,
                result,
            } => {
                o.push(EV_HYPERCALL);
                varint::put(o, u64::from(*command));
                for a in args {
                    varint::put(o, *a);
                }
                varint::put(o, zigzag(i64::from(*result)));
            }
            Event::Mark { id, value } => {
                o.push(EV_MARK);
                varint::put(o, *id);
                varint::put(o, *value);
            }
            Event::Log(text) => {
                o.push(EV_LOG);
                put_bytes(o, text.as_bytes());
            }
            Event::Capture {
                name,
                addr,
                length,
                bytes,
            } => {
                o.push(EV_CAPTURE);
                put_bytes(o, name.as_bytes());
                varint::put(o, *addr);
                varint::put(o, u64::from(*length));
                put_bytes(o, bytes);
            }
            Event::Probe { name, pc, args } => {
                o.push(EV_PROBE);
                put_bytes(o, name.as_bytes());
                varint::put(o, *pc);
                // The recorder never gets more: a longer list is cut here
                // rather than written undecodable.
                let args = &args[..args.len().min(MAX_PROBE_ARGS)];
                o.push(args.len() as u8);
                for a in args {
                    varint::put(o, *a);
                }
            }
            Event::Sample {
                virtual_ns,
                host_ns,
                values,
                pc,
            } => {
                o.push(EV_SAMPLE);
                varint::put(o, *virtual_ns);
                varint::put(o, *host_ns);
                o.push(u8::from(pc.is_some()));
                if let Some((pc, cr3)) = pc {
                    varint::put(o, *pc);
                    varint::put(o, *cr3);
                }
                // As for probes: cut rather than written undecodable.
                let values = &values[..values.len().min(MAX_SAMPLE_VALUES)];
                o.push(values.len() as u8);
                for v in values {
                    varint::put(o, *v);
                }
            }
            Event::ControlRegister { reg, value } => {
                o.extend_from_slice(&[EV_CONTROL, *reg]);
                varint::put(o, *value);
            }
            Event::Gap { from, to } => {
                o.push(EV_GAP);
                varint::put(o, *from);
                varint::put(o, *to);
            }
            Event::Halt => o.push(EV_HALT),
            Event::TraceStart(r) => {
                o.push(EV_START);
                put_reason(o, r);
            }
            Event::TraceStop(r) => {
                o.push(EV_STOP);
                put_reason(o, r);
            }
            Event::Task { tid, pid, comm } => {
                o.push(EV_TASK);
                varint::put(o, u64::from(*tid));
                varint::put(o, u64::from(*pid));
                put_bytes(o, comm.as_bytes());
            }
            Event::Running { tid, pid, comm } => {
                o.push(EV_RUNNING);
                varint::put(o, u64::from(*tid));
                varint::put(o, u64::from(*pid));
                put_bytes(o, comm.as_bytes());
            }
            Event::Runnable { count } => {
                o.push(EV_RUNNABLE);
                varint::put(o, u64::from(*count));
            }
            Event::TaskExit { tid, code } => {
                o.push(EV_TASK_EXIT);
                varint::put(o, u64::from(*tid));
                varint::put(o, u64::from(*code));
            }
            Event::TaskName { tid, comm } => {
                o.push(EV_TASK_NAME);
                varint::put(o, u64::from(*tid));
                put_bytes(o, comm.as_bytes());
            }
            Event::Mappings { pid, maps } => {
                o.push(EV_MAPPINGS);
                varint::put(o, u64::from(*pid));
                varint::put(o, maps.len() as u64);
                for m in maps {
                    varint::put(o, m.start);
                    varint::put(o, m.end.wrapping_sub(m.start));
                    varint::put(o, m.offset);
                    put_bytes(o, m.path.as_bytes());
                }
            }
        }
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

fn put_reason(o: &mut Vec<u8>, r: &TraceReason) {
    match r {
        TraceReason::CommandLine => o.push(0),
        TraceReason::Hotkey => o.push(1),
        TraceReason::Control => o.push(2),
        TraceReason::Hypercall { pass } => {
            o.push(3);
            varint::put(o, *pass);
        }
        TraceReason::Address(a) => {
            o.push(4);
            varint::put(o, *a);
        }
        TraceReason::MaxSteps => o.push(5),
        TraceReason::Exception(v) => o.extend_from_slice(&[6, *v]),
        TraceReason::GuestExit => o.push(7),
        TraceReason::DiskFull => o.push(8),
        TraceReason::Other(text) => {
            o.push(9);
            put_bytes(o, text.as_bytes());
        }
        TraceReason::UserQuit => o.push(10),
        TraceReason::Signal(n) => o.extend_from_slice(&[11, *n]),
        TraceReason::Function { name, edge } => {
            o.extend_from_slice(&[12, *edge as u8]);
            put_bytes(o, name.as_bytes());
        }
    }
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

    fn var_u32(&mut self) -> Result<u32, DecodeError> {
        u32::try_from(self.var()?).map_err(|_| self.err("number too large"))
    }

    fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let len = self.var()? as usize;
        let end = self.pos.checked_add(len).filter(|e| *e <= self.input.len());
        let end = end.ok_or_else(|| self.err("length past the end"))?;
        let b = self.input[self.pos..end].to_vec();
        self.pos = end;
        Ok(b)
    }

    fn text(&mut self) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes()?).map_err(|_| self.err("text is not UTF-8"))
    }

    fn mappings(&mut self) -> Result<Event, DecodeError> {
        let pid = self.var_u32()?;
        let count = self.var()?;
        // Each mapping takes at least 4 bytes: a crafted count cannot
        // reserve more than the payload could hold.
        let left = (self.input.len() - self.pos) as u64 / 4;
        if count > left {
            return Err(self.err("more mappings than bytes"));
        }
        let mut maps = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let start = self.var()?;
            let end = start
                .checked_add(self.var()?)
                .ok_or_else(|| self.err("mapping past the address space"))?;
            let offset = self.var()?;
            let path = self.text()?;
            maps.push(Mapping {
                start,
                end,
                offset,
                path,
            });
        }
        Ok(Event::Mappings { pid, maps })
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
            for i in (0..REG_COUNT).filter(|i| mask & (1 << i) != 0) {
                let old = self.step.regs.get(i);
                let d = self.var()?;
                let new = if i < 16 {
                    old.wrapping_add(unzigzag(d) as u64)
                } else {
                    old ^ d
                };
                self.step.regs.set(i, new);
            }
        }
        self.state.predicted_pc = pc.wrapping_add(bytes.len() as u64);
        let s = &mut self.step;
        (s.pc, s.bytes, s.cr3, s.mode, s.cpl) = (pc, bytes, cr3, mode, cpl);
        Ok(())
    }

    fn reason(&mut self) -> Result<TraceReason, DecodeError> {
        Ok(match self.byte()? {
            0 => TraceReason::CommandLine,
            1 => TraceReason::Hotkey,
            2 => TraceReason::Control,
            3 => TraceReason::Hypercall { pass: self.var()? },
            4 => TraceReason::Address(self.var()?),
            5 => TraceReason::MaxSteps,
            6 => TraceReason::Exception(self.byte()?),
            7 => TraceReason::GuestExit,
            8 => TraceReason::DiskFull,
            9 => TraceReason::Other(self.text()?),
            10 => TraceReason::UserQuit,
            11 => TraceReason::Signal(self.byte()?),
            12 => {
                let edge = FunctionEdge::from_u8(self.byte()?)
                    .ok_or_else(|| self.err("unknown function window edge"))?;
                TraceReason::Function {
                    name: self.text()?,
                    edge,
                }
            }
            _ => return Err(self.err("unknown trace reason")),
        })
    }

    fn event(&mut self, tag: u8) -> Result<Event, DecodeError> {
        Ok(match tag {
            EV_INTERRUPT => {
                let vector = self.byte()?;
                let source = match self.byte()? {
                    0 => InterruptSource::Injected,
                    1 => InterruptSource::InferredFromIdt,
                    2 => InterruptSource::ReportedByKvm,
                    3 => InterruptSource::DeliveredByVmm,
                    _ => return Err(self.err("interrupt source")),
                };
                let error_code = match self.byte()? {
                    0 => None,
                    _ => Some(self.var()? as u32),
                };
                Event::Interrupt {
                    vector,
                    error_code,
                    source,
                }
            }
            EV_IO => Event::Io {
                port: self.var()? as u16,
                size: self.byte()?,
                write: self.byte()? != 0,
                value: self.var()? as u32,
            },
            EV_MMIO => Event::Mmio {
                addr: self.var()?,
                size: self.byte()?,
                write: self.byte()? != 0,
                value: self.var()?,
            },
            EV_HYPERCALL => Event::Hypercall {
                command: self.var()? as u32,
                args: [self.var()?, self.var()?, self.var()?, self.var()?],
                result: unzigzag(self.var()?) as i32,
            },
            EV_MARK => Event::Mark {
                id: self.var()?,
                value: self.var()?,
            },
            EV_LOG => Event::Log(self.text()?),
            EV_CAPTURE => Event::Capture {
                name: self.text()?,
                addr: self.var()?,
                length: self.var_u32()?,
                bytes: self.bytes()?,
            },
            EV_PROBE => {
                let name = self.text()?;
                let pc = self.var()?;
                let count = usize::from(self.byte()?);
                if count > MAX_PROBE_ARGS {
                    return Err(self.err("probe with more than 6 arguments"));
                }
                let args = (0..count).map(|_| self.var()).collect::<Result<_, _>>()?;
                Event::Probe { name, pc, args }
            }
            EV_SAMPLE => {
                let virtual_ns = self.var()?;
                let host_ns = self.var()?;
                let pc = match self.byte()? {
                    0 => None,
                    1 => Some((self.var()?, self.var()?)),
                    _ => return Err(self.err("sample with unknown flags")),
                };
                let count = usize::from(self.byte()?);
                if count > MAX_SAMPLE_VALUES {
                    return Err(self.err("sample with more than 16 values"));
                }
                let values = (0..count).map(|_| self.var()).collect::<Result<_, _>>()?;
                Event::Sample {
                    virtual_ns,
                    host_ns,
                    values,
                    pc,
                }
            }
            EV_CONTROL => Event::ControlRegister {
                reg: self.byte()?,
                value: self.var()?,
            },
            EV_GAP => Event::Gap {
                from: self.var()?,
                to: self.var()?,
            },
            EV_HALT => Event::Halt,
            EV_START => Event::TraceStart(self.reason()?),
            EV_STOP => Event::TraceStop(self.reason()?),
            EV_TASK => Event::Task {
                tid: self.var_u32()?,
                pid: self.var_u32()?,
                comm: self.text()?,
            },
            EV_RUNNING => Event::Running {
                tid: self.var_u32()?,
                pid: self.var_u32()?,
                comm: self.text()?,
            },
            EV_RUNNABLE => Event::Runnable {
                count: self.var_u32()?,
            },
            EV_TASK_EXIT => Event::TaskExit {
                tid: self.var_u32()?,
                code: self.var_u32()?,
            },
            EV_TASK_NAME => Event::TaskName {
                tid: self.var_u32()?,
                comm: self.text()?,
            },
            EV_MAPPINGS => self.mappings()?,
            _ => return Err(self.err("unknown record tag")),
        })
    }
}

impl Iterator for SegmentDecoder<'_> {
    type Item = Result<Record, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_ref().map(|r| r.map(RecordRef::to_record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
