//! Rows as Arrow record batches, written as Parquet: a row group per
//! segment, text columns dictionary-encoded, zstd-compressed.

use std::fs::File;
use std::io::BufWriter;
use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::types::{UInt64Type, UInt8Type};
use arrow_array::{
    ArrayRef, ArrowPrimitiveType, BinaryArray, PrimitiveArray, UInt32Array, UInt64Array, UInt8Array,
};
use arrow_buffer::{BooleanBufferBuilder, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_writer::{compute_leaves, ArrowColumnChunk, ArrowRowGroupWriterFactory};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterPropertiesBuilder};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;
use rayon::prelude::*;
use rustc_hash::FxHashMap;
use vtrace_storage::REG_COUNT;
use vtrace_storage::REG_NAMES;

use super::chunks::{self, AccessPages, AccessPart, Direction, RegisterPages, TextPages};
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

/// A column of a row group, as it is encoded: by arrow-rs, or by hand
/// (the text columns, the general registers and the access lists, see
/// [`chunks`]).
pub(super) enum Column {
    Arrow(ArrayRef),
    /// A register (its index in `REG_NAMES`), from the segment's rows.
    Register(usize),
    /// A list of memory accesses, from the segment's rows.
    Access(Direction, AccessPart),
    Text {
        /// The texts (a text may be listed more than once).
        dictionary: Vec<String>,
        /// Each row's index into them (`None`: null).
        rows: Arc<[Option<u32>]>,
    },
}

/// One segment's rows as the columns of [`schema`], in order; `starts`
/// is where each row's register values start ([`chunks::value_starts`]).
/// Their plain columns move into Arrow arrays; what the hand-written
/// columns are encoded from (register masks and values, accesses) stays
/// in `rows`, and the rest is freed before the columns are encoded.
pub(super) fn columns(
    rows: &mut SegmentRows,
    starts: &[usize],
    ctx: &Context<'_>,
) -> Result<Vec<Column>, ExportError> {
    let n = rows.len();
    let bytes = bytes_column(std::mem::take(&mut rows.bytes), &rows.bytes_end)?;
    let texts = std::mem::take(&mut rows.texts);
    let built = text_and_marker_columns(rows, texts, bytes, ctx)?;
    let arrow = |arrays: Vec<ArrayRef>| arrays.into_iter().map(Column::Arrow);
    let mut columns: Vec<Column> = arrow(vec![
        Arc::new(UInt64Array::from(std::mem::take(&mut rows.steps))),
        Arc::new(UInt32Array::from(vec![rows.cpu; n])),
        built.virtual_ns,
        Arc::new(UInt64Array::from(std::mem::take(&mut rows.cr3))),
        Arc::new(UInt8Array::from(std::mem::take(&mut rows.cpl))),
        Arc::new(UInt8Array::from(std::mem::take(&mut rows.bitness))),
        Arc::new(UInt64Array::from(std::mem::take(&mut rows.pc))),
    ])
    .collect();
    columns.extend(built.what_ran);
    columns.extend((0..FLAGS).map(Column::Register));
    columns.push(Column::Arrow(flags_column(rows, starts)));
    use {AccessPart::*, Direction::*};
    columns.extend(
        [
            (Reads, Address),
            (Writes, Address),
            (Reads, Size),
            (Writes, Size),
            (Reads, Value),
            (Writes, Value),
        ]
        .map(|(d, p)| Column::Access(d, p)),
    );
    columns.extend(built.markers);
    if columns.len() != ctx.schema.fields().len() {
        return Err(ExportError::Unsupported(
            "the export's columns do not match its schema",
        ));
    }
    rows.free_all_but_hand_written();
    Ok(columns)
}

/// The columns [`columns`] builds besides the registers and the memory
/// accesses, by where they go in [`schema`].
struct TextAndMarkers {
    virtual_ns: ArrayRef,
    /// routine, pid, tid, comm, bytes, mnemonic, instruction.
    what_ran: [Column; 7],
    /// syscall, syscall_name, interrupt, events.
    markers: [Column; 4],
}

fn text_and_marker_columns(
    rows: &SegmentRows,
    texts: Vec<InsnText>,
    bytes: ArrayRef,
    ctx: &Context<'_>,
) -> Result<TextAndMarkers, ExportError> {
    let virtual_ns = virtual_ns_column(rows, ctx);
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
    let insn: Arc<[Option<u32>]> = rows.insn.iter().map(|i| Some(*i)).collect();
    let (mnemonics, disassembly) = texts
        .into_iter()
        .map(|t| (t.mnemonic, t.disassembly))
        .unzip();
    let [syscall, interrupt] = marker_columns(rows);
    let syscall_name = syscall_name_column(rows);
    Ok(TextAndMarkers {
        virtual_ns,
        what_ran: [
            routine,
            Column::Arrow(pid),
            Column::Arrow(tid),
            comm,
            Column::Arrow(bytes),
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
            Column::Arrow(syscall),
            syscall_name,
            Column::Arrow(interrupt),
            Column::Arrow(events_column(rows)),
        ],
    })
}

