//! Column chunks written by hand, for the columns whose rows already say
//! what Parquet stores: [`encode`] (every column's pages, through the
//! parquet crate's own page writer), the text columns and the general
//! registers; the memory-access lists are built in `access_lists`, the
//! numbers and bytes in `numbers`, the events in `event_lists`, each
//! with the levels and hybrid written here.
//!
//! The rows hold each text as an index into a list of distinct texts
//! (routine, comm, mnemonic, instruction). Given those columns as Arrow
//! dictionaries, arrow-rs's writer looks every row's string up in a hash
//! table of its own to find the index again (about a tenth of an export:
//! hashing, then comparing on each hit). The registers are a mask of
//! those a step changed and their values: arrow-rs wanted a zeroed
//! column and a null bitmap per register, then worked the definition
//! levels back out of the bitmaps and compared every value for min/max
//! statistics no query prunes by. The accesses are flat vectors with
//! each row's end: arrow-rs wanted list arrays and worked their levels
//! out again (another tenth). arrow-rs's value encoders are private to
//! the crate, so these chunks are put together here, pages through the
//! parquet crate's own page writer (data pages v1):
//!
//! | column | dictionary page | data page, per [`ROWS_PER_PAGE`] rows |
//! |---|---|---|
//! | text ([`TextPages`]) | each distinct text: u32 LE length, then its bytes (PLAIN) | nullable columns: u32 LE length, then the definition levels (1 = a value, 0 = null) as one literal run of bit width 1; then a byte of bit width and the non-null rows' indices in the hybrid (RLE_DICTIONARY) |
//! | register ([`RegisterPages`]) | none | the definition levels as above; then each value of the rows that have one, u64 LE (PLAIN) |
//! | list levels ([`packed_levels`]) | | u32 LE length and the repetition levels (0 = a row's first entry, 1 = another item) as one literal run of width 1; the same for the definition levels, width 2 |
//!
//! Each page is zstd-compressed on its own, as the rest of the file is;
//! these chunks carry no min/max statistics. The RLE/bit-packed hybrid:
//! a run of one value is `varint(count << 1)` and the value in whole
//! bytes; a run of literals is `varint(groups << 1 | 1)` and groups of 8
//! values, each `width` bits, least significant first; only the last
//! group may be padded. DELTA_BINARY_PACKED: see [`delta_binary_packed`].

use std::ops::Range;

use bytes::Bytes;
use parquet::basic::{Compression, Encoding, EncodingMask, PageType, ZstdLevel};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::{ColumnChunkMetaData, PageEncodingStats};
use parquet::file::statistics::Statistics;
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;

use super::rows::SegmentRows;
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
    column: &impl ColumnPages,
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

/// A text column: indices into a list of texts, which may repeat one
/// (two routines of one name, a task named again, a mnemonic at many
/// addresses). The dictionary page holds each text once, and the indices
/// are mapped to it: Parquet's dictionary is of distinct values, and
/// readers that build a lookup from it go wrong on repeats (pyarrow
/// dropped them and read indices past its end).
pub(super) struct TextPages<'a> {
    /// Each distinct text, in order of first appearance in the list.
    distinct: Vec<&'a [u8]>,
    /// Each list entry's index in `distinct`.
    remap: Vec<u32>,
    /// Each row's index into the list, or `None` for null.
    rows: &'a [Option<u32>],
    /// Whether the column's field is nullable (a column that is not has
    /// no `None`: [`TextPages::new`] checks).
    nullable: bool,
}

impl<'a> TextPages<'a> {
    /// The text column `rows` of `texts`, for the column `descr` (UTF-8
    /// or any byte strings).
    pub fn new<T: AsRef<[u8]>>(
        descr: &ColumnDescPtr,
        texts: &'a [T],
        rows: &'a [Option<u32>],
    ) -> Result<Self, ExportError> {
        let nullable = descr.max_def_level() > 0;
        // One pass without branches for both checks (two passes that
        // stopped at the first offender were 1 % of an export).
        let (nulls, largest) = rows.iter().fold((0usize, 0u32), |(nulls, largest), row| {
            (
                nulls + usize::from(row.is_none()),
                largest.max(row.unwrap_or(0)),
            )
        });
        if !nullable && nulls > 0 {
            return Err(ExportError::Unsupported(
                "a null in a text column that is not nullable",
            ));
        }
        let named = rows.len() - nulls;
        if named > 0 && largest as usize >= texts.len() {
            return Err(ExportError::Unsupported(
                "a text column's row names no text",
            ));
        }
        let (distinct, remap) = distinct(texts.iter().map(AsRef::as_ref));
        Ok(TextPages {
            distinct,
            remap,
            rows,
            nullable,
        })
    }
}

