//! Rows as Arrow record batches, written as Parquet: a row group per
//! segment, text columns dictionary-encoded, zstd-compressed.

use std::fs::File;
use std::io::BufWriter;
use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, ListBuilder, StringBuilder, UInt16Builder, UInt32Builder, UInt64Builder,
};
use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, DictionaryArray, Int32Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
    UInt8Array,
};
use arrow_buffer::{BooleanBufferBuilder, NullBuffer};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_writer::{compute_leaves, ArrowRowGroupWriterFactory};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{WriterProperties, WriterPropertiesBuilder};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;
use rayon::prelude::*;
use rustc_hash::FxHashMap;
use vtrace_storage::REG_COUNT;
use vtrace_storage::REG_NAMES;

use super::rows::{SegmentRows, NO_TASK};
use super::{Context, ExportError, PartWriter};
use crate::memory_values::Access;
use crate::naming::routine_label;

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
        Field::new("interrupt", DataType::UInt8, true),
        Field::new("events", list_of(DataType::Utf8), false),
    ]);
    Arc::new(Schema::new(fields))
}

fn dictionary(keys: Int32Array, values: Vec<String>) -> Result<ArrayRef, ExportError> {
    Ok(Arc::new(DictionaryArray::<Int32Type>::try_new(
        keys,
        Arc::new(StringArray::from(values)),
    )?))
}

fn key(index: usize) -> i32 {
    // Fewer distinct values than rows, and a segment's rows fit in i32.
    i32::try_from(index).unwrap_or(i32::MAX)
}

/// One segment's rows as a record batch of [`schema`]. The rows are
/// taken: their plain columns move into the batch, and what is left of
/// them is freed before the batch is encoded.
pub(super) fn batch(rows: SegmentRows, ctx: &Context<'_>) -> Result<RecordBatch, ExportError> {
    let n = rows.len();
    let virtual_ns: UInt64Array = rows
        .steps
        .iter()
        .map(|s| ctx.ns_per_step.and_then(|ns| s.checked_mul(ns)))
        .collect();
    let (routine, routine_names) = routine_column(&rows, ctx);
    let [pid, tid, comm] = task_columns(&rows)?;
    let insn: Int32Array = rows.insn.iter().map(|i| Some(key(*i as usize))).collect();
    let mnemonics = rows.texts.iter().map(|t| t.mnemonic.clone()).collect();
    let disassembly = rows.texts.iter().map(|t| t.disassembly.clone()).collect();
    let bytes = bytes_column(&rows);
    let registers = register_columns(&rows);
    let reads = (&rows.first_reads[..], &rows.reads[..], &rows.reads_end[..]);
    let writes = (
        &rows.first_writes[..],
        &rows.writes[..],
        &rows.writes_end[..],
    );
    let accesses = [
        access_lists(&rows, reads, |a| Some(a.addr)),
        access_lists(&rows, writes, |a| Some(a.addr)),
        size_lists(&rows, reads),
        size_lists(&rows, writes),
        access_lists(&rows, reads, |a| a.value),
        access_lists(&rows, writes, |a| a.value),
    ];
    let markers = marker_columns(&rows);
    let events = events_column(&rows);
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from(rows.steps)),
        Arc::new(UInt32Array::from(vec![ctx.cpu; n])),
        Arc::new(virtual_ns),
        Arc::new(UInt64Array::from(rows.cr3)),
        Arc::new(UInt8Array::from(rows.cpl)),
        Arc::new(UInt8Array::from(rows.bitness)),
        Arc::new(UInt64Array::from(rows.pc)),
        dictionary(routine, routine_names)?,
        pid,
        tid,
        comm,
        bytes,
        dictionary(insn.clone(), mnemonics)?,
        dictionary(insn, disassembly)?,
    ];
    columns.extend(registers);
    columns.extend(accesses);
    columns.extend(markers);
    columns.push(events);
    Ok(RecordBatch::try_new(ctx.schema.clone(), columns)?)
}

/// The routine of each step, as dictionary keys and the names they stand
/// for.
fn routine_column(rows: &SegmentRows, ctx: &Context<'_>) -> (Int32Array, Vec<String>) {
    let mut routine_keys = FxHashMap::default();
    let mut routine_names = Vec::new();
    // Steps come in runs of one routine: the last one's key is at hand.
    let mut last: Option<(u32, i32)> = None;
    let routine: Int32Array = rows
        .routine
        .iter()
        .map(|f| match last {
            Some((func, k)) if func == *f => Some(k),
            _ => {
                let k = *routine_keys.entry(*f).or_insert_with(|| {
                    routine_names.push(routine_label(ctx.symbols, *f));
                    key(routine_names.len() - 1)
                });
                last = Some((*f, k));
                Some(k)
            }
        })
        .collect();
    (routine, routine_names)
}

/// pid, tid and comm of each step's task (null where the trace names
/// none).
fn task_columns(rows: &SegmentRows) -> Result<[ArrayRef; 3], ExportError> {
    let n = rows.len();
    let mut pid = UInt32Builder::with_capacity(n);
    let mut tid = UInt32Builder::with_capacity(n);
    let comm: Int32Array = rows
        .task
        .iter()
        .map(|t| (*t != NO_TASK).then(|| key(*t as usize)))
        .collect();
    for t in &rows.task {
        match rows.tasks.get(*t as usize) {
            Some(task) => {
                pid.append_value(task.pid);
                tid.append_value(task.tid);
            }
            None => {
                pid.append_null();
                tid.append_null();
            }
        }
    }
    let comms: Vec<String> = rows.tasks.iter().map(|t| t.comm.to_string()).collect();
    Ok([
        Arc::new(pid.finish()),
        Arc::new(tid.finish()),
        dictionary(comm, comms)?,
    ])
}

