//! Events in a segment's payload, encoder and decoder side by side: the
//! tag table, then how each event is written and read back. Events have
//! tags 0x80 and up (steps are below); what follows each tag is given at
//! its constant.

use crate::record::{
    Event, FunctionEdge, InterruptSource, Mapping, MemoryValue, ProbeField, ProbeValue,
    TraceReason, MAX_CPUS, MAX_MEMORY_VALUES, MAX_PROBE_ARGS, MAX_PROBE_FIELDS, MAX_PROBE_TEXT,
    MAX_SAMPLE_VALUES,
};
use crate::varint::{self, unzigzag, zigzag};

use super::{put_bytes, DecodeError, SegmentDecoder};

pub(super) const EV_INTERRUPT: u8 = 0x80;
pub(super) const EV_IO: u8 = 0x81;
pub(super) const EV_MMIO: u8 = 0x82;
pub(super) const EV_HYPERCALL: u8 = 0x83;
pub(super) const EV_MARK: u8 = 0x84;
pub(super) const EV_LOG: u8 = 0x85;
/// name (length, bytes), address, length asked for (varints), the bytes
/// read (length, bytes).
pub(super) const EV_CAPTURE: u8 = 0x86;
pub(super) const EV_CONTROL: u8 = 0x87;
pub(super) const EV_GAP: u8 = 0x88;
pub(super) const EV_HALT: u8 = 0x89;
/// A reason: its code byte (0 command line, 1 hotkey, 2 control, 3
/// hypercall + pass, 4 address + address, 5 max steps, 6 exception +
/// vector byte, 7 guest exit, 8 disk full, 9 other + text, 10 user quit,
/// 11 signal + number byte, 12 function + edge byte + name).
pub(super) const EV_START: u8 = 0x8a;
/// A reason, as [`EV_START`].
pub(super) const EV_STOP: u8 = 0x8b;
/// tid, pid (varints), comm (length, bytes).
pub(super) const EV_TASK: u8 = 0x8c;
/// tid (varint), comm (length, bytes).
pub(super) const EV_TASK_NAME: u8 = 0x8d;
/// pid, count (varints), then per mapping: start, length, file offset
/// (varints), path (length, bytes).
pub(super) const EV_MAPPINGS: u8 = 0x8e;
/// tid, pid (varints), comm (length, bytes).
pub(super) const EV_RUNNING: u8 = 0x8f;
/// count (varint).
pub(super) const EV_RUNNABLE: u8 = 0x90;
/// tid, code (varints).
pub(super) const EV_TASK_EXIT: u8 = 0x91;
/// name (length, bytes), pc (varint), argument count (byte, at most
/// [`MAX_PROBE_ARGS`]), the arguments (varints).
pub(super) const EV_PROBE: u8 = 0x92;
/// virtual ns, host ns (varints), a flags byte (bit 0: pc and CR3
/// follow, as varints), value count (byte, at most
/// [`MAX_SAMPLE_VALUES`]), the values (varints).
pub(super) const EV_SAMPLE: u8 = 0x93;
/// CPU number (varint, below [`MAX_CPUS`]).
pub(super) const EV_CPU: u8 = 0x94;
/// field count (byte, at most [`MAX_PROBE_FIELDS`]), then per field: name
/// (length, bytes), a kind byte and its value: 0 integer (size byte: 1, 2,
/// 4 or 8; signed byte; value varint), 1 pointer (varint), 2 text
/// (complete byte; length, bytes: at most [`MAX_PROBE_TEXT`]), 3
/// unavailable (address varint).
pub(super) const EV_PROBE_VALUES: u8 = 0x95;
/// count (byte, at most [`MAX_MEMORY_VALUES`]), then per access: flags
/// byte (bit 0 a store, bit 1 its value follows), size byte (1 to 8),
/// address (varint), the value (varint, where bit 1 says so; it fits the
/// size).
pub(super) const EV_MEMORY_VALUES: u8 = 0x96;

/// Appends `event`, its tag first.
pub(super) fn put_event(o: &mut Vec<u8>, event: &Event) {
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
        // Every kind is named here, so a new one cannot go unwritten.
        Event::Mark { .. }
        | Event::Log(_)
        | Event::Capture { .. }
        | Event::Probe { .. }
        | Event::ProbeValues(_)
        | Event::Sample { .. } => put_annotation(o, event),
        Event::Cpu(cpu) => {
            o.push(EV_CPU);
            varint::put(o, u64::from(*cpu));
        }
        Event::MemoryValues(values) => put_memory_values(o, values),
        Event::Task { .. }
        | Event::Running { .. }
        | Event::Runnable { .. }
        | Event::TaskExit { .. }
        | Event::TaskName { .. }
        | Event::Mappings { .. } => put_task_event(o, event),
    }
}