impl ColumnPages for TextPages<'_> {
    fn rows(&self) -> usize {
        self.rows.len()
    }

    fn dictionary(&self) -> Result<Option<(Vec<u8>, u32)>, ExportError> {
        let entries = u32::try_from(self.distinct.len())
            .map_err(|_| ExportError::Unsupported("a text column with over 2^32 distinct texts"))?;
        Ok(Some((plain_texts(&self.distinct)?, entries)))
    }

    fn encoding(&self) -> Encoding {
        Encoding::RLE_DICTIONARY
    }

    fn data_page(&self, rows: Range<usize>) -> (Vec<u8>, u32) {
        let rows = &self.rows[rows];
        let width = index_width(self.distinct.len());
        let mut out = Vec::with_capacity(rows.len() * usize::from(width) / 8 + 64);
        if self.nullable {
            let at = levels_header(rows.len(), &mut out);
            for (i, row) in rows.iter().enumerate() {
                if row.is_some() {
                    out[at + i / 8] |= 1 << (i % 8);
                }
            }
        }
        out.push(width);
        // Every index is in the list (checked in `new`).
        let indices: Vec<u32> = rows
            .iter()
            .flatten()
            .map(|i| self.remap.get(*i as usize).copied().unwrap_or(0))
            .collect();
        hybrid(&indices, width, &mut out);
        // At most ROWS_PER_PAGE.
        (out, rows.len() as u32)
    }
}

/// One register's column: its value after each step that changed it,
/// null elsewhere.
pub(super) struct RegisterPages<'a> {
    rows: &'a SegmentRows,
    /// Where each row's values start in [`SegmentRows::values`].
    starts: &'a [usize],
    /// The register, in `REG_NAMES` order.
    register: usize,
}

impl<'a> RegisterPages<'a> {
    /// Register `register`'s column of `rows`; `starts` from
    /// [`value_starts`].
    pub fn new(rows: &'a SegmentRows, starts: &'a [usize], register: usize) -> Self {
        RegisterPages {
            rows,
            starts,
            register,
        }
    }
}

/// Where each row's register values start in [`SegmentRows::values`],
/// a row each.
pub(super) fn value_starts(rows: &SegmentRows) -> Vec<usize> {
    let mut at = 0usize;
    (0..rows.changed.len())
        .map(|row| {
            let start = at;
            at += rows.stored(row);
            start
        })
        .collect()
}

