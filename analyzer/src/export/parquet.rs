//! Rows as columns, written as Parquet: a row group per segment, its
//! columns encoded in parallel by hand (`chunks`, `numbers`,
//! `event_lists`), zstd-compressed.

use std::fs::File;
use std::io::BufWriter;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use rayon::prelude::*;
use rustc_hash::FxHashMap;
use vtrace_storage::InsnBytes;
use vtrace_storage::REG_COUNT;
use vtrace_storage::REG_NAMES;

use super::access_lists::{AccessColumns, Direction};
use super::chunks::{self, RegisterPages, TextPages};
use super::event_lists::EventPages;
use super::numbers::{NumberEncoding, NumberPages, Numbers};
use super::rows::{InsnText, SegmentRows, NO_TASK};
use super::{Context, ExportError, PartWriter};
use crate::naming::routine_label;
use crate::tasks::TaskId;

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

/// A column of a row group, as it is encoded (see `chunks`,
/// `numbers`, `event_lists` and `access_lists`).
pub(super) enum Column {
    /// A register (its index in `REG_NAMES`), from the segment's rows.
    Register(usize),
    /// A direction's three access columns (address, size, value), from
    /// the segment's rows, built together at the address column's place
    /// (see `access_lists`): the places of the other two.
    Accesses {
        direction: Direction,
        size_at: usize,
        value_at: usize,
    },
    /// A column built with another (see `Column::Accesses`).
    BuiltElsewhere,
    Text {
        /// The texts (a text may be listed more than once).
        dictionary: Vec<String>,
        /// Each row's index into them (`None`: null).
        rows: Arc<[Option<u32>]>,
    },
    Number {
        values: Numbers,
        /// Which rows have a value (`None`: all).
        present: Option<Vec<bool>>,
        encoding: NumberEncoding,
    },
    /// A number column given as each row's index into a list of values
    /// (the pc, as the instruction's text's).
    Listed {
        list: Vec<u64>,
        rows: Arc<[Option<u32>]>,
    },
    /// Byte strings as each row's index into a list of them (the
    /// instruction bytes, as the instruction's text's).
    Binary {
        dictionary: Vec<InsnBytes>,
        rows: Arc<[Option<u32>]>,
    },
    /// The events before each step (see `EventPages`).
    Events {
        first: Vec<String>,
        events: Vec<String>,
        ends: Vec<u32>,
    },
}

impl Column {
    /// A number column with a value in every row.
    fn every_row(values: Numbers) -> Column {
        Column::Number {
            values,
            present: None,
            encoding: NumberEncoding::Plain,
        }
    }
}

