//! A text column's chunk, dictionary-encoded by hand.
//!
//! The rows already hold each text as an index into a list of distinct
//! texts (routine, comm, mnemonic, instruction). Given those columns as
//! Arrow dictionaries, arrow-rs's writer looks every row's string up in
//! a hash table of its own to find the index again (about a tenth of an
//! export: hashing, then comparing on each hit), and its encoder for
//! that is private to the crate. So these chunks are put together here
//! from the parquet crate's own page writer, with the indices as they
//! are:
//!
//! | page | contents (Parquet format, data page v1) |
//! |---|---|
//! | dictionary | each distinct text: u32 LE length, then its bytes (PLAIN) |
//! | data, per [`ROWS_PER_PAGE`] rows | nullable columns only: u32 LE length, then the definition levels (1 = a value, 0 = null) as the RLE/bit-packed hybrid of bit width 1; then one byte of bit width and the non-null rows' indices in the hybrid (RLE_DICTIONARY) |
//!
//! Each page is zstd-compressed on its own, as the rest of the file is.
//! The RLE/bit-packed hybrid: a run of one value is `varint(count << 1)`
//! and the value in whole bytes; a run of literals is `varint(groups << 1
//! | 1)` and groups of 8 values, each `width` bits, least significant
//! first; only the last group may be padded.

use bytes::Bytes;
use parquet::basic::{Compression, Encoding, EncodingMask, PageType, ZstdLevel};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::{ColumnChunkMetaData, PageEncodingStats};
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;

use super::ExportError;

/// Rows a data page holds at most (arrow-rs's default limit, so readers
/// see pages of the size they see in the other columns).
pub(super) const ROWS_PER_PAGE: usize = 20_000;

/// zstd's level, as for the file's other columns.
pub(super) const ZSTD_LEVEL: i32 = 3;

/// A column chunk encoded: its bytes and what the row group writer
/// needs to append it (`SerializedRowGroupWriter::append_column`).
pub(super) struct EncodedChunk {
    pub bytes: Bytes,
    pub close: ColumnCloseResult,
}