/// Appends recorded memory values; more than the decoder takes are cut
/// here rather than written undecodable.
fn put_memory_values(o: &mut Vec<u8>, values: &[MemoryValue]) {
    o.push(EV_MEMORY_VALUES);
    let values = &values[..values.len().min(MAX_MEMORY_VALUES)];
    o.push(u8::try_from(values.len()).unwrap_or(u8::MAX));
    for v in values {
        let flags = u8::from(v.write) | u8::from(v.value.is_some()) << 1;
        o.extend_from_slice(&[flags, v.size]);
        varint::put(o, v.addr);
        if let Some(value) = v.value {
            varint::put(o, value);
        }
    }
}

/// Appends typed probe values; more than the decoder takes are cut here
/// rather than written undecodable.
fn put_probe_values(o: &mut Vec<u8>, fields: &[ProbeField]) {
    o.push(EV_PROBE_VALUES);
    let fields = &fields[..fields.len().min(MAX_PROBE_FIELDS)];
    o.push(u8::try_from(fields.len()).unwrap_or(u8::MAX));
    for f in fields {
        put_bytes(o, f.name.as_bytes());
        match &f.value {
            ProbeValue::Int {
                value,
                size,
                signed,
            } => {
                o.extend_from_slice(&[0, *size, u8::from(*signed)]);
                varint::put(o, *value);
            }
            ProbeValue::Pointer(addr) => {
                o.push(1);
                varint::put(o, *addr);
            }
            ProbeValue::Text { bytes, complete } => {
                o.extend_from_slice(&[2, u8::from(*complete)]);
                put_bytes(o, &bytes[..bytes.len().min(MAX_PROBE_TEXT)]);
            }
            ProbeValue::Unavailable { addr } => {
                o.push(3);
                varint::put(o, *addr);
            }
        }
    }
}

/// Appends an event of the guest's or the user's: marks, logs, captures,
/// probe fires, samples.
fn put_annotation(o: &mut Vec<u8>, event: &Event) {
    match event {
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
            o.push(u8::try_from(args.len()).unwrap_or(u8::MAX));
            for a in args {
                varint::put(o, *a);
            }
        }
        Event::ProbeValues(fields) => put_probe_values(o, fields),
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
            o.push(u8::try_from(values.len()).unwrap_or(u8::MAX));
            for v in values {
                varint::put(o, *v);
            }
        }
        // `put_event` sends the others elsewhere.
        _ => {}
    }
}

