//! The dictionary columns whose rows index a list: the text columns
//! ([`TextPages`]: routine, comm, bytes, mnemonic, instruction, system
//! call name), and the number columns made from a list (the pc of the
//! instructions' texts, a task's ids, the system call and interrupt
//! numbers: see `numbers`). [`Keys`] holds each row's index into the
//! list, or [`NO_KEY`] where the row is null, checked once, with the
//! count of rows that have one in each page.
//!
//! The rows hold each text as an index into a list of texts already:
//! the dictionary page holds each distinct text (u32 LE length, then its
//! bytes: PLAIN), and the rows' indices are mapped to it.
//!
//! | data page, per `ROWS_PER_PAGE` rows | |
//! |---|---|
//! | definition levels (nullable columns) | u32 LE length, then the hybrid: a run of one level (`varint(rows << 1)`, a byte 0 or 1) where the page's rows are all null or all named, else one literal run of bit width 1 (see `chunks::levels_header`) |
//! | indices | a byte of bit width, then the named rows' indices in the hybrid (RLE_DICTIONARY) |
//!
//! Most of a trace's steps name no task, make no system call and take no
//! interrupt: a page of such rows is a few bytes, made without a pass
//! over its rows.

use std::borrow::Cow;
use std::ops::Range;

use parquet::basic::Encoding;
use parquet::schema::types::ColumnDescPtr;
use vtrace_storage::put_varint as varint;

use super::chunks::{
    distinct, hybrid, index_width, is_identity, levels_header, plain_texts, ColumnPages,
    ROWS_PER_PAGE,
};
use super::ExportError;

/// A row's key where it has none (null): no list holds as many items as
/// a segment holds bytes.
pub(super) const NO_KEY: u32 = u32::MAX;

/// A column's keys, checked against its list.
#[derive(Clone)]
pub(super) struct Keys<'a> {
    keys: Rows<'a>,
    /// Rows with a key, in each page of [`ROWS_PER_PAGE`] rows.
    named: Vec<usize>,
    nulls: usize,
    /// The greatest key plus one (0: none).
    bound: usize,
}

/// Each row's key.
#[derive(Clone)]
enum Rows<'a> {
    Each(Cow<'a, [u32]>),
    /// `rows` rows of key `key` (a CPU's column).
    Same {
        key: u32,
        rows: usize,
    },
}

impl<'a> Keys<'a> {
    /// Each row's key (or [`NO_KEY`]).
    pub fn new(keys: impl Into<Cow<'a, [u32]>>) -> Self {
        let keys = keys.into();
        let mut largest = 0;
        // A pass over each page without branches, for the check and the
        // levels both (a pass that stopped at the first offender was 1 %
        // of an export): a key plus one wraps a null's to 0.
        let named: Vec<usize> = keys
            .chunks(ROWS_PER_PAGE)
            .map(|page| {
                let (nulls, most) = page.iter().fold((0u32, 0u32), |(nulls, most), key| {
                    let next = key.wrapping_add(1);
                    (nulls + u32::from(next == 0), most.max(next))
                });
                largest = largest.max(most);
                page.len() - nulls as usize
            })
            .collect();
        Keys {
            nulls: keys.len() - named.iter().sum::<usize>(),
            keys: Rows::Each(keys),
            named,
            bound: largest as usize,
        }
    }

    /// `rows` rows of key `key`.
    pub fn same(key: u32, rows: usize) -> Self {
        let named = (0..rows)
            .step_by(ROWS_PER_PAGE)
            .map(|start| (rows - start).min(ROWS_PER_PAGE))
            .collect();
        Keys {
            keys: Rows::Same { key, rows },
            named,
            nulls: 0,
            bound: match rows {
                0 => 0,
                _ => key as usize + 1,
            },
        }
    }

    /// The keys, as the rows of column `descr` over a list of `items`:
    /// refused where a key is past the list, or a row is null and the
    /// column is not nullable.
    pub fn fit(self, descr: &ColumnDescPtr, items: usize) -> Result<Self, ExportError> {
        if self.bound > items || matches!(self.keys, Rows::Same { key: NO_KEY, .. }) {
            return Err(ExportError::Unsupported(
                "a dictionary column's row names no value",
            ));
        }
        match descr.max_def_level() == 0 && self.nulls > 0 {
            true => Err(ExportError::Unsupported(
                "a null in a dictionary column that is not nullable",
            )),
            false => Ok(self),
        }
    }

    /// Rows in the column.
    pub fn len(&self) -> usize {
        match &self.keys {
            Rows::Each(keys) => keys.len(),
            Rows::Same { rows, .. } => *rows,
        }
    }

    /// Null rows.
    pub fn nulls(&self) -> usize {
        self.nulls
    }

    /// Which items of the list of `items` some row names.
    pub fn named_items(&self, items: usize) -> Vec<bool> {
        let mut named = vec![false; items];
        let mut name = |key: u32| {
            if let Some(n) = named.get_mut(key as usize) {
                *n = true;
            }
        };
        match &self.keys {
            Rows::Each(_) if self.nulls == self.len() => {}
            Rows::Each(keys) => keys.iter().for_each(|k| name(*k)),
            Rows::Same { key, rows } if *rows > 0 => name(*key),
            Rows::Same { .. } => {}
        }
        named
    }

