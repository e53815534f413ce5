//! Rows as columns, written as Parquet: a row group per segment, its
//! columns encoded in parallel by hand (`chunks`, `numbers`,
//! `event_lists`), zstd-compressed.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fs::File;
use std::io::BufWriter;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnDescPtr;
use rayon::prelude::*;
use rustc_hash::FxHashMap;
use vtrace_storage::InsnBytes;
use vtrace_storage::REG_NAMES;

use super::access_lists::{AccessColumns, Direction};
use super::chunks::{self, ColumnPages};
use super::event_lists::EventPages;
use super::keys::{Keys, TextPages, NO_KEY};
use super::numbers::{NumberEncoding, NumberPages, Numbers};
use super::registers::{FlagsPages, RegisterColumns, RegisterPages, FLAGS};
use super::rows::SegmentRows;
use super::{Context, ExportError, PartWriter};
use vtrace_analyzer::routine_label;
use vtrace_analyzer::TaskId;

fn text_dictionary() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

fn list_of(item: DataType) -> DataType {
    DataType::List(Arc::new(Field::new_list_field(item, true)))
}

/// The columns, in order (see the module documentation of
/// [`crate::export()`]).
pub(super) fn schema() -> SchemaRef {
    let mut fields = vec![
        Field::new("step", DataType::UInt64, false),
        Field::new("cpu", DataType::UInt32, false),
        Field::new("virtual_ns", DataType::UInt64, true),
        Field::new("cr3", DataType::UInt64, false),
        Field::new("cpl", DataType::UInt8, false),
        Field::new("bitness", DataType::UInt8, false),
        Field::new("pc", DataType::UInt64, false),
        Field::new("routine", text_dictionary(), false),
        Field::new("pid", DataType::UInt32, true),
        Field::new("tid", DataType::UInt32, true),
        Field::new("comm", text_dictionary(), true),
        Field::new("bytes", DataType::Binary, false),
        Field::new("mnemonic", text_dictionary(), false),
        Field::new("instruction", text_dictionary(), false),
    ];
    fields.extend(
        REG_NAMES
            .iter()
            .map(|name| Field::new(*name, DataType::UInt64, true)),
    );
    fields.extend([
        Field::new("reads", list_of(DataType::UInt64), true),
        Field::new("writes", list_of(DataType::UInt64), true),
        Field::new("read_sizes", list_of(DataType::UInt16), true),
        Field::new("write_sizes", list_of(DataType::UInt16), true),
        Field::new("read_values", list_of(DataType::UInt64), true),
        Field::new("write_values", list_of(DataType::UInt64), true),
        Field::new("syscall", DataType::UInt64, true),
        Field::new("syscall_name", text_dictionary(), true),
        Field::new("interrupt", DataType::UInt8, true),
        Field::new("events", list_of(DataType::Utf8), false),
    ]);
    Arc::new(Schema::new(fields))
}

/// Where a column of [`schema`] comes from. Each is built from the
/// segment's rows where it is encoded, in parallel with the others (built
/// one after another before them, they were a sixth of the writer's
/// time, with a core idle).
#[derive(Clone, Copy, Debug)]
enum Source {
    Step,
    Cpu,
    VirtualNs,
    Cr3,
    Cpl,
    Bitness,
    Pc,
    Routine,
    Pid,
    Tid,
    Comm,
    Bytes,
    Mnemonic,
    Instruction,
    /// A general register (its index in `REG_NAMES`).
    Register(usize),
    Flags,
    /// A direction's three access columns (address, size, value), built
    /// together at the address column's place (see `access_lists`): the
    /// places of the other two.
    Accesses {
        direction: Direction,
        size_at: usize,
        value_at: usize,
    },
    /// A column built with another (see `Source::Accesses`).
    BuiltElsewhere,
    Syscall,
    SyscallName,
    Interrupt,
    Events,
}

