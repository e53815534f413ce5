//! The register columns: each register's value after each step that
//! changed it, null elsewhere.
//!
//! The rows hold a mask of the registers each step changed and their
//! values, row after row. [`RegisterColumns`] splits them into a column
//! per register in one pass over the rows (a pass per register, each
//! over every row's mask and where its values start, was a tenth of an
//! export).
//!
//! | column | dictionary page | data page, per `ROWS_PER_PAGE` rows |
//! |---|---|---|
//! | general register ([`RegisterPages`]) | none | the definition levels as one literal run of bit width 1 (see `chunks::levels_header`); then the values of the rows that have one, u64 LE (PLAIN) |
//! | RFLAGS ([`FlagsPages`]) | each distinct value, u64 LE (PLAIN) | the levels as above; then a byte of bit width and the rows' indices in the hybrid (RLE_DICTIONARY) |
//!
//! RFLAGS takes a few distinct values: a dictionary of them is about half
//! the size of the values written plain (measured), worth the hashing;
//! the general registers' values are written plain.

use std::ops::Range;

use parquet::basic::Encoding;
use parquet::file::statistics::Statistics;
use rustc_hash::FxHashMap;
use vtrace_storage::REG_COUNT;

use super::chunks::{hybrid, index_width, levels_header, ColumnPages, ROWS_PER_PAGE};
use super::rows::{registers_in, SegmentRows};
use super::ExportError;

/// RFLAGS' index in `REG_NAMES`, after the 16 general registers.
pub(super) const FLAGS: usize = REG_COUNT - 1;

/// Each register's column of a segment's rows.
pub(super) struct RegisterColumns {
    rows: usize,
    /// Per register: a bit a row (least significant first), set where
    /// the row has a value, as a literal run of levels holds them.
    levels: Vec<Vec<u8>>,
    /// Per register: the values of the rows that have one, in order.
    values: Vec<Vec<u64>>,
    /// Per register: where each page's values start in `values`, and
    /// where the last ends.
    page_starts: Vec<Vec<usize>>,
}

impl RegisterColumns {
    /// The registers' columns of `rows`.
    pub fn new(rows: &SegmentRows) -> Self {
        let n = rows.changed.len();
        // Each column's values, counted first, in a loop the compiler
        // makes vector instructions of; then each written in place (a
        // push a value, each checking its column's capacity, was half of
        // this).
        let mut counts = [0u32; REG_COUNT];
        for mask in &rows.changed {
            for (reg, count) in counts.iter_mut().enumerate() {
                *count += (mask >> reg) & 1;
            }
        }
        let mut values: Vec<Vec<u64>> = counts.iter().map(|c| vec![0; *c as usize]).collect();
        let mut levels = vec![vec![0u8; n.div_ceil(8)]; REG_COUNT];
        let mut written = [0usize; REG_COUNT];
        let mut page_starts: Vec<Vec<usize>> = (0..REG_COUNT)
            .map(|_| Vec::with_capacity(n / ROWS_PER_PAGE + 2))
            .collect();
        // Row 0 holds every register, in order; each other row, those its
        // mask names, in order (see `SegmentRows`): a cursor walks them.
        let mut cursor = 0;
        for (page, masks) in rows.changed.chunks(ROWS_PER_PAGE).enumerate() {
            for (starts, at) in page_starts.iter_mut().zip(written) {
                starts.push(at);
            }
            for (i, mask) in masks.iter().enumerate() {
                let row = page * ROWS_PER_PAGE + i;
                let (byte, bit) = (row / 8, 1 << (row % 8));
                let first = cursor;
                for reg in registers_in(*mask) {
                    let slot = if row == 0 { first + reg } else { cursor };
                    cursor += 1;
                    let (Some(at), Some(column), Some(levels)) = (
                        written.get_mut(reg),
                        values.get_mut(reg),
                        levels.get_mut(reg),
                    ) else {
                        continue;
                    };
                    if let (Some(v), Some(to)) = (rows.values.get(slot), column.get_mut(*at)) {
                        *to = *v;
                        *at += 1;
                        levels[byte] |= bit;
                    }
                }
                // Row 0 stored all of them (the others, what their masks
                // name: counted above without a popcount, which the
                // baseline x86-64 target has no instruction for).
                if row == 0 {
                    cursor = first + rows.stored(0);
                }
            }
        }
        for ((starts, at), column) in page_starts.iter_mut().zip(written).zip(&mut values) {
            starts.push(at);
            // Short only where the rows lack values their masks name.
            column.truncate(at);
        }
        RegisterColumns {
            rows: n,
            levels,
            values,
            page_starts,
        }
    }