/// Appends an event of Linux's tasks.
fn put_task_event(o: &mut Vec<u8>, event: &Event) {
    match event {
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
        // `put_event` sends the others elsewhere.
        _ => {}
    }
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

impl SegmentDecoder<'_> {
    /// A trace start or stop reason (see [`EV_START`]).
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

    /// The event of tag `tag`, whose tag byte was read.
    pub(super) fn event(&mut self, tag: u8) -> Result<Event, DecodeError> {
        Ok(match tag {
            EV_INTERRUPT => self.interrupt()?,
            EV_IO => Event::Io {
                port: self.var_u16()?,
                size: self.byte()?,
                write: self.byte()? != 0,
                value: self.var_u32()?,
            },
            EV_MMIO => Event::Mmio {
                addr: self.var()?,
                size: self.byte()?,
                write: self.byte()? != 0,
                value: self.var()?,
            },
            EV_HYPERCALL => Event::Hypercall {
                command: self.var_u32()?,
                args: [self.var()?, self.var()?, self.var()?, self.var()?],
                result: i32::try_from(unzigzag(self.var()?))
                    .map_err(|_| self.err("hypercall result too large"))?,
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
            EV_PROBE => self.probe()?,
            EV_PROBE_VALUES => self.probe_values()?,
            EV_MEMORY_VALUES => self.memory_values()?,
            EV_SAMPLE => self.sample()?,
            EV_CPU => match self.var_u32()? {
                cpu if cpu < MAX_CPUS => Event::Cpu(cpu),
                _ => return Err(self.err("CPU number too large")),
            },
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

    fn interrupt(&mut self) -> Result<Event, DecodeError> {
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
            _ => Some(self.var_u32()?),
        };
        Ok(Event::Interrupt {
            vector,
            error_code,
            source,
        })
    }

    fn probe(&mut self) -> Result<Event, DecodeError> {
        let name = self.text()?;
        let pc = self.var()?;
        let count = usize::from(self.byte()?);
        if count > MAX_PROBE_ARGS {
            return Err(self.err("probe with more than 6 arguments"));
        }
        let args = (0..count).map(|_| self.var()).collect::<Result<_, _>>()?;
        Ok(Event::Probe { name, pc, args })
    }

    fn probe_values(&mut self) -> Result<Event, DecodeError> {
        let count = usize::from(self.byte()?);
        if count > MAX_PROBE_FIELDS {
            return Err(self.err("probe with more than 8 typed values"));
        }
        let mut fields = Vec::with_capacity(count);
        for _ in 0..count {
            let name = self.text()?;
            let value = match self.byte()? {
                0 => {
                    let size = self.byte()?;
                    if !matches!(size, 1 | 2 | 4 | 8) {
                        return Err(self.err("probe integer of a size not 1, 2, 4 or 8"));
                    }
                    let signed = self.byte()? != 0;
                    ProbeValue::Int {
                        value: self.var()?,
                        size,
                        signed,
                    }
                }
                1 => ProbeValue::Pointer(self.var()?),
                2 => {
                    let complete = self.byte()? != 0;
                    let bytes = self.bytes()?;
                    if bytes.len() > MAX_PROBE_TEXT {
                        return Err(self.err("probe text longer than 256 bytes"));
                    }
                    ProbeValue::Text { bytes, complete }
                }
                3 => ProbeValue::Unavailable { addr: self.var()? },
                _ => return Err(self.err("unknown probe value kind")),
            };
            fields.push(ProbeField { name, value });
        }
        Ok(Event::ProbeValues(fields))
    }

    fn memory_values(&mut self) -> Result<Event, DecodeError> {
        let count = usize::from(self.byte()?);
        if count > MAX_MEMORY_VALUES {
            return Err(self.err("more than 8 memory values"));
        }
        let mut values = Vec::with_capacity(count);
        for _ in 0..count {
            let flags = self.byte()?;
            if flags & !3 != 0 {
                return Err(self.err("memory value with unknown flags"));
            }
            let size = self.byte()?;
            if !(1..=8).contains(&size) {
                return Err(self.err("memory value of a size not 1 to 8"));
            }
            let addr = self.var()?;
            let value = match flags & 2 {
                0 => None,
                _ => Some(self.var()?),
            };
            if value.is_some_and(|v| size < 8 && v >> (8 * u32::from(size)) != 0) {
                return Err(self.err("memory value wider than its size"));
            }
            values.push(MemoryValue {
                addr,
                size,
                write: flags & 1 != 0,
                value,
            });
        }
        Ok(Event::MemoryValues(values))
    }

    fn sample(&mut self) -> Result<Event, DecodeError> {
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
        Ok(Event::Sample {
            virtual_ns,
            host_ns,
            values,
            pc,
        })
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
        let mut maps = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(payload: &[u8]) -> Result<Event, DecodeError> {
        match SegmentDecoder::new(payload).next() {
            Some(Ok(crate::record::Record::Event(e))) => Ok(e),
            Some(Ok(other)) => panic!("not an event: {other:?}"),
            Some(Err(e)) => Err(e),
            None => panic!("nothing decoded"),
        }
    }

    #[test]
    fn numbers_too_large_for_their_field_are_refused_not_cut() {
        // A port of 0x1_0001 would read as port 1 if cut to 16 bits.
        let mut io = vec![EV_IO];
        varint::put(&mut io, 0x1_0001);
        io.extend_from_slice(&[1, 0, 0]);
        assert_eq!(decode(&io).unwrap_err().what, "number too large");
        let mut call = vec![EV_HYPERCALL];
        for v in [1, 0, 0, 0, 0, zigzag(i64::from(i32::MAX) + 1)] {
            varint::put(&mut call, v);
        }
        assert_eq!(
            decode(&call).unwrap_err().what,
            "hypercall result too large"
        );
        let mut fault = vec![EV_INTERRUPT, 14, 1, 1];
        varint::put(&mut fault, u64::from(u32::MAX) + 1);
        assert_eq!(decode(&fault).unwrap_err().what, "number too large");
    }

    #[test]
    fn what_fits_decodes_as_written() {
        let event = Event::Io {
            port: 0xffff,
            size: 4,
            write: true,
            value: u32::MAX,
        };
        let mut o = Vec::new();
        put_event(&mut o, &event);
        assert_eq!(decode(&o), Ok(event));
    }
}
