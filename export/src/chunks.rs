//! Column chunks written by hand: [`encode`] puts a column's pages
//! together through the parquet crate's own page writer (data pages v1),
//! and the encodings they share are written here (the definition levels,
//! the RLE/bit-packed hybrid, DELTA_BINARY_PACKED). The columns' pages
//! are made in `keys` (the text columns and the dictionaries of numbers
//! the rows index), `registers`, `numbers`, `access_lists` and
//! `event_lists`.
//!
//! arrow-rs's writer was about a third of an export here. Given the text
//! columns as Arrow dictionaries, it looked every row's string up in a
//! hash table of its own to find the index again (about a tenth:
//! hashing, then comparing on each hit). The registers are a mask of
//! those a step changed and their values: arrow-rs wanted a zeroed
//! column and a null bitmap per register, then worked the definition
//! levels back out of the bitmaps and compared every value for min/max
//! statistics no query prunes by. The accesses are flat vectors with
//! each row's end: arrow-rs wanted list arrays and worked their levels
//! out again (another tenth). arrow-rs's value encoders are private to
//! the crate, so the chunks are put together here.
//!
//! | levels | |
//! |---|---|
//! | definition levels ([`levels_header`]) | u32 LE length, then the levels (1 = a value, 0 = null) as one literal run of bit width 1 |
//! | list levels ([`packed_levels`]) | u32 LE length and the repetition levels (0 = a row's first entry, 1 = another item) as one literal run of width 1; the same for the definition levels, width 2 |
//!
//! Each page is zstd-compressed on its own, as the rest of the file is.
//! The RLE/bit-packed hybrid: a run of one value is `varint(count << 1)`
//! and the value in whole bytes; a run of literals is `varint(groups << 1
//! | 1)` and groups of 8 values, each `width` bits, least significant
//! first; only the last group may be padded. DELTA_BINARY_PACKED: see
//! [`delta_binary_packed`].

use std::ops::Range;

use bytes::Bytes;
use parquet::basic::{Compression, Encoding, EncodingMask, PageType, ZstdLevel};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::{ColumnChunkMetaData, PageEncodingStats};
use parquet::file::statistics::Statistics;
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;

use super::ExportError;
use rustc_hash::FxHashMap;
use vtrace_storage::put_varint as varint;

/// Rows a data page holds at most: a register page of 64 Ki rows is at
/// most 0.5 MiB, about the size of the pages arrow-rs writes here.
pub(super) const ROWS_PER_PAGE: usize = 1 << 16;

/// zstd's level, as for the file's other columns.
pub(super) const ZSTD_LEVEL: i32 = 3;

/// A column chunk encoded: its bytes and what the row group writer
/// needs to append it (`SerializedRowGroupWriter::append_column`).
pub(super) struct EncodedChunk {
    pub bytes: Bytes,
    pub close: ColumnCloseResult,
}

/// A column's pages, asked for one at a time by [`encode`].
pub(super) trait ColumnPages: Sync {
    /// Rows in the column.
    fn rows(&self) -> usize;
    /// The dictionary page's plain bytes and its number of entries, where
    /// the column has one (none by default).
    fn dictionary(&self) -> Result<Option<(Vec<u8>, u32)>, ExportError> {
        Ok(None)
    }
    /// How the data pages' values are encoded.
    fn encoding(&self) -> Encoding;
    /// The plain bytes (levels and values) of the data page of `rows`,
    /// and its number of values as Parquet counts them: one per row, or
    /// for a list one per item, and one for a null or empty list.
    fn data_page(&self, rows: Range<usize>) -> (Vec<u8>, u32);
    /// The chunk's min, max and nulls, where a query may prune by them.
    fn statistics(&self) -> Option<Statistics> {
        None
    }
}

thread_local! {
    /// Each encoding thread's compressor: a new one zeroes zstd's tables
    /// (about 1 % of an export where each chunk made its own).
    static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// `plain` compressed at [`ZSTD_LEVEL`] with this thread's compressor.
fn compressed(plain: &[u8]) -> Result<Vec<u8>, ExportError> {
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let compressor = match slot.as_mut() {
            Some(c) => c,
            None => slot.insert(zstd::bulk::Compressor::new(ZSTD_LEVEL)?),
        };
        Ok(compressor.compress(plain)?)
    })
}