/// Each step's virtual time, where the trace's clock is per step (null
/// where it is not, or where the time would not fit).
fn virtual_ns_column(rows: &SegmentRows, ctx: &Context<'_>) -> ArrayRef {
    let Some(ns) = ctx.ns_per_step else {
        return Arc::new(UInt64Array::new_null(rows.len()));
    };
    let times = rows.steps.iter().map(|s| s.checked_mul(ns));
    if times.clone().all(|t| t.is_some()) {
        Arc::new(UInt64Array::from_iter_values(times.flatten()))
    } else {
        Arc::new(times.collect::<UInt64Array>())
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
fn task_columns(rows: &SegmentRows) -> [ArrayRef; 2] {
    let named = rows.task.iter().map(|t| *t != NO_TASK);
    let nulls = Some(NullBuffer::from_iter(named)).filter(|n| n.null_count() > 0);
    let column = |part: fn(&TaskId) -> u32| {
        let values = rows
            .task
            .iter()
            .map(|t| rows.tasks.get(*t as usize).map_or(0, part));
        Arc::new(UInt32Array::new(values.collect(), nulls.clone())) as ArrayRef
    };
    [column(|t| t.pid), column(|t| t.tid)]
}

/// Each step's instruction bytes: the rows' own buffer, moved, cut at
/// each row's end.
fn bytes_column(bytes: Vec<u8>, ends: &[u32]) -> Result<ArrayRef, ExportError> {
    let offsets = std::iter::once(Ok(0))
        .chain(ends.iter().map(|end| i32::try_from(*end)))
        .collect::<Result<Vec<i32>, _>>()
        .map_err(|_| ExportError::Unsupported("a segment with over 2^31 instruction bytes"))?;
    Ok(Arc::new(BinaryArray::try_new(
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        bytes.into(),
        None,
    )?))
}

/// RFLAGS' index in `REG_NAMES`, after the 16 general registers.
const FLAGS: usize = REG_COUNT - 1;

/// RFLAGS after each step that changed it, for arrow-rs to encode: its
/// few distinct values make a dictionary worth the hashing (about half
/// the size of the values written plain, measured), where the general
/// registers' values are written by hand.
fn flags_column(rows: &SegmentRows, starts: &[usize]) -> ArrayRef {
    let flags = starts
        .iter()
        .enumerate()
        .map(|(row, start)| rows.register(row, *start, FLAGS));
    Arc::new(flags.collect::<UInt64Array>())
}

/// The system call a step entered and the interrupt that came before it,
/// where any.
fn marker_columns(rows: &SegmentRows) -> [ArrayRef; 2] {
    let numbers: Vec<(u32, u64)> = rows.syscalls.iter().map(|(r, c)| (*r, c.number)).collect();
    [
        Arc::new(sparse::<UInt64Type>(rows.len(), &numbers)),
        Arc::new(sparse::<UInt8Type>(rows.len(), &rows.interrupts)),
    ]
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

/// A column of `n` rows that holds `values` (row, value) and nulls
/// elsewhere.
fn sparse<T: ArrowPrimitiveType>(n: usize, values: &[(u32, T::Native)]) -> PrimitiveArray<T> {
    let mut column = vec![T::Native::default(); n];
    let mut valid = BooleanBufferBuilder::new(n);
    valid.append_n(n, false);
    for (row, value) in values {
        let row = *row as usize;
        if let Some(slot) = column.get_mut(row) {
            *slot = *value;
            valid.set_bit(row, true);
        }
    }
    PrimitiveArray::new(column.into(), Some(NullBuffer::new(valid.finish())))
}

/// The events after each step, as text.
fn events_column(rows: &SegmentRows) -> ArrayRef {
    let mut events = ListBuilder::with_capacity(StringBuilder::new(), rows.len());
    let mut start = 0usize;
    for (row, end) in rows.events_end.iter().enumerate() {
        let end = *end as usize;
        if row == 0 {
            for e in &rows.first_events {
                events.values().append_value(e);
            }
        }
        for e in rows.events.get(start..end).unwrap_or_default() {
            events.values().append_value(e);
        }
        events.append(true);
        start = end;
    }
    Arc::new(events.finish())
}

/// A column chunk encoded.
enum Chunk {
    Arrow(ArrowColumnChunk),
    Own(chunks::EncodedChunk),
}

/// A Parquet file being written: each segment's columns are encoded in
/// parallel (rayon), then appended as one row group.
pub(super) struct ParquetPart<'a> {
    file: SerializedFileWriter<BufWriter<File>>,
    columns: ArrowRowGroupWriterFactory,
    row_groups: usize,
    ctx: &'a Context<'a>,
}

impl<'a> ParquetPart<'a> {
    pub fn create(file: File, ctx: &'a Context<'a>) -> Result<Self, ExportError> {
        let about =
            |key: &str, value: &str| KeyValue::new(format!("vtrace.{key}"), value.to_string());
        let mut metadata = vec![about("trace", &ctx.trace_path)];
        metadata.extend(ctx.about.iter().map(|(k, v)| about(k, v)));
        let mut props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(chunks::ZSTD_LEVEL)?));
        // Step numbers and times count up by one: delta encoding makes
        // them almost nothing, where a dictionary (Parquet's default)
        // would hash every row for nothing.
        let delta = |props: WriterPropertiesBuilder, path: ColumnPath| {
            props
                .set_column_dictionary_enabled(path.clone(), false)
                .set_column_encoding(path, Encoding::DELTA_BINARY_PACKED)
        };
        for column in ["step", "virtual_ns"] {
            props = delta(props, ColumnPath::from(column));
        }
        // The CPU, its address space, privilege level and bitness change
        // seldom: zstd packs their runs written as they are, to the size
        // a dictionary or deltas give, for less work than either
        // (measured).
        for column in ["cpu", "cr3", "cpl", "bitness"] {
            props = props.set_column_dictionary_enabled(ColumnPath::from(column), false);
        }
        // Addresses walk arrays and the stack by small steps. Registers'
        // values neither repeat (a dictionary grows big) nor change by
        // small steps often enough for deltas (measured: both larger).
        for name in &REG_NAMES[..16] {
            props = props.set_column_dictionary_enabled(ColumnPath::from(*name), false);
        }
        // An instruction's few bytes cost less written as they are (zstd
        // packs them as well) than looked up in a dictionary (measured).
        props = props.set_column_dictionary_enabled(ColumnPath::from("bytes"), false);
        // Min and max of a text column compare every row's text, about 8 %
        // of an export, and would prune nothing: a row group's routines
        // and instructions span the alphabet.
        for text in ["routine", "comm", "bytes", "mnemonic", "instruction"] {
            props = props
                .set_column_statistics_enabled(ColumnPath::from(text), EnabledStatistics::None);
        }
        for list in ["reads", "writes", "read_values", "write_values"] {
            props = delta(
                props,
                ColumnPath::new(vec![list.into(), "list".into(), "item".into()]),
            );
        }
        // A page per 20,000 rows (arrow-rs's default) made about 8 pages
        // per column and row group, and arrow-rs's zstd makes a context
        // for each, zeroing its 768 KiB of tables: pages end at 1 MiB
        // instead. Values go to the encoder in batches of 8,192, not
        // 1,024 (a page's checks run once a batch).
        let props = props
            .set_data_page_row_count_limit(usize::MAX)
            .set_write_batch_size(8192)
            .set_created_by(format!("vtrace {}", env!("CARGO_PKG_VERSION")))
            .set_key_value_metadata(Some(metadata))
            .build();
        let (file, columns) = ArrowWriter::try_new(
            BufWriter::with_capacity(1 << 20, file),
            ctx.schema.clone(),
            Some(props),
        )?
        .into_serialized_writer()?;
        Ok(ParquetPart {
            file,
            columns,
            row_groups: 0,
            ctx,
        })
    }
}