/// Each step's instruction bytes.
fn bytes_column(rows: &SegmentRows) -> ArrayRef {
    let mut bytes = BinaryBuilder::with_capacity(rows.len(), rows.bytes.len());
    let mut start = 0usize;
    for end in &rows.bytes_end {
        let end = *end as usize;
        bytes.append_value(rows.bytes.get(start..end).unwrap_or_default());
        start = end;
    }
    Arc::new(bytes.finish())
}

/// A column per register: its value after each step.
fn register_columns(rows: &SegmentRows) -> Vec<ArrayRef> {
    let n = rows.len();
    // Filled a changed register at a time (a step changes two or three),
    // not a builder call per register and row.
    let mut values = vec![vec![0u64; n]; REG_COUNT];
    let mut valid: Vec<BooleanBufferBuilder> = (0..REG_COUNT)
        .map(|_| {
            let mut b = BooleanBufferBuilder::new(n);
            b.append_n(n, false);
            b
        })
        .collect();
    let mut cursor = 0usize;
    for row in 0..n {
        let mut bits = rows.changed[row];
        while bits != 0 {
            let reg = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if let (Some(v), Some(column)) = (rows.register(row, cursor, reg), values.get_mut(reg))
            {
                column[row] = v;
                valid[reg].set_bit(row, true);
            }
        }
        cursor += rows.stored(row);
    }
    values
        .into_iter()
        .zip(valid.iter_mut())
        .map(|(v, valid)| {
            let nulls = NullBuffer::new(valid.finish());
            Arc::new(UInt64Array::new(v.into(), Some(nulls))) as ArrayRef
        })
        .collect()
}

/// A row's accesses: those of row 0, the rest, and where each row's end.
type Accesses<'a> = (&'a [Access], &'a [Access], &'a [u32]);

/// Each row's accesses (none where the registers before the step are
/// not known).
fn row_accesses<'a>(
    rows: &'a SegmentRows,
    (first, flat, ends): Accesses<'a>,
) -> impl Iterator<Item = Option<&'a [Access]>> + 'a {
    let mut start = 0usize;
    ends.iter().enumerate().map(move |(row, end)| {
        let end = *end as usize;
        let list = match (rows.known[row], row) {
            (true, 0) => Some(first),
            (true, _) => Some(flat.get(start..end).unwrap_or_default()),
            (false, _) => None,
        };
        start = end;
        list
    })
}

/// A list of `part` of each access (an address, a value) per row.
fn access_lists(
    rows: &SegmentRows,
    accesses: Accesses<'_>,
    part: fn(&Access) -> Option<u64>,
) -> ArrayRef {
    let mut list = ListBuilder::with_capacity(UInt64Builder::new(), rows.len());
    for row in row_accesses(rows, accesses) {
        match row {
            Some(row) => {
                list.values().extend(row.iter().map(part));
                list.append(true);
            }
            None => list.append(false),
        }
    }
    Arc::new(list.finish())
}

/// Each access's size, a list per row.
fn size_lists(rows: &SegmentRows, accesses: Accesses<'_>) -> ArrayRef {
    let mut list = ListBuilder::with_capacity(UInt16Builder::new(), rows.len());
    for row in row_accesses(rows, accesses) {
        match row {
            Some(row) => {
                list.values().extend(row.iter().map(|a| Some(a.size)));
                list.append(true);
            }
            None => list.append(false),
        }
    }
    Arc::new(list.finish())
}

/// The system call a step entered and the interrupt that came before it,
/// where any.
fn marker_columns(rows: &SegmentRows) -> [ArrayRef; 2] {
    let n = rows.len();
    let mut syscall = vec![None; n];
    for (row, number) in &rows.syscalls {
        if let Some(slot) = syscall.get_mut(*row as usize) {
            *slot = Some(*number);
        }
    }
    let mut interrupt = vec![None; n];
    for (row, vector) in &rows.interrupts {
        if let Some(slot) = interrupt.get_mut(*row as usize) {
            *slot = Some(*vector);
        }
    }
    [
        Arc::new(UInt64Array::from(syscall)),
        Arc::new(UInt8Array::from(interrupt)),
    ]
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
        let mut props =
            WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?));
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
        // Addresses walk arrays and the stack by small steps. Registers'
        // values neither repeat (a dictionary grows big) nor change by
        // small steps often enough for deltas (measured: both larger).
        for name in &REG_NAMES[..16] {
            props = props.set_column_dictionary_enabled(ColumnPath::from(*name), false);
        }
        for list in ["reads", "writes", "read_values", "write_values"] {
            props = delta(
                props,
                ColumnPath::new(vec![list.into(), "list".into(), "item".into()]),
            );
        }
        let props = props
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
    fn write(&mut self, rows: SegmentRows) -> Result<(), ExportError> {
        let batch = batch(rows, self.ctx)?;
        let writers = self.columns.create_column_writers(self.row_groups)?;
        // Each column of this schema is one leaf (no structs): its levels
        // are worked out on the thread that encodes it.
        let fields = self.ctx.schema.fields();
        if writers.len() != fields.len() {
            return Err(ExportError::Unsupported(
                "a column of the export's schema has more than one Parquet leaf",
            ));
        }
        let chunks = writers
            .into_par_iter()
            .zip(fields.par_iter().zip(batch.columns().par_iter()))
            .map(|(mut writer, (field, column))| {
                for leaf in compute_leaves(field, column)? {
                    writer.write(&leaf)?;
                }
                writer.close()
            })
            .collect::<Result<Vec<_>, _>>()?;
        drop(batch);
        let mut group = self.file.next_row_group()?;
        for chunk in chunks {
            chunk.append_to_row_group(&mut group)?;
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