/// Encodes `column` as the chunk of column `descr`.
pub(super) fn encode(
    descr: ColumnDescPtr,
    column: &(impl ColumnPages + ?Sized),
) -> Result<EncodedChunk, ExportError> {
    let mut sink = TrackedWrite::new(Vec::new());
    let mut pages = SerializedPageWriter::new(&mut sink);
    let dictionary = column.dictionary()?;
    let value_encoding = column.encoding();
    let mut sizes = (0u64, 0u64);
    let mut page = |page_writer: &mut SerializedPageWriter<'_, Vec<u8>>,
                    plain: Vec<u8>,
                    header: Header|
     -> Result<u64, ExportError> {
        let uncompressed = plain.len();
        let buf = Bytes::from(compressed(&plain)?);
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
                encoding: value_encoding,
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

    let stats = |page_type, encoding, count| PageEncodingStats {
        page_type,
        encoding,
        count,
    };
    let mut encoding_stats = Vec::new();
    let mut encodings = vec![Encoding::RLE, value_encoding];
    let dictionary_offset = match dictionary {
        Some((plain, entries)) => {
            encodings.push(Encoding::PLAIN);
            encoding_stats.push(stats(PageType::DICTIONARY_PAGE, Encoding::PLAIN, 1));
            Some(page(&mut pages, plain, Header::Dictionary(entries))?)
        }
        None => None,
    };
    let rows = column.rows();
    let mut data_pages = 0;
    let mut first_data_page = None;
    let mut values = 0u64;
    for start in (0..rows).step_by(ROWS_PER_PAGE) {
        let end = rows.min(start + ROWS_PER_PAGE);
        let (plain, count) = column.data_page(start..end);
        let offset = page(&mut pages, plain, Header::Data(count))?;
        first_data_page.get_or_insert(offset);
        data_pages += 1;
        values += u64::from(count);
    }
    pages.close()?;
    encoding_stats.push(stats(PageType::DATA_PAGE, value_encoding, data_pages));

    let total =
        |n: u64| i64::try_from(n).map_err(|_| ExportError::Unsupported("a chunk over 2^63 bytes"));
    let num_values = total(values)?;
    let dictionary_offset = dictionary_offset.map(total).transpose()?;
    let metadata = ColumnChunkMetaData::builder(descr)
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL)?))
        .set_encodings_mask(EncodingMask::new_from_encodings(encodings.iter()))
        .set_page_encoding_stats(encoding_stats)
        .set_total_compressed_size(total(sizes.0)?)
        .set_total_uncompressed_size(total(sizes.1)?)
        .set_num_values(num_values)
        .set_dictionary_page_offset(dictionary_offset)
        .set_data_page_offset(total(first_data_page.unwrap_or(0))?);
    let metadata = match column.statistics() {
        Some(statistics) => metadata.set_statistics(statistics),
        None => metadata,
    }
    .build()?;
    let bytes = Bytes::from(sink.into_inner()?);
    Ok(EncodedChunk {
        close: ColumnCloseResult {
            bytes_written: bytes.len() as u64,
            rows_written: rows as u64,
            metadata,
            bloom_filter: None,
            column_index: None,
            offset_index: None,
        },
        bytes,
    })
}