/// Where each column of [`schema`] comes from, in its order.
fn sources() -> Vec<Source> {
    use Source::*;
    let mut sources = vec![
        Step,
        Cpu,
        VirtualNs,
        Cr3,
        Cpl,
        Bitness,
        Pc,
        Routine,
        Pid,
        Tid,
        Comm,
        Bytes,
        Mnemonic,
        Instruction,
    ];
    sources.extend((0..FLAGS).map(Register));
    sources.push(Flags);
    // reads, writes, read_sizes, write_sizes, read_values, write_values.
    let at = sources.len();
    sources.extend([Direction::Reads, Direction::Writes].map(|direction| {
        let nth = usize::from(direction == Direction::Writes);
        Accesses {
            direction,
            size_at: at + 2 + nth,
            value_at: at + 4 + nth,
        }
    }));
    sources.extend([BuiltElsewhere; 4]);
    sources.extend([Syscall, SyscallName, Interrupt, Events]);
    sources
}

/// The chunks of the column at `at` of [`schema`] (`source`'s), with
/// their places: one, or none or three (see `Source::Accesses`).
fn column_chunks(
    source: Source,
    at: usize,
    descrs: &[ColumnDescPtr],
    rows: &SegmentRows,
    registers: &RegisterColumns,
    insn: &Keys<'_>,
    ctx: &Context<'_>,
) -> Result<Vec<(usize, chunks::EncodedChunk)>, ExportError> {
    let descr = |at: usize| {
        descrs
            .get(at)
            .cloned()
            .ok_or(ExportError::Unsupported("a column past the schema"))
    };
    match source {
        Source::Accesses {
            direction,
            size_at,
            value_at,
        } => {
            let (address, size, value) = (descr(at)?, descr(size_at)?, descr(value_at)?);
            let built = AccessColumns::new([&address, &size, &value], rows, direction)?;
            Ok(vec![
                (at, chunks::encode(address, &built.address)?),
                (size_at, chunks::encode(size, &built.size)?),
                (value_at, chunks::encode(value, &built.value)?),
            ])
        }
        Source::BuiltElsewhere => Ok(Vec::new()),
        _ => {
            let chunk = column(source, descr(at)?, rows, registers, insn, ctx)?;
            Ok(vec![(at, chunk)])
        }
    }
}

/// The chunk of a column that is built alone, `source`'s.
fn column(
    source: Source,
    descr: ColumnDescPtr,
    rows: &SegmentRows,
    registers: &RegisterColumns,
    insn: &Keys<'_>,
    ctx: &Context<'_>,
) -> Result<chunks::EncodedChunk, ExportError> {
    use NumberEncoding::{Delta, Dictionary, Plain};
    use Source::*;
    let encode = |pages: &dyn ColumnPages| chunks::encode(descr.clone(), pages);
    let number =
        |values, present, encoding| encode(&NumberPages::new(&descr, values, present, encoding)?);
    // Step numbers count up by one: as deltas they are almost nothing.
    // The address space, privilege level and bitness change seldom. The
    // address space's runs of u64s, written as they are, cost zstd more
    // than a dictionary's runs of one index cost to make (0.15 s against
    // 0.09 s of CPU over 50.7 M steps); the privilege level's and the
    // bitness's single bytes the other way round (0.05 s against 0.08 s).
    match source {
        Step => number(Numbers::U64(Cow::Borrowed(&rows.steps)), None, Delta),
        // One value: a dictionary of it, and a run of its index.
        Cpu => {
            let list = [u64::from(rows.cpu)];
            let keys = Keys::same(0, rows.len());
            encode(&NumberPages::from_list(&descr, &list, keys)?)
        }
        VirtualNs => {
            let (values, present) = virtual_ns(rows, ctx);
            number(Numbers::U64(values.into()), present, Delta)
        }
        Cr3 => number(Numbers::U64(Cow::Borrowed(&rows.cr3)), None, Dictionary),
        Cpl => number(Numbers::U8(Cow::Borrowed(&rows.cpl)), None, Plain),
        Bitness => number(Numbers::U8(Cow::Borrowed(&rows.bitness)), None, Plain),
        Pc | Routine | Pid | Tid | Comm | Bytes | Mnemonic | Instruction => {
            what_ran(source, &descr, rows, insn, ctx, encode)
        }
        Register(register) => encode(&RegisterPages::new(registers, register)),
        Flags => encode(&FlagsPages::new(registers)?),
        // Few rows have one: a dictionary of them, the rest null.
        Syscall => {
            let list: Vec<u64> = rows.syscalls.iter().map(|(_, call)| call.number).collect();
            let keys = sparse_keys(rows.len(), rows.syscalls.iter().map(|(row, _)| *row));
            encode(&NumberPages::from_list(&descr, &list, Keys::new(keys))?)
        }
        SyscallName => {
            let (names, keys) = syscall_names(rows);
            encode(&TextPages::new(&descr, &names, &keys)?)
        }
        Interrupt => {
            let list: Vec<u64> = rows.interrupts.iter().map(|(_, v)| u64::from(*v)).collect();
            let keys = sparse_keys(rows.len(), rows.interrupts.iter().map(|(row, _)| *row));
            encode(&NumberPages::from_list(&descr, &list, Keys::new(keys))?)
        }
        Events => encode(&EventPages::new(
            &descr,
            &rows.first_events,
            &rows.events,
            &rows.events_end,
        )?),
        Accesses { .. } | BuiltElsewhere => Err(ExportError::Unsupported(
            "a column built with others, alone",
        )),
    }
}