/// One segment's rows as the columns of [`schema`], in order; `starts`
/// is where each row's register values start ([`chunks::value_starts`]).
/// Their plain columns move out of `rows`; what the register and access
/// columns are encoded from stays there, and the rest is freed before
/// the columns are encoded.
pub(super) fn columns(
    rows: &mut SegmentRows,
    starts: &[usize],
    ctx: &Context<'_>,
) -> Result<Vec<Column>, ExportError> {
    let n = rows.len();
    let virtual_ns = virtual_ns_column(rows, ctx);
    let texts = std::mem::take(&mut rows.texts);
    // Each row's instruction text, whose pc and bytes are the row's.
    let insn: Arc<[Option<u32>]> = rows.insn.iter().map(|i| Some(*i)).collect();
    let pc = Column::Listed {
        list: texts.iter().map(|t| t.pc).collect(),
        rows: insn.clone(),
    };
    // A dictionary of the texts' bytes, as the pc's: the rows need not
    // copy each step's bytes.
    let bytes = Column::Binary {
        dictionary: texts.iter().map(|t| t.bytes).collect(),
        rows: insn.clone(),
    };
    let built = text_and_marker_columns(rows, texts, insn, bytes, ctx);
    // Step numbers count up by one: as deltas they are almost nothing.
    // The CPU, address space, privilege level and bitness change seldom:
    // zstd packs their runs written as they are, to the size a
    // dictionary or deltas give, for less work than either (measured).
    let mut columns = vec![
        Column::Number {
            values: Numbers::U64(std::mem::take(&mut rows.steps)),
            present: None,
            encoding: NumberEncoding::Delta,
        },
        Column::every_row(Numbers::U32(vec![rows.cpu; n])),
        virtual_ns,
        Column::every_row(Numbers::U64(std::mem::take(&mut rows.cr3))),
        Column::every_row(Numbers::U8(std::mem::take(&mut rows.cpl))),
        Column::every_row(Numbers::U8(std::mem::take(&mut rows.bitness))),
        pc,
    ];
    columns.extend(built.what_ran);
    columns.extend((0..FLAGS).map(Column::Register));
    columns.push(flags_column(rows, starts));
    // reads, writes, read_sizes, write_sizes, read_values, write_values.
    let at = columns.len();
    columns.extend([Direction::Reads, Direction::Writes].map(|direction| {
        let nth = usize::from(direction == Direction::Writes);
        Column::Accesses {
            direction,
            size_at: at + 2 + nth,
            value_at: at + 4 + nth,
        }
    }));
    columns.extend((0..4).map(|_| Column::BuiltElsewhere));
    columns.extend(built.markers);
    if columns.len() != ctx.schema.fields().len() {
        return Err(ExportError::Unsupported(
            "the export's columns do not match its schema",
        ));
    }
    rows.free_all_but_hand_written();
    Ok(columns)
}

/// The columns [`columns`] builds besides the step's own, the registers
/// and the memory accesses, by where they go in [`schema`].
struct TextAndMarkers {
    /// routine, pid, tid, comm, bytes, mnemonic, instruction.
    what_ran: [Column; 7],
    /// syscall, syscall_name, interrupt, events.
    markers: [Column; 4],
}

fn text_and_marker_columns(
    rows: &mut SegmentRows,
    texts: Vec<InsnText>,
    insn: Arc<[Option<u32>]>,
    bytes: Column,
    ctx: &Context<'_>,
) -> TextAndMarkers {
    let routine = routine_column(rows, ctx);
    let [pid, tid] = task_columns(rows);
    let comm = Column::Text {
        dictionary: rows.tasks.iter().map(|t| t.comm.to_string()).collect(),
        rows: rows
            .task
            .iter()
            .map(|t| (*t != NO_TASK).then_some(*t))
            .collect(),
    };
    let (mnemonics, disassembly) = texts
        .into_iter()
        .map(|t| (t.mnemonic, t.disassembly))
        .unzip();
    let [syscall, interrupt] = marker_columns(rows);
    let syscall_name = syscall_name_column(rows);
    TextAndMarkers {
        what_ran: [
            routine,
            pid,
            tid,
            comm,
            bytes,
            Column::Text {
                dictionary: mnemonics,
                rows: insn.clone(),
            },
            Column::Text {
                dictionary: disassembly,
                rows: insn,
            },
        ],
        markers: [
            syscall,
            syscall_name,
            interrupt,
            Column::Events {
                first: std::mem::take(&mut rows.first_events),
                events: std::mem::take(&mut rows.events),
                ends: std::mem::take(&mut rows.events_end),
            },
        ],
    }
}

/// Each step's virtual time, where the trace's clock is per step (null
/// where it is not, or where the time would not fit).
fn virtual_ns_column(rows: &SegmentRows, ctx: &Context<'_>) -> Column {
    let n = rows.len();
    let (values, present) = match ctx.ns_per_step {
        None => (vec![0; n], Some(vec![false; n])),
        Some(ns) => {
            let times: Vec<Option<u64>> = rows.steps.iter().map(|s| s.checked_mul(ns)).collect();
            let present = match times.iter().all(Option::is_some) {
                true => None,
                false => Some(times.iter().map(Option::is_some).collect()),
            };
            (times.into_iter().map(|t| t.unwrap_or(0)).collect(), present)
        }
    };
    Column::Number {
        values: Numbers::U64(values),
        present,
        encoding: NumberEncoding::Delta,
    }
}