impl PartWriter for ParquetPart<'_> {
    fn write(&mut self, mut rows: SegmentRows) -> Result<(), ExportError> {
        let starts = chunks::value_starts(&rows);
        let columns = columns(&mut rows, &starts, self.ctx)?;
        let segment = &rows;
        let writers = self.columns.create_column_writers(self.row_groups)?;
        // Each column of this schema is one leaf (no structs): its levels
        // are worked out on the thread that encodes it.
        let fields = self.ctx.schema.fields();
        let descrs = self.file.schema_descr().columns().to_vec();
        if writers.len() != fields.len() || descrs.len() != fields.len() {
            return Err(ExportError::Unsupported(
                "a column of the export's schema has more than one Parquet leaf",
            ));
        }
        let chunks = writers
            .into_par_iter()
            .zip(descrs)
            .zip(fields.par_iter().zip(columns))
            .map(|((mut writer, descr), (field, column))| match column {
                Column::Arrow(array) => {
                    for leaf in compute_leaves(field, &array)? {
                        writer.write(&leaf)?;
                    }
                    Ok(Chunk::Arrow(writer.close()?))
                }
                Column::Text { dictionary, rows } => {
                    let pages = TextPages::new(&descr, &dictionary, &rows)?;
                    chunks::encode(descr, &pages).map(Chunk::Own)
                }
                Column::Register(register) => {
                    let pages = RegisterPages::new(segment, &starts, register);
                    chunks::encode(descr, &pages).map(Chunk::Own)
                }
                Column::Access(direction, part) => {
                    let pages = AccessPages::new(&descr, segment, direction, part)?;
                    chunks::encode(descr, &pages).map(Chunk::Own)
                }
            })
            .collect::<Result<Vec<_>, ExportError>>()?;
        let mut group = self.file.next_row_group()?;
        for chunk in chunks {
            match chunk {
                Chunk::Arrow(chunk) => chunk.append_to_row_group(&mut group)?,
                Chunk::Own(chunk) => group.append_column(&chunk.bytes, chunk.close)?,
            }
        }
        group.close()?;
        self.row_groups += 1;
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