/// The chunk of a column of what a step ran: its instruction (pc, bytes,
/// mnemonic, instruction: the instruction texts' `insn` indexes), its
/// routine or its task (pid, tid, comm: the rows' tasks index).
fn what_ran(
    source: Source,
    descr: &ColumnDescPtr,
    rows: &SegmentRows,
    insn: &Keys<'_>,
    ctx: &Context<'_>,
    encode: impl Fn(&dyn ColumnPages) -> Result<chunks::EncodedChunk, ExportError>,
) -> Result<chunks::EncodedChunk, ExportError> {
    use Source::*;
    let texts = &rows.texts;
    match source {
        Pc => {
            let list: Vec<u64> = texts.iter().map(|t| t.pc).collect();
            encode(&NumberPages::from_list(descr, &list, insn.clone())?)
        }
        // A dictionary of the texts' bytes, as the pc's: the rows need not
        // copy each step's bytes.
        Bytes => {
            let bytes: Vec<InsnBytes> = texts.iter().map(|t| t.bytes).collect();
            encode(&TextPages::of_keys(descr, &bytes, insn.clone())?)
        }
        Mnemonic => {
            let names: Vec<&str> = texts.iter().map(|t| t.mnemonic.as_str()).collect();
            encode(&TextPages::of_keys(descr, &names, insn.clone())?)
        }
        Instruction => {
            let texts: Vec<&str> = texts.iter().map(|t| t.disassembly.as_str()).collect();
            encode(&TextPages::of_keys(descr, &texts, insn.clone())?)
        }
        Routine => {
            let (names, keys) = routines(rows, ctx);
            encode(&TextPages::new(descr, &names, &keys)?)
        }
        Pid | Tid => {
            let part = match source {
                Pid => |t: &TaskId| t.pid,
                _ => |t: &TaskId| t.tid,
            };
            let list: Vec<u64> = rows.tasks.iter().map(|t| u64::from(part(t))).collect();
            encode(&NumberPages::from_list(
                descr,
                &list,
                Keys::new(&rows.task),
            )?)
        }
        Comm => {
            let names: Vec<&str> = rows.tasks.iter().map(|t| t.comm.as_str()).collect();
            encode(&TextPages::new(descr, &names, &rows.task)?)
        }
        _ => Err(ExportError::Unsupported("not a column of what ran")),
    }
}