/// The routine of each step.
fn routine_column(rows: &SegmentRows, ctx: &Context<'_>) -> Column {
    let mut keys = FxHashMap::default();
    let mut names = Vec::new();
    // Steps come in runs of one routine: the last one's key is at hand.
    let mut last: Option<(u32, u32)> = None;
    let routine = rows
        .routine
        .iter()
        .map(|f| match last {
            Some((func, k)) if func == *f => Some(k),
            _ => {
                let k = *keys.entry(*f).or_insert_with(|| {
                    names.push(routine_label(ctx.symbols, *f));
                    (names.len() - 1) as u32
                });
                last = Some((*f, k));
                Some(k)
            }
        })
        .collect();
    Column::Text {
        dictionary: names,
        rows: routine,
    }
}

/// pid and tid of each step's task (null where the trace names none).
fn task_columns(rows: &SegmentRows) -> [Column; 2] {
    let named: Vec<bool> = rows.task.iter().map(|t| *t != NO_TASK).collect();
    let present = Some(named).filter(|n| n.contains(&false));
    let column = |part: fn(&TaskId) -> u32| {
        let values = rows
            .task
            .iter()
            .map(|t| rows.tasks.get(*t as usize).map_or(0, part));
        Column::Number {
            values: Numbers::U32(values.collect()),
            present: present.clone(),
            encoding: NumberEncoding::Plain,
        }
    };
    [column(|t| t.pid), column(|t| t.tid)]
}

/// RFLAGS' index in `REG_NAMES`, after the 16 general registers.
const FLAGS: usize = REG_COUNT - 1;

/// RFLAGS after each step that changed it: its few distinct values make
/// a dictionary worth the hashing (about half the size of the values
/// written plain, measured), where the general registers' values are
/// written plain (see `chunks::RegisterPages`).
fn flags_column(rows: &SegmentRows, starts: &[usize]) -> Column {
    let mut present = Vec::with_capacity(starts.len());
    let values = starts
        .iter()
        .enumerate()
        .map(|(row, start)| {
            let flags = rows.register(row, *start, FLAGS);
            present.push(flags.is_some());
            flags.unwrap_or(0)
        })
        .collect();
    Column::Number {
        values: Numbers::U64(values),
        present: Some(present),
        encoding: NumberEncoding::Dictionary,
    }
}

/// The system call a step entered and the interrupt that came before it,
/// where any.
fn marker_columns(rows: &SegmentRows) -> [Column; 2] {
    let n = rows.len();
    let calls = rows.syscalls.iter().map(|(row, call)| (*row, call.number));
    let (numbers, present) = sparse(n, calls);
    let syscall = Column::Number {
        values: Numbers::U64(numbers),
        present: Some(present),
        encoding: NumberEncoding::Plain,
    };
    let (vectors, present) = sparse(n, rows.interrupts.iter().copied());
    let interrupt = Column::Number {
        values: Numbers::U8(vectors),
        present: Some(present),
        encoding: NumberEncoding::Plain,
    };
    [syscall, interrupt]
}

/// A column of `n` rows that holds `values` (row, value) and nulls
/// elsewhere: each row's value (0 where null) and whether it has one.
fn sparse<T: Copy + Default>(
    n: usize,
    values: impl Iterator<Item = (u32, T)>,
) -> (Vec<T>, Vec<bool>) {
    let mut column = vec![T::default(); n];
    let mut present = vec![false; n];
    for (row, value) in values {
        let row = row as usize;
        if let (Some(slot), Some(has)) = (column.get_mut(row), present.get_mut(row)) {
            (*slot, *has) = (value, true);
        }
    }
    (column, present)
}