    /// Register `reg`'s levels and values of `rows` (a page: at most
    /// [`ROWS_PER_PAGE`], starting at a multiple of it).
    fn page(&self, reg: usize, rows: &Range<usize>) -> (&[u8], &[u64]) {
        let page = rows.start / ROWS_PER_PAGE;
        let levels = self.levels.get(reg).map_or(&[][..], |l| {
            l.get(rows.start / 8..rows.end.div_ceil(8))
                .unwrap_or_default()
        });
        let values = match (self.values.get(reg), self.page_starts.get(reg)) {
            (Some(v), Some(s)) => match (s.get(page), s.get(page + 1)) {
                (Some(from), Some(to)) => v.get(*from..*to).unwrap_or_default(),
                _ => &[],
            },
            _ => &[],
        };
        (levels, values)
    }

    /// A data page's levels of `rows` of register `reg`, as `chunks`
    /// writes them.
    fn put_levels(&self, reg: usize, rows: &Range<usize>, out: &mut Vec<u8>) {
        let at = levels_header(rows.len(), out);
        let (levels, _) = self.page(reg, rows);
        let end = out.len().min(at + levels.len());
        out[at..end].copy_from_slice(&levels[..end - at]);
    }
}

/// A general register's column.
pub(super) struct RegisterPages<'a> {
    columns: &'a RegisterColumns,
    /// The register, in `REG_NAMES` order.
    register: usize,
}

impl<'a> RegisterPages<'a> {
    /// Register `register`'s column.
    pub fn new(columns: &'a RegisterColumns, register: usize) -> Self {
        RegisterPages { columns, register }
    }
}

impl ColumnPages for RegisterPages<'_> {
    fn rows(&self) -> usize {
        self.columns.rows
    }

    fn encoding(&self) -> Encoding {
        Encoding::PLAIN
    }

    fn data_page(&self, rows: Range<usize>) -> (Vec<u8>, u32) {
        // At most ROWS_PER_PAGE.
        let count = rows.len() as u32;
        let (_, values) = self.columns.page(self.register, &rows);
        let mut out = Vec::with_capacity(rows.len() / 8 + values.len() * 8 + 64);
        self.columns.put_levels(self.register, &rows, &mut out);
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
        (out, count)
    }
}

/// The RFLAGS column, as a dictionary of its distinct values.
pub(super) struct FlagsPages<'a> {
    columns: &'a RegisterColumns,
    distinct: Vec<u64>,
    /// Each value's index in `distinct`, in the order of the values.
    keys: Vec<u32>,
}

impl<'a> FlagsPages<'a> {
    /// The RFLAGS column of `columns`.
    pub fn new(columns: &'a RegisterColumns) -> Result<Self, ExportError> {
        let values = columns.values.get(FLAGS).map_or(&[][..], Vec::as_slice);
        let mut index = FxHashMap::default();
        let mut distinct = Vec::new();
        // Runs of one value are common: the last value's key is at hand.
        let mut last: Option<(u64, u32)> = None;
        let keys = values
            .iter()
            .map(|v| match last {
                Some((value, key)) if value == *v => key,
                _ => {
                    let key = *index.entry(*v).or_insert_with(|| {
                        distinct.push(*v);
                        // Fewer distinct values than a segment's rows.
                        (distinct.len() - 1) as u32
                    });
                    last = Some((*v, key));
                    key
                }
            })
            .collect();
        if u32::try_from(distinct.len()).is_err() {
            return Err(ExportError::Unsupported(
                "an RFLAGS column with over 2^32 distinct values",
            ));
        }
        Ok(FlagsPages {
            columns,
            distinct,
            keys,
        })
    }
}