/// Each step's virtual time, where the trace's clock is per step (null
/// where it is not, or where the time would not fit).
fn virtual_ns(rows: &SegmentRows, ctx: &Context<'_>) -> (Vec<u64>, Option<Vec<bool>>) {
    let n = rows.len();
    let Some(ns) = ctx.ns_per_step else {
        return (vec![0; n], Some(vec![false; n]));
    };
    let mut overflowed = false;
    let times = rows
        .steps
        .iter()
        .map(|s| {
            s.checked_mul(ns).unwrap_or_else(|| {
                overflowed = true;
                0
            })
        })
        .collect();
    let present = overflowed.then(|| {
        let fits = |s: &u64| s.checked_mul(ns).is_some();
        rows.steps.iter().map(fits).collect()
    });
    (times, present)
}

/// The routines' names and each row's index among them.
fn routines(rows: &SegmentRows, ctx: &Context<'_>) -> (Vec<String>, Vec<u32>) {
    let mut keys = FxHashMap::default();
    let mut names = Vec::new();
    // Steps come in runs of one routine: the last one's key is at hand.
    let mut last: Option<(u32, u32)> = None;
    let routine = rows
        .routine
        .iter()
        .map(|f| match last {
            Some((func, k)) if func == *f => k,
            _ => {
                let k = *keys.entry(*f).or_insert_with(|| {
                    names.push(routine_label(ctx.symbols, *f));
                    (names.len() - 1) as u32
                });
                last = Some((*f, k));
                k
            }
        })
        .collect();
    (names, routine)
}

/// The keys of a column of `n` rows whose `rows` hold the items of a
/// list, in its order ([`NO_KEY`] in the others; a row named twice
/// holds the later item).
fn sparse_keys(n: usize, rows: impl Iterator<Item = u32>) -> Vec<u32> {
    let mut keys = vec![NO_KEY; n];
    for (item, row) in (0u32..).zip(rows) {
        if let Some(key) = keys.get_mut(row as usize) {
            *key = item;
        }
    }
    keys
}

/// The names of the system calls the steps entered (`write`, `write
/// (ia32)`: the number alone does not say which table it indexes), and
/// each row's index among them ([`NO_KEY`] where it entered none).
fn syscall_names(rows: &SegmentRows) -> (Vec<String>, Vec<u32>) {
    let mut names = Vec::new();
    let mut keys = FxHashMap::default();
    let mut column = vec![NO_KEY; rows.len()];
    for (row, call) in &rows.syscalls {
        let key = *keys.entry(*call).or_insert_with(|| {
            names.push(call.name());
            (names.len() - 1) as u32
        });
        if let Some(cell) = column.get_mut(*row as usize) {
            *cell = key;
        }
    }
    (names, column)
}

/// A Parquet file being written: each segment's columns are encoded in
/// parallel (rayon), then appended as one row group.
pub(super) struct ParquetPart<'a> {
    file: SerializedFileWriter<BufWriter<File>>,
    ctx: &'a Context<'a>,
}

impl<'a> ParquetPart<'a> {
    pub fn create(file: File, ctx: &'a Context<'a>) -> Result<Self, ExportError> {
        let about =
            |key: &str, value: &str| KeyValue::new(format!("vtrace.{key}"), value.to_string());
        let mut metadata = vec![about("trace", &ctx.trace_path)];
        metadata.extend(ctx.about.iter().map(|(k, v)| about(k, v)));
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(chunks::ZSTD_LEVEL)?))
            .set_created_by(format!("vtrace {}", env!("CARGO_PKG_VERSION")))
            .set_key_value_metadata(Some(metadata))
            .build();
        // Every column chunk is written by hand; arrow-rs's writer is
        // here for the file's schema, converted from the Arrow one and
        // stored with it (readers such as pyarrow take the text columns
        // back as dictionaries from it).
        let (file, _) = ArrowWriter::try_new(
            BufWriter::with_capacity(1 << 20, file),
            ctx.schema.clone(),
            Some(props),
        )?
        .into_serialized_writer()?;
        Ok(ParquetPart { file, ctx })
    }
}

/// Row groups being encoded at once: while one's last columns finish,
/// the next one's keep both cores busy (one at a time, the writer was an
/// export's bottleneck: a core sat idle through each row group's
/// serial start and its longest column's tail).
const ROW_GROUPS_IN_FLIGHT: usize = 2;