/// The name of the system call a step entered (`write`, `write (ia32)`:
/// the number alone does not say which table it indexes).
fn syscall_name_column(rows: &SegmentRows) -> Column {
    let mut dictionary = Vec::new();
    let mut keys = FxHashMap::default();
    let mut column = vec![None; rows.len()];
    for (row, call) in &rows.syscalls {
        let key = *keys.entry(*call).or_insert_with(|| {
            dictionary.push(call.name());
            (dictionary.len() - 1) as u32
        });
        if let Some(cell) = column.get_mut(*row as usize) {
            *cell = Some(key);
        }
    }
    Column::Text {
        dictionary,
        rows: column.into(),
    }
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

impl PartWriter for ParquetPart<'_> {
    fn write(&mut self, mut rows: SegmentRows) -> Result<(), ExportError> {
        let starts = chunks::value_starts(&rows);
        let columns = columns(&mut rows, &starts, self.ctx)?;
        let segment = &rows;
        // Each column of this schema is one leaf (no structs).
        let descrs = self.file.schema_descr().columns().to_vec();
        if descrs.len() != self.ctx.schema.fields().len() {
            return Err(ExportError::Unsupported(
                "a column of the export's schema has more than one Parquet leaf",
            ));
        }
        let chunks = (0..descrs.len())
            .into_par_iter()
            .zip(columns)
            .map(|(at, column)| {
                let descr = descrs[at].clone();
                let one = |chunk| Ok(vec![(at, chunk)]);
                match column {
                    Column::Text { dictionary, rows } => {
                        let pages = TextPages::new(&descr, &dictionary, &rows)?;
                        one(chunks::encode(descr, &pages)?)
                    }
                    Column::Register(register) => {
                        let pages = RegisterPages::new(segment, &starts, register);
                        one(chunks::encode(descr, &pages)?)
                    }
                    Column::Accesses {
                        direction,
                        size_at,
                        value_at,
                    } => {
                        let (size, value) = match (descrs.get(size_at), descrs.get(value_at)) {
                            (Some(size), Some(value)) => (size.clone(), value.clone()),
                            _ => {
                                return Err(ExportError::Unsupported(
                                    "an access column past the schema",
                                ))
                            }
                        };
                        let built =
                            AccessColumns::new([&descr, &size, &value], segment, direction)?;
                        Ok(vec![
                            (at, chunks::encode(descr, &built.address)?),
                            (size_at, chunks::encode(size, &built.size)?),
                            (value_at, chunks::encode(value, &built.value)?),
                        ])
                    }
                    Column::BuiltElsewhere => Ok(Vec::new()),
                    Column::Number {
                        values,
                        present,
                        encoding,
                    } => {
                        let pages = NumberPages::new(&descr, values, present, encoding)?;
                        one(chunks::encode(descr, &pages)?)
                    }
                    Column::Listed { list, rows } => {
                        let pages = NumberPages::from_list(&descr, &list, &rows)?;
                        one(chunks::encode(descr, &pages)?)
                    }
                    Column::Binary { dictionary, rows } => {
                        let pages = TextPages::new(&descr, &dictionary, &rows)?;
                        one(chunks::encode(descr, &pages)?)
                    }
                    Column::Events {
                        first,
                        events,
                        ends,
                    } => {
                        let pages = EventPages::new(&descr, first, events, ends)?;
                        one(chunks::encode(descr, &pages)?)
                    }
                }
            })
            .collect::<Result<Vec<_>, ExportError>>()?;
        let mut chunks: Vec<_> = chunks.into_iter().flatten().collect();
        chunks.sort_by_key(|(at, _)| *at);
        if chunks.len() != descrs.len() || chunks.iter().enumerate().any(|(i, (at, _))| i != *at) {
            return Err(ExportError::Unsupported(
                "a column of the export was not built once",
            ));
        }
        let mut group = self.file.next_row_group()?;
        for (_, chunk) in chunks {
            group.append_column(&chunk.bytes, chunk.close)?;
        }
        group.close()?;
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<(), ExportError> {
        let mut inner = self.file.into_inner()?;
        std::io::Write::flush(&mut inner)?;
        inner
            .into_inner()
            .map_err(|e| ExportError::Io(e.into_error()))?
            .sync_all()?;
        Ok(())
    }
}