/// `levels` of `width` bits (1 or 2) as a data page v1 holds them: a
/// length, then one literal run of the hybrid.
pub(super) fn packed_levels(levels: &[u8], width: u8, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    varint(out, ((levels.len().div_ceil(8) as u64) << 1) | 1);
    for group in levels.chunks(8) {
        let bits = group.iter().enumerate().fold(0u16, |bits, (i, l)| {
            bits | u16::from(*l) << (i * usize::from(width))
        });
        // Fixed-size copies: a slice of `width` bytes was a memcpy call a
        // group.
        match width {
            1 => out.push(bits as u8),
            _ => out.extend_from_slice(&bits.to_le_bytes()),
        }
    }
    // A page's levels take far fewer than 4 GiB.
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// Whether `remap` (from [`distinct`]) maps each item to itself: the list
/// held each once.
pub(super) fn is_identity(remap: &[u32]) -> bool {
    remap.iter().zip(0u32..).all(|(to, from)| *to == from)
}

/// The distinct items of `list`, in order of first appearance, and each
/// item's index among them: a column's dictionary, where its rows index
/// a list that may repeat an item (two routines of one name, two texts
/// of one pc). Parquet's dictionary is of distinct values.
pub(super) fn distinct<K: Copy + Eq + std::hash::Hash>(
    list: impl IntoIterator<Item = K>,
) -> (Vec<K>, Vec<u32>) {
    let mut seen = FxHashMap::default();
    let mut distinct = Vec::new();
    let remap = list
        .into_iter()
        .map(|item| {
            *seen.entry(item).or_insert_with(|| {
                distinct.push(item);
                // Fewer distinct items than a segment's rows.
                (distinct.len() - 1) as u32
            })
        })
        .collect();
    (distinct, remap)
}

/// Whether `ends`, each row's end in a flat vector of `len` items (as
/// the rows hold instruction bytes, events and accesses), go in order
/// and stay within it.
pub(super) fn ends_fit(ends: &[u32], len: usize) -> bool {
    ends.windows(2).all(|w| w[0] <= w[1]) && ends.last().is_none_or(|e| *e as usize <= len)
}

/// Where row `row`'s items start in a flat vector that `ends` cuts into
/// rows: where the row before ends.
pub(super) fn start_of(ends: &[u32], row: usize) -> usize {
    row.checked_sub(1)
        .and_then(|before| ends.get(before))
        .map_or(0, |e| *e as usize)
}

/// Starts a data page v1's definition levels for `rows` rows as one
/// literal run of bit width 1 (a length, the run's header, zeroed bytes
/// for the bits): returns where the bits start, for the caller to set
/// the present rows' (zstd packs long stretches of one level as well as
/// the hybrid's runs would).
pub(super) fn levels_header(rows: usize, out: &mut Vec<u8>) -> usize {
    let groups = rows.div_ceil(8);
    let mut header = Vec::new();
    varint(&mut header, ((groups as u64) << 1) | 1);
    // A page's levels take far fewer than 4 GiB.
    let len = (header.len() + groups) as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&header);
    let at = out.len();
    out.resize(at + groups, 0);
    at
}

/// What a page's header says besides its sizes: its kind and values.
enum Header {
    Dictionary(u32),
    Data(u32),
}

/// The texts, PLAIN-encoded.
pub(super) fn plain_texts(texts: &[&[u8]]) -> Result<Vec<u8>, ExportError> {
    let mut out = Vec::with_capacity(texts.iter().map(|t| 4 + t.len()).sum());
    for text in texts {
        let len =
            u32::try_from(text.len()).map_err(|_| ExportError::Unsupported("a text over 4 GiB"))?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(text);
    }
    Ok(out)
}

/// Bits an index into a dictionary of `entries` takes (at least 1).
pub(super) fn index_width(entries: usize) -> u8 {
    let largest = entries.saturating_sub(1) as u64;
    (64 - largest.leading_zeros() as u8).max(1)
}