/// Encodes a text column as the chunk of column `descr`: `dictionary`
/// the distinct texts, `rows` each row's index into it or `None` for null
/// (a column whose field is not nullable has no `None`).
pub(super) fn encode(
    descr: ColumnDescPtr,
    dictionary: &[String],
    rows: &[Option<u32>],
) -> Result<EncodedChunk, ExportError> {
    let nullable = descr.max_def_level() > 0;
    if !nullable && rows.iter().any(Option::is_none) {
        return Err(ExportError::Unsupported(
            "a null in a text column that is not nullable",
        ));
    }
    let mut compressor = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
    let mut sink = TrackedWrite::new(Vec::new());
    let mut pages = SerializedPageWriter::new(&mut sink);
    let mut sizes = (0u64, 0u64);
    let mut page = |page_writer: &mut SerializedPageWriter<'_, Vec<u8>>,
                    plain: Vec<u8>,
                    header: Header|
     -> Result<u64, ExportError> {
        let uncompressed = plain.len();
        let buf = Bytes::from(compressor.compress(&plain)?);
        let page = match header {
            Header::Dictionary(num_values) => Page::DictionaryPage {
                buf,
                num_values,
                encoding: Encoding::PLAIN,
                is_sorted: false,
            },
            Header::Data(num_values) => Page::DataPage {
                buf,
                num_values,
                encoding: Encoding::RLE_DICTIONARY,
                def_level_encoding: Encoding::RLE,
                rep_level_encoding: Encoding::RLE,
                statistics: None,
            },
        };
        let spec = page_writer.write_page(CompressedPage::new(page, uncompressed))?;
        sizes.0 += spec.compressed_size as u64;
        sizes.1 += spec.uncompressed_size as u64;
        Ok(spec.offset)
    };

    let entries = u32::try_from(dictionary.len())
        .map_err(|_| ExportError::Unsupported("a text column with over 2^32 distinct texts"))?;
    page(
        &mut pages,
        plain_texts(dictionary)?,
        Header::Dictionary(entries),
    )?;
    let width = index_width(dictionary.len());
    let mut data_pages = 0;
    let mut first_data_page = None;
    for chunk in rows.chunks(ROWS_PER_PAGE) {
        let offset = page(
            &mut pages,
            data_page(chunk, width, nullable),
            Header::Data(chunk.len() as u32),
        )?;
        first_data_page.get_or_insert(offset);
        data_pages += 1;
    }
    pages.close()?;

    let total =
        |n: u64| i64::try_from(n).map_err(|_| ExportError::Unsupported("a chunk over 2^63 bytes"));
    let stats = |page_type, encoding, count| PageEncodingStats {
        page_type,
        encoding,
        count,
    };
    let num_values = i64::try_from(rows.len())
        .map_err(|_| ExportError::Unsupported("a row group over 2^63 rows"))?;
    let metadata = ColumnChunkMetaData::builder(descr)
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL)?))
        .set_encodings_mask(EncodingMask::new_from_encodings(
            [Encoding::PLAIN, Encoding::RLE, Encoding::RLE_DICTIONARY].iter(),
        ))
        .set_page_encoding_stats(vec![
            stats(PageType::DICTIONARY_PAGE, Encoding::PLAIN, 1),
            stats(PageType::DATA_PAGE, Encoding::RLE_DICTIONARY, data_pages),
        ])
        .set_total_compressed_size(total(sizes.0)?)
        .set_total_uncompressed_size(total(sizes.1)?)
        .set_num_values(num_values)
        .set_dictionary_page_offset(Some(0))
        .set_data_page_offset(total(first_data_page.unwrap_or(0))?)
        .build()?;
    let bytes = Bytes::from(sink.into_inner()?);
    Ok(EncodedChunk {
        close: ColumnCloseResult {
            bytes_written: bytes.len() as u64,
            rows_written: rows.len() as u64,
            metadata,
            bloom_filter: None,
            column_index: None,
            offset_index: None,
        },
        bytes,
    })
}

/// What a page's header says besides its sizes: its kind and values.
enum Header {
    Dictionary(u32),
    Data(u32),
}

/// The texts, PLAIN-encoded.
fn plain_texts(texts: &[String]) -> Result<Vec<u8>, ExportError> {
    let mut out = Vec::with_capacity(texts.iter().map(|t| 4 + t.len()).sum());
    for text in texts {
        let text = text.as_bytes();
        let len =
            u32::try_from(text.len()).map_err(|_| ExportError::Unsupported("a text over 4 GiB"))?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(text);
    }
    Ok(out)
}

/// Bits an index into a dictionary of `entries` takes (at least 1).
fn index_width(entries: usize) -> u8 {
    let largest = entries.saturating_sub(1) as u64;
    (64 - largest.leading_zeros() as u8).max(1)
}

/// One data page's plain bytes for `rows`.
fn data_page(rows: &[Option<u32>], width: u8, nullable: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() * usize::from(width) / 8 + 64);
    if nullable {
        let levels: Vec<u32> = rows.iter().map(|r| u32::from(r.is_some())).collect();
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        hybrid(&levels, 1, &mut out);
        let len = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    }
    out.push(width);
    let indices: Vec<u32> = rows.iter().flatten().copied().collect();
    hybrid(&indices, width, &mut out);
    out
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// `values` in the RLE/bit-packed hybrid of `width` bits. A run of at
/// least 8 equal values that starts where the literals before it fill
/// whole groups of 8 is a run; the rest are literals.
fn hybrid(values: &[u32], width: u8, out: &mut Vec<u8>) {
    let n = values.len();
    let (mut i, mut literals) = (0, 0);
    while i < n {
        let v = values[i];
        let run = values[i..].iter().take_while(|x| **x == v).count();
        if run < 8 {
            i += run;
        } else if (i - literals) % 8 == 0 {
            bit_packed(&values[literals..i], width, out);
            varint(out, (run as u64) << 1);
            let bytes = usize::from(width).div_ceil(8);
            out.extend_from_slice(&v.to_le_bytes()[..bytes]);
            i += run;
            literals = i;
        } else {
            // The run's first values fill the literals' last group; the
            // rest of it may still be a run.
            i += 8 - (i - literals) % 8;
        }
    }
    bit_packed(&values[literals..], width, out);
}