impl ColumnPages for FlagsPages<'_> {
    fn rows(&self) -> usize {
        self.columns.rows
    }

    fn dictionary(&self) -> Result<Option<(Vec<u8>, u32)>, ExportError> {
        let plain = self.distinct.iter().flat_map(|v| v.to_le_bytes()).collect();
        // Checked in `new`.
        Ok(Some((plain, self.distinct.len() as u32)))
    }

    fn encoding(&self) -> Encoding {
        Encoding::RLE_DICTIONARY
    }

    fn data_page(&self, rows: Range<usize>) -> (Vec<u8>, u32) {
        // At most ROWS_PER_PAGE.
        let count = rows.len() as u32;
        let page = rows.start / ROWS_PER_PAGE;
        let keys = match self.columns.page_starts.get(FLAGS) {
            Some(s) => match (s.get(page), s.get(page + 1)) {
                (Some(from), Some(to)) => self.keys.get(*from..*to).unwrap_or_default(),
                _ => &[],
            },
            None => &[],
        };
        let mut out = Vec::with_capacity(rows.len() / 8 + keys.len() * 2 + 64);
        self.columns.put_levels(FLAGS, &rows, &mut out);
        let width = index_width(self.distinct.len());
        out.push(width);
        hybrid(keys, width, &mut out);
        (out, count)
    }

    fn statistics(&self) -> Option<Statistics> {
        let lo = self.distinct.iter().min().map(|v| *v as i64);
        let hi = self.distinct.iter().max().map(|v| *v as i64);
        let nulls = self.columns.rows - self.keys.len();
        // Unsigned values as their bits, as arrow-rs writes them.
        Some(Statistics::int64(lo, hi, None, Some(nulls as u64), false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunks::{encode, tests::read_back};
    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    use arrow_schema::{DataType, Field};

    /// Rows over two pages and a bit: row 0 holds all 17 registers; the
    /// rest, the ones their mask names, in register order.
    fn rows() -> SegmentRows {
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
                .extend((0..mask.count_ones() as u64).map(|i| row % 3 * 100 + i));
        }
        rows
    }

    /// Each row's value of `register`, read back.
    fn read(pages: &impl ColumnPages) -> Vec<Option<u64>> {
        read_back(Field::new("r", DataType::UInt64, true), |descr| {
            encode(descr, pages).unwrap()
        })
        .iter()
        .flat_map(|a| a.as_primitive::<UInt64Type>().iter().collect::<Vec<_>>())
        .collect()
    }

    /// Each row's value of `register` as the rows hold it.
    fn want(rows: &SegmentRows, register: usize) -> Vec<Option<u64>> {
        let mut cursor = 0;
        (0..rows.changed.len())
            .map(|row| {
                let v = rows.register(row, cursor, register);
                cursor += rows.stored(row);
                v
            })
            .collect()
    }

    #[test]
    fn a_register_reads_back_where_its_steps_changed_it() {
        let rows = rows();
        let columns = RegisterColumns::new(&rows);
        for register in [0, 1, 2, 3, 15] {
            let want = want(&rows, register);
            assert_eq!(read(&RegisterPages::new(&columns, register)), want);
            assert_eq!(want[0].is_some(), register == 0 || register == 2);
        }
        assert!(want(&rows, 3).iter().flatten().count() > 1000);
    }

    #[test]
    fn rflags_read_back_from_their_dictionary_with_their_statistics() {
        let rows = rows();
        let columns = RegisterColumns::new(&rows);
        let pages = FlagsPages::new(&columns).unwrap();
        let want = want(&rows, FLAGS);
        assert_eq!(read(&pages), want);
        assert_eq!(pages.distinct.len(), 4, "row 0's, then 1, 101 and 201");
        let Some(Statistics::Int64(s)) = pages.statistics() else {
            panic!("INT64 statistics");
        };
        let nulls = want.iter().filter(|v| v.is_none()).count() as u64;
        assert_eq!(
            (s.min_opt(), s.max_opt(), s.null_count_opt()),
            (Some(&1), Some(&1016), Some(nulls))
        );
    }
}