    /// The data page of `rows` (at most [`ROWS_PER_PAGE`], starting at a
    /// multiple of it): the levels where `nullable`, then the named rows'
    /// keys, each mapped through `remap` where given (a list item's
    /// index among the distinct ones), as indices of `width` bits.
    pub fn data_page(
        &self,
        rows: Range<usize>,
        nullable: bool,
        width: u8,
        remap: Option<&[u32]>,
    ) -> (Vec<u8>, u32) {
        let named = self
            .named
            .get(rows.start / ROWS_PER_PAGE)
            .copied()
            .unwrap_or(0);
        let count = rows.len().min(self.len().saturating_sub(rows.start));
        let mut out = Vec::with_capacity(count * usize::from(width) / 8 + 64);
        let keys = match &self.keys {
            Rows::Each(keys) => keys.get(rows).unwrap_or_default(),
            Rows::Same { .. } => &[],
        };
        if nullable {
            match named {
                0 => level_run(count, 0, &mut out),
                n if n == count => level_run(count, 1, &mut out),
                _ => {
                    let at = levels_header(count, &mut out);
                    for (byte, group) in out[at..].iter_mut().zip(keys.chunks(8)) {
                        *byte = group
                            .iter()
                            .enumerate()
                            .fold(0, |b, (i, k)| b | u8::from(*k != NO_KEY) << i);
                    }
                }
            }
        }
        out.push(width);
        // Every key is in the list (checked in `new`).
        let mapped = |k: &u32| remap.map_or(*k, |r| r.get(*k as usize).copied().unwrap_or(0));
        match (&self.keys, remap) {
            _ if named == 0 => {}
            (Rows::Same { key, .. }, _) => {
                // One run of one index.
                varint(&mut out, (count as u64) << 1);
                let bytes = usize::from(width).div_ceil(8);
                out.extend_from_slice(&mapped(key).to_le_bytes()[..bytes]);
            }
            (Rows::Each(_), None) if named == count => hybrid(keys, width, &mut out),
            (Rows::Each(_), _) if named == count => {
                let indices: Vec<u32> = keys.iter().map(mapped).collect();
                hybrid(&indices, width, &mut out);
            }
            (Rows::Each(_), _) => {
                let indices: Vec<u32> = keys.iter().filter(|k| **k != NO_KEY).map(mapped).collect();
                hybrid(&indices, width, &mut out);
            }
        }
        // At most ROWS_PER_PAGE.
        (out, count as u32)
    }
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
    /// Each list entry's index in `distinct`, where the list repeats a
    /// text (`None`: the list is the distinct texts).
    remap: Option<Vec<u32>>,
    /// Each row's index into the list, or [`NO_KEY`] for null: the rows'
    /// own columns, as they are.
    keys: Keys<'a>,
    /// Whether the column's field is nullable (a column that is not has
    /// no null: [`Keys::new`] checks).
    nullable: bool,
}

impl<'a> TextPages<'a> {
    /// The text column `descr` (UTF-8 or any byte strings) of `texts`,
    /// indexed by `rows`.
    pub fn new<T: AsRef<[u8]>>(
        descr: &ColumnDescPtr,
        texts: &'a [T],
        rows: impl Into<Cow<'a, [u32]>>,
    ) -> Result<Self, ExportError> {
        Self::of_keys(descr, texts, Keys::new(rows))
    }

    /// The text column `descr` of `texts`, indexed by `keys` (checked
    /// against the texts).
    pub fn of_keys<T: AsRef<[u8]>>(
        descr: &ColumnDescPtr,
        texts: &'a [T],
        keys: Keys<'a>,
    ) -> Result<Self, ExportError> {
        let keys = keys.fit(descr, texts.len())?;
        let (distinct, remap) = distinct(texts.iter().map(AsRef::as_ref));
        Ok(TextPages {
            distinct,
            remap: (!is_identity(&remap)).then_some(remap),
            keys,
            nullable: descr.max_def_level() > 0,
        })
    }
}

impl ColumnPages for TextPages<'_> {
    fn rows(&self) -> usize {
        self.keys.len()
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
        let width = index_width(self.distinct.len());
        self.keys
            .data_page(rows, self.nullable, width, self.remap.as_deref())
    }
}

/// `rows` definition levels of one value (0 null, 1 named) as a data page
/// v1 holds them: a length, then one run of the hybrid.
fn level_run(rows: usize, level: u8, out: &mut Vec<u8>) {
    let mut run = Vec::with_capacity(12);
    varint(&mut run, (rows as u64) << 1);
    run.push(level);
    // A few bytes.
    out.extend_from_slice(&(run.len() as u32).to_le_bytes());
    out.extend_from_slice(&run);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunks::{encode, tests::read_back};

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
        let rows: Vec<u32> = rows.iter().map(|r| r.unwrap_or(NO_KEY)).collect();
        let arrays = read_back(Field::new("t", text, nullable), |descr| {
            let pages = TextPages::new(&descr, &dictionary, &rows).unwrap();
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
        let rows: Vec<u32> = rows.iter().flatten().copied().collect();
        let pages = TextPages::new(&descr, &texts, &rows).unwrap();
        let (_, entries) = pages.dictionary().unwrap().unwrap();
        assert_eq!(entries, 3, "mov, ret, push");
        assert!(
            TextPages::new(&descr, &texts, &[5]).is_err(),
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
        TextPages::new(&parquet_schema.column(0), &texts, &[NO_KEY]).is_err()
    }
}