/// `values` as one literal run (padded with zeros to a group of 8).
fn bit_packed(values: &[u32], width: u8, out: &mut Vec<u8>) {
    if values.is_empty() {
        return;
    }
    let groups = values.len().div_ceil(8);
    varint(out, ((groups as u64) << 1) | 1);
    let (mut bits, mut held) = (0u64, 0u8);
    let padding = std::iter::repeat_n(0, groups * 8 - values.len());
    for v in values.iter().copied().chain(padding) {
        bits |= u64::from(v) << held;
        held += width;
        while held >= 8 {
            out.push(bits as u8);
            bits >>= 8;
            held -= 8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hybrid read back, as the Parquet format describes it (a
    /// decoder written from the format, not from the encoder above).
    fn decode(mut input: &[u8], width: u8, count: usize) -> Vec<u32> {
        let mut out = Vec::new();
        let var = |input: &mut &[u8]| {
            let (mut v, mut shift) = (0u64, 0);
            loop {
                let b = input[0];
                *input = &input[1..];
                v |= u64::from(b & 0x7f) << shift;
                shift += 7;
                if b < 0x80 {
                    return v;
                }
            }
        };
        while out.len() < count {
            let header = var(&mut input);
            if header & 1 == 0 {
                let bytes = usize::from(width).div_ceil(8);
                let mut v = [0u8; 4];
                v[..bytes].copy_from_slice(&input[..bytes]);
                input = &input[bytes..];
                out.extend(std::iter::repeat_n(
                    u32::from_le_bytes(v),
                    (header >> 1) as usize,
                ));
            } else {
                let values = (header >> 1) as usize * 8;
                let mut bit = 0usize;
                for _ in 0..values {
                    let mut v = 0u32;
                    for b in 0..usize::from(width) {
                        let at = bit + b;
                        v |= u32::from((input[at / 8] >> (at % 8)) & 1) << b;
                    }
                    bit += usize::from(width);
                    out.push(v);
                }
                input = &input[values * usize::from(width) / 8..];
            }
        }
        assert!(input.is_empty(), "bytes left over");
        out.truncate(count);
        out
    }

    #[test]
    fn the_hybrid_reads_back_as_written() {
        let runs: Vec<u32> = [
            vec![5; 20],
            (0..13).collect(),
            vec![7; 9],
            vec![1, 2],
            vec![3; 30],
        ]
        .concat();
        let cases: [(&[u32], u8); 6] = [
            (&[], 1),
            (&[1, 0, 1, 1, 0, 0, 0, 1, 1], 1),
            (&[0; 100], 1),
            (&runs, 5),
            (&[1000, 3, 1000, 70_000], 17),
            (&[u32::MAX; 3], 32),
        ];
        for (values, width) in cases {
            let mut out = Vec::new();
            hybrid(values, width, &mut out);
            assert_eq!(decode(&out, width, values.len()), values, "width {width}");
        }
        // Runs become runs: 20 fives cost a header and a byte.
        let mut out = Vec::new();
        hybrid(&[5; 20], 3, &mut out);
        assert_eq!(out, [40, 5]);
    }

    /// A file of one text column written through [`encode`], read back by
    /// the parquet crate's own Arrow reader.
    fn round_trip(
        dictionary: &[&str],
        rows: &[Option<u32>],
        nullable: bool,
    ) -> Vec<Option<String>> {
        use arrow_array::cast::AsArray;
        use arrow_array::types::Int32Type;
        use arrow_schema::{DataType, Field, Schema};
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        use parquet::arrow::ArrowSchemaConverter;
        use parquet::file::properties::WriterProperties;
        use parquet::file::writer::SerializedFileWriter;
        use std::sync::Arc;

        let text = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let schema = Schema::new(vec![Field::new("t", text, nullable)]);
        let parquet_schema = ArrowSchemaConverter::new().convert(&schema).unwrap();
        let mut file = SerializedFileWriter::new(
            Vec::new(),
            parquet_schema.root_schema_ptr(),
            Arc::new(WriterProperties::builder().build()),
        )
        .unwrap();
        let dictionary: Vec<String> = dictionary.iter().map(|t| t.to_string()).collect();
        let chunk = encode(parquet_schema.column(0), &dictionary, rows).unwrap();
        let mut group = file.next_row_group().unwrap();
        group.append_column(&chunk.bytes, chunk.close).unwrap();
        group.close().unwrap();
        let bytes = Bytes::from(file.into_inner().unwrap());
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .unwrap()
            .build()
            .unwrap();
        let mut out = Vec::new();
        for batch in reader {
            let batch = batch.unwrap();
            let column = batch.column(0);
            let strings: Vec<Option<String>> = match column.data_type() {
                DataType::Dictionary(..) => {
                    let d = column.as_dictionary::<Int32Type>();
                    let values = d.values().as_string::<i32>();
                    d.keys()
                        .iter()
                        .map(|k| k.map(|k| values.value(k as usize).to_string()))
                        .collect()
                }
                _ => column
                    .as_string::<i32>()
                    .iter()
                    .map(|s| s.map(str::to_string))
                    .collect(),
            };
            out.extend(strings);
        }
        out
    }

    #[test]
    fn a_chunk_reads_back_as_its_texts() {
        let dictionary = ["a", "bb", "ccc", "\u{e9}t\u{e9}"];
        // Over two pages, with runs, literals and nulls between them.
        let rows: Vec<Option<u32>> = (0..45_000u32)
            .map(|i| match i % 1000 {
                0..=499 => Some(1),
                500..=509 => None,
                _ => Some(i % 4),
            })
            .collect();
        let expect: Vec<Option<String>> = rows
            .iter()
            .map(|r| r.map(|i| dictionary[i as usize].to_string()))
            .collect();
        assert_eq!(round_trip(&dictionary, &rows, true), expect);
        let all: Vec<Option<u32>> = rows.iter().map(|r| Some(r.unwrap_or(3))).collect();
        let expect: Vec<Option<String>> = all
            .iter()
            .map(|r| r.map(|i| dictionary[i as usize].to_string()))
            .collect();
        assert_eq!(round_trip(&dictionary, &all, false), expect);
        assert_eq!(round_trip(&["x"], &[None; 5], true), vec![None; 5]);
        assert!(
            encode_refuses_null_where_not_nullable(),
            "a null in a required column is an error"
        );
    }

    fn encode_refuses_null_where_not_nullable() -> bool {
        use arrow_schema::{DataType, Field, Schema};
        use parquet::arrow::ArrowSchemaConverter;
        let schema = Schema::new(vec![Field::new("t", DataType::Utf8, false)]);
        let parquet_schema = ArrowSchemaConverter::new().convert(&schema).unwrap();
        encode(parquet_schema.column(0), &["x".to_string()], &[None]).is_err()
    }

    #[test]
    fn an_index_takes_the_bits_of_the_largest() {
        assert_eq!(index_width(0), 1);
        assert_eq!(index_width(1), 1);
        assert_eq!(index_width(2), 1);
        assert_eq!(index_width(3), 2);
        assert_eq!(index_width(256), 8);
        assert_eq!(index_width(257), 9);
    }
}