/// A row group's column chunks, in the schema's order.
type RowGroup = Vec<chunks::EncodedChunk>;

impl PartWriter for ParquetPart<'_> {
    fn write_all(
        mut self: Box<Self>,
        segments: &mut dyn Iterator<Item = SegmentRows>,
    ) -> Result<(), ExportError> {
        // Each column of this schema is one leaf (no structs).
        let descrs = self.file.schema_descr().columns().to_vec();
        if descrs.len() != self.ctx.schema.fields().len() {
            return Err(ExportError::Unsupported(
                "a column of the export's schema has more than one Parquet leaf",
            ));
        }
        let ctx = self.ctx;
        // Encoded on rayon's threads, appended here in order; this thread
        // only waits. An error returns at once, and the scope still waits
        // for the row groups begun.
        rayon::in_place_scope(|scope| {
            let mut encoding: VecDeque<Receiver<Result<RowGroup, ExportError>>> = VecDeque::new();
            for rows in segments {
                let (tx, rx) = sync_channel(1);
                let descrs = &descrs;
                scope.spawn(move |_| {
                    // The receiver is gone only after an error already
                    // returned.
                    let _ = tx.send(row_group(rows, descrs, ctx));
                });
                encoding.push_back(rx);
                // Before the next segment's rows are taken: no more rows
                // wait here than are being encoded.
                if encoding.len() >= ROW_GROUPS_IN_FLIGHT {
                    self.append(next_row_group(&mut encoding))?;
                }
            }
            while !encoding.is_empty() {
                self.append(next_row_group(&mut encoding))?;
            }
            Ok::<_, ExportError>(())
        })?;
        let mut inner = self.file.into_inner()?;
        std::io::Write::flush(&mut inner)?;
        inner
            .into_inner()
            .map_err(|e| ExportError::Io(e.into_error()))?
            .sync_all()?;
        Ok(())
    }
}

/// The oldest row group begun, once encoded.
fn next_row_group(
    encoding: &mut VecDeque<Receiver<Result<RowGroup, ExportError>>>,
) -> Result<RowGroup, ExportError> {
    match encoding.pop_front().map(|rx| rx.recv()) {
        Some(Ok(group)) => group,
        // A job that panicked sent nothing; the scope passes its panic on.
        _ => Err(ExportError::Unsupported("a row group's encoding stopped")),
    }
}

impl ParquetPart<'_> {
    /// Appends a row group's chunks to the file.
    fn append(&mut self, chunks: Result<RowGroup, ExportError>) -> Result<(), ExportError> {
        let mut group = self.file.next_row_group()?;
        for chunk in chunks? {
            group.append_column(&chunk.bytes, chunk.close)?;
        }
        group.close()?;
        Ok(())
    }
}

/// One segment's rows as a row group's column chunks, each column
/// encoded in parallel (rayon).
fn row_group(
    rows: SegmentRows,
    descrs: &[ColumnDescPtr],
    ctx: &Context<'_>,
) -> Result<RowGroup, ExportError> {
    let registers = RegisterColumns::new(&rows);
    // The instruction texts' keys, counted once for the four columns.
    let insn = Keys::new(&rows.insn);
    let sources = sources();
    if sources.len() != descrs.len() {
        return Err(ExportError::Unsupported(
            "the export's columns do not match its schema",
        ));
    }
    let chunks = sources
        .into_par_iter()
        .enumerate()
        .map(|(at, source)| column_chunks(source, at, descrs, &rows, &registers, &insn, ctx))
        .collect::<Result<Vec<_>, ExportError>>()?;
    let mut chunks: Vec<_> = chunks.into_iter().flatten().collect();
    chunks.sort_by_key(|(at, _)| *at);
    if chunks.len() != descrs.len() || chunks.iter().enumerate().any(|(i, (at, _))| i != *at) {
        return Err(ExportError::Unsupported(
            "a column of the export was not built once",
        ));
    }
    Ok(chunks.into_iter().map(|(_, chunk)| chunk).collect())
}