/// `values` (INT64s) in DELTA_BINARY_PACKED: a header (block size 128,
/// 4 miniblocks of 32, the count, the first value zigzagged), then per
/// block of 128 deltas its least delta (zigzagged), the 4 miniblocks' bit
/// widths, and each miniblock's deltas less the least, bit-packed (the
/// last one padded to 32; widths of miniblocks past the end are 0).
pub(super) fn delta_binary_packed(values: &[u64], out: &mut Vec<u8>) {
    const BLOCK: usize = 128;
    const MINIBLOCKS: usize = 4;
    const PER_MINIBLOCK: usize = BLOCK / MINIBLOCKS;
    let zigzag = |v: i64| ((v << 1) ^ (v >> 63)) as u64;
    varint(out, BLOCK as u64);
    varint(out, MINIBLOCKS as u64);
    varint(out, values.len() as u64);
    varint(out, zigzag(values.first().map_or(0, |v| *v as i64)));
    // A block's deltas at a time, in place (a vector of all of them, and
    // two a block, were most of a step column's time).
    let mut deltas = [0i64; BLOCK];
    let mut start = 0;
    while start + 1 < values.len() {
        let end = values.len().min(start + BLOCK + 1);
        let pairs = values[start..end].windows(2);
        for (d, w) in deltas.iter_mut().zip(pairs) {
            *d = w[1].wrapping_sub(w[0]) as i64;
        }
        let block = &deltas[..end - start - 1];
        start = end - 1;
        let least = block.iter().copied().min().unwrap_or(0);
        varint(out, zigzag(least));
        let mut widths = [0u8; MINIBLOCKS];
        for (width, mini) in widths.iter_mut().zip(block.chunks(PER_MINIBLOCK)) {
            let most = mini.iter().fold(0, |m, d| m | d.wrapping_sub(least) as u64);
            *width = (64 - most.leading_zeros()) as u8;
        }
        out.extend_from_slice(&widths);
        for (mini, width) in block.chunks(PER_MINIBLOCK).zip(widths) {
            // Steps and times count up by one: their deltas less the
            // least take no bits.
            if width == 0 {
                continue;
            }
            let (mut bits, mut held) = (0u128, 0u32);
            let padding = std::iter::repeat_n(&least, PER_MINIBLOCK - mini.len());
            for d in mini.iter().chain(padding) {
                bits |= u128::from(d.wrapping_sub(least) as u64) << held;
                held += u32::from(width);
                while held >= 8 {
                    out.push(bits as u8);
                    bits >>= 8;
                    held -= 8;
                }
            }
        }
    }
}

/// `values` in the RLE/bit-packed hybrid of `width` bits. A run of at
/// least 8 equal values that starts where the literals before it fill
/// whole groups of 8 is a run; the rest are literals.
pub(super) fn hybrid(values: &[u32], width: u8, out: &mut Vec<u8>) {
    let n = values.len();
    let (mut i, mut literals) = (0, 0);
    while i < n {
        let v = values[i];
        // Most values differ from the next (a pc, an instruction): no run
        // to measure.
        if values.get(i + 1) != Some(&v) {
            i += 1;
            continue;
        }
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
    let w = usize::from(width);
    // A group of 8 values of `width` bits is `width` bytes: where that
    // fits a u128, a group at a time (dictionary indices, the common
    // case), else a byte at a time.
    if w <= 16 {
        for group in values.chunks(8) {
            let bits = group
                .iter()
                .enumerate()
                .fold(0u128, |bits, (i, v)| bits | u128::from(*v) << (i * w));
            // A fixed-size copy, cut back: not a memcpy call a group.
            let at = out.len();
            out.extend_from_slice(&bits.to_le_bytes());
            out.truncate(at + w);
        }
        return;
    }
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
pub(super) mod tests {
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

    /// A file of one column `field` written through [`encode`] from
    /// `pages`, read back by the parquet crate's own Arrow reader.
    pub(crate) fn read_back(
        field: arrow_schema::Field,
        pages: impl FnOnce(ColumnDescPtr) -> EncodedChunk,
    ) -> Vec<arrow_array::ArrayRef> {
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        use parquet::arrow::ArrowSchemaConverter;
        use parquet::file::properties::WriterProperties;
        use parquet::file::writer::SerializedFileWriter;
        use std::sync::Arc;

        let schema = arrow_schema::Schema::new(vec![field]);
        let parquet_schema = ArrowSchemaConverter::new().convert(&schema).unwrap();
        let mut file = SerializedFileWriter::new(
            Vec::new(),
            parquet_schema.root_schema_ptr(),
            Arc::new(WriterProperties::builder().build()),
        )
        .unwrap();
        let chunk = pages(parquet_schema.column(0));
        let mut group = file.next_row_group().unwrap();
        group.append_column(&chunk.bytes, chunk.close).unwrap();
        group.close().unwrap();
        let bytes = Bytes::from(file.into_inner().unwrap());
        ParquetRecordBatchReaderBuilder::try_new(bytes)
            .unwrap()
            .build()
            .unwrap()
            .map(|batch| batch.unwrap().column(0).clone())
            .collect()
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