impl ColumnPages for RegisterPages<'_> {
    fn rows(&self) -> usize {
        self.starts.len()
    }

    fn encoding(&self) -> Encoding {
        Encoding::PLAIN
    }

    /// The levels and the values in one pass over the rows' masks: a
    /// register's column is 17 times over the rows, so this is the
    /// loop that counts.
    fn data_page(&self, rows: Range<usize>) -> (Vec<u8>, u32) {
        // At most ROWS_PER_PAGE.
        let count = rows.len() as u32;
        let reg = self.register;
        let bit = 1u32 << reg;
        let masks = self.rows.changed.get(rows.clone()).unwrap_or_default();
        let starts = self.starts.get(rows.clone()).unwrap_or_default();
        let mut out = Vec::with_capacity(rows.len() + 64);
        let levels_at = levels_header(rows.len(), &mut out);
        for (i, ((row, mask), start)) in rows.zip(masks).zip(starts).enumerate() {
            if mask & bit == 0 {
                continue;
            }
            // Row 0 holds every register, in order (see `SegmentRows`).
            let slot = if row == 0 {
                reg
            } else {
                (mask & (bit - 1)).count_ones() as usize
            };
            if let Some(v) = self.rows.values.get(start + slot) {
                out[levels_at + i / 8] |= 1 << (i % 8);
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        (out, count)
    }
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
fn plain_texts(texts: &[&[u8]]) -> Result<Vec<u8>, ExportError> {
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
    let deltas: Vec<i64> = values
        .windows(2)
        .map(|w| (w[1] as i64).wrapping_sub(w[0] as i64))
        .collect();
    for block in deltas.chunks(BLOCK) {
        let least = block.iter().copied().min().unwrap_or(0);
        varint(out, zigzag(least));
        let minis: Vec<&[i64]> = block.chunks(PER_MINIBLOCK).collect();
        let widths: Vec<u8> = (0..MINIBLOCKS)
            .map(|m| {
                let most = minis.get(m).map_or(0, |mini| {
                    mini.iter()
                        .map(|d| d.wrapping_sub(least) as u64)
                        .max()
                        .unwrap_or(0)
                });
                (64 - most.leading_zeros()) as u8
            })
            .collect();
        out.extend_from_slice(&widths);
        for (mini, width) in minis.iter().zip(&widths) {
            let (mut bits, mut held) = (0u128, 0u32);
            let padding = std::iter::repeat_n(&least, PER_MINIBLOCK - mini.len());
            for d in mini.iter().chain(padding) {
                bits |= u128::from(d.wrapping_sub(least) as u64) << held;
                held += u32::from(*width);
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
    pub(in crate::export) fn read_back(
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

    /// A text column written and read back.
    fn round_trip(
        dictionary: &[&str],
        rows: &[Option<u32>],
        nullable: bool,
    ) -> Vec<Option<String>> {
        use arrow_array::cast::AsArray;
        use arrow_array::types::Int32Type;
        use arrow_schema::{DataType, Field};

        let text = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let dictionary: Vec<String> = dictionary.iter().map(|t| t.to_string()).collect();
        let arrays = read_back(Field::new("t", text, nullable), |descr| {
            let pages = TextPages::new(&descr, &dictionary, rows).unwrap();
            encode(descr, &pages).unwrap()
        });
        let mut out = Vec::new();
        for column in arrays {
            // The reader gives plain strings: the file has no Arrow schema
            // to say they were a dictionary.
            match column.data_type() {
                DataType::Dictionary(..) => {
                    let d = column.as_dictionary::<Int32Type>();
                    let values = d.values().as_string::<i32>();
                    out.extend(
                        d.keys()
                            .iter()
                            .map(|k| k.map(|k| values.value(k as usize).to_string())),
                    );
                }
                _ => out.extend(
                    column
                        .as_string::<i32>()
                        .iter()
                        .map(|s| s.map(str::to_string)),
                ),
            }
        }
        out
    }

    #[test]
    fn a_register_reads_back_where_its_steps_changed_it() {
        use arrow_array::cast::AsArray;
        use arrow_array::types::UInt64Type;
        use arrow_schema::{DataType, Field};
        use vtrace_storage::REG_COUNT;

        // Row 0 holds all 17 registers; the rest, the ones their mask
        // names, in register order. Over two pages.
        let n = ROWS_PER_PAGE + 1000;
        let mut rows = SegmentRows::default();
        rows.values = (0..REG_COUNT as u64).map(|r| 1000 + r).collect();
        rows.changed.push(0b1_0000_0000_0000_0101);
        for row in 1..n as u64 {
            let mask = match row % 5 {
                0 => 0,
                1 => 0b1,
                2 => 0b1_0000_0000_0000_0001,
                _ => 0b1010,
            };
            rows.changed.push(mask);
            rows.values
                .extend((0..mask.count_ones() as u64).map(|i| row * 100 + i));
        }
        let starts = value_starts(&rows);
        for register in [0, 1, 3, 16] {
            let arrays = read_back(Field::new("r", DataType::UInt64, true), |descr| {
                encode(descr, &RegisterPages::new(&rows, &starts, register)).unwrap()
            });
            let got: Vec<Option<u64>> = arrays
                .iter()
                .flat_map(|a| a.as_primitive::<UInt64Type>().iter().collect::<Vec<_>>())
                .collect();
            let want: Vec<Option<u64>> = (0..n)
                .map(|row| rows.register(row, starts[row], register))
                .collect();
            assert_eq!(got, want, "register {register}");
            assert!(want.iter().flatten().count() > 1000, "register {register}");
        }
    }

    #[test]
    fn a_chunk_reads_back_as_its_texts() {
        use arrow_schema::{DataType, Field, Schema};
        use parquet::arrow::ArrowSchemaConverter;
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
        assert_eq!(
            round_trip(&[], &[None; 5], true),
            vec![None; 5],
            "no texts, all null"
        );
        // A text named twice is one dictionary entry.
        let repeated = ["mov", "ret", "mov", "push", "ret"];
        let rows: Vec<Option<u32>> = (0..100).map(|i| Some(i % 5)).collect();
        let expect: Vec<Option<String>> = rows
            .iter()
            .map(|r| r.map(|i| repeated[i as usize].to_string()))
            .collect();
        assert_eq!(round_trip(&repeated, &rows, false), expect);
        let texts: Vec<String> = repeated.iter().map(|t| t.to_string()).collect();
        let descr = ArrowSchemaConverter::new()
            .convert(&Schema::new(vec![Field::new("t", DataType::Utf8, false)]))
            .unwrap()
            .column(0);
        let pages = TextPages::new(&descr, &texts, &rows).unwrap();
        let (_, entries) = pages.dictionary().unwrap().unwrap();
        assert_eq!(entries, 3, "mov, ret, push");
        assert!(
            TextPages::new(&descr, &texts, &[Some(5)]).is_err(),
            "past the list"
        );
        assert!(
            a_null_is_refused_where_not_nullable(),
            "a null in a required column is an error"
        );
    }

    fn a_null_is_refused_where_not_nullable() -> bool {
        use arrow_schema::{DataType, Field, Schema};
        use parquet::arrow::ArrowSchemaConverter;
        let schema = Schema::new(vec![Field::new("t", DataType::Utf8, false)]);
        let parquet_schema = ArrowSchemaConverter::new().convert(&schema).unwrap();
        let texts = ["x".to_string()];
        TextPages::new(&parquet_schema.column(0), &texts, &[None]).is_err()
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
