//! Number column chunks written by hand, as `chunks` writes the text,
//! register and access columns (the instruction bytes are a text column
//! of the instruction texts' bytes): the step, its CPU, virtual time,
//! address space, privilege level, bitness and pc, the task's ids, the
//! system call and interrupt numbers. Through arrow-rs, these with the
//! events were about a fifth of an export's profile (levels worked back
//! out of null bitmaps, min and max of every page, each pc and RFLAGS
//! hashed into a dictionary, a value encoder behind dynamic dispatch, a
//! zstd context made for each chunk); written here, the export takes
//! about 10 % less time and CPU (50.7 M-step trace, 2 cores).
//!
//! | column | data page, per `ROWS_PER_PAGE` rows |
//! |---|---|
//! | number ([`NumberPages`]) | where nullable, the definition levels as `chunks` writes them; then the values of the rows that have one: PLAIN (INT64: u64 LE; INT32: u32 LE, narrower values zero-extended), DELTA_BINARY_PACKED (INT64 only), or RLE_DICTIONARY (a byte of bit width, then the indices in the hybrid; the dictionary page holds each distinct value once, PLAIN) |
//!
//! A number chunk carries its min, max and null count, compared as
//! unsigned (the columns' logical types are): DuckDB skips the row groups
//! a `WHERE step BETWEEN …` rules out.

use std::borrow::Cow;
use std::ops::Range;

use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::file::statistics::Statistics;
use parquet::schema::types::ColumnDescPtr;

use rustc_hash::FxHashMap;

use super::chunks::{
    delta_binary_packed, distinct, index_width, is_identity, levels_header, ColumnPages,
};
use super::keys::{Keys, NO_KEY};
use super::ExportError;

/// A number column's values, one a row (any value where the row is
/// null), borrowed from the rows where they hold them as they are.
pub(super) enum Numbers<'a> {
    /// An INT64 column's: u64 values, as their bits.
    U64(Cow<'a, [u64]>),
    /// An INT32 column's: u8 values, zero-extended.
    U8(Cow<'a, [u8]>),
}

/// `$body` with `$v` bound to the values' slice, whatever their type: the
/// loops over rows are made once per type, not a `match` a row.
macro_rules! each_type {
    ($numbers:expr, $v:ident => $body:expr) => {
        match $numbers {
            Numbers::U64($v) => {
                let $v: &[u64] = $v;
                $body
            }
            Numbers::U8($v) => {
                let $v: &[u8] = $v;
                $body
            }
        }
    };
}

/// The integer types of [`Numbers`].
trait Number: Copy + Ord + Into<u64> {
    const MIN: Self;
    const MAX: Self;
}
impl Number for u8 {
    const MIN: Self = u8::MIN;
    const MAX: Self = u8::MAX;
}
impl Number for u64 {
    const MIN: Self = u64::MIN;
    const MAX: Self = u64::MAX;
}

impl Numbers<'_> {
    fn len(&self) -> usize {
        each_type!(self, v => v.len())
    }

    /// Whether the column's physical type is INT64 (else INT32).
    fn wide(&self) -> bool {
        matches!(self, Numbers::U64(_))
    }
}

/// How a number column's values are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NumberEncoding {
    /// As they are: what zstd packs best where values repeat or jump.
    Plain,
    /// As deltas (INT64 only): steps and times count up by one.
    Delta,
    /// As indices into a dictionary of the distinct values: a segment's
    /// pcs are a few thousand, repeated (zstd packed them written as
    /// they are to 16 times the size).
    Dictionary,
}

/// A dictionary column's distinct values and each row's index among
/// them.
struct Dictionary<'a> {
    distinct: Vec<u64>,
    /// Each row's index into the list of values the column was made from,
    /// [`NO_KEY`] where the row is null.
    keys: Keys<'a>,
    /// Each list item's index in `distinct`, where the list repeats a
    /// value (`None`: the list is `distinct`).
    remap: Option<Vec<u32>>,
    /// The least and the greatest value the rows hold (`None`: all null).
    range: Option<(u64, u64)>,
}

impl Dictionary<'_> {
    fn new<T: Number>(
        descr: &ColumnDescPtr,
        values: &[T],
        present: Option<&[bool]>,
    ) -> Result<Self, ExportError> {
        let mut index = FxHashMap::default();
        let mut distinct = Vec::new();
        // Steps come in runs of one value (a task, an address space) and
        // loops: the last value's key is at hand.
        let mut last: Option<(u64, u32)> = None;
        let keys: Vec<u32> = values
            .iter()
            .enumerate()
            .map(|(row, v)| {
                if present.is_some_and(|p| !p.get(row).copied().unwrap_or(false)) {
                    return NO_KEY;
                }
                let v: u64 = (*v).into();
                match last {
                    Some((value, key)) if value == v => key,
                    _ => {
                        let key = *index.entry(v).or_insert_with(|| {
                            distinct.push(v);
                            // Fewer distinct values than a segment's rows.
                            (distinct.len() - 1) as u32
                        });
                        last = Some((v, key));
                        key
                    }
                }
            })
            .collect();
        if u32::try_from(distinct.len()).is_err() {
            return Err(ExportError::Unsupported(
                "a number column with over 2^32 distinct values",
            ));
        }
        let lo = distinct.iter().min().copied();
        let hi = distinct.iter().max().copied();
        Ok(Dictionary {
            keys: Keys::new(keys).fit(descr, distinct.len())?,
            distinct,
            remap: None,
            range: lo.zip(hi),
        })
    }
}

/// A number column: a value a row, or null where `present` says so.
pub(super) struct NumberPages<'a> {
    /// The values, where the column is not a dictionary.
    values: Numbers<'a>,
    /// Whether the column is INT64 (else INT32).
    wide: bool,
    /// Which rows have a value; `None`: all of them.
    present: Option<Vec<bool>>,
    encoding: NumberEncoding,
    /// Whether the column's field is nullable (its pages hold levels).
    nullable: bool,
    /// Where the encoding is [`NumberEncoding::Dictionary`].
    dictionary: Option<Dictionary<'a>>,
    rows: usize,
}

impl<'a> NumberPages<'a> {
    /// The column `descr` of `values`, null where `present` is false.
    /// The values must fit the column's physical type, and a column that
    /// is not nullable takes no nulls.
    pub fn new(
        descr: &ColumnDescPtr,
        values: Numbers<'a>,
        present: Option<Vec<bool>>,
        encoding: NumberEncoding,
    ) -> Result<Self, ExportError> {
        let fits = match (values.wide(), descr.physical_type()) {
            (true, PhysicalType::INT64) => true,
            (false, PhysicalType::INT32) => encoding != NumberEncoding::Delta,
            _ => false,
        };
        if !fits {
            return Err(ExportError::Unsupported(
                "a number column's values do not fit its type",
            ));
        }
        if present.as_ref().is_some_and(|p| p.len() != values.len()) {
            return Err(ExportError::Unsupported(
                "a number column with more values than rows",
            ));
        }
        let nullable = descr.max_def_level() > 0;
        if !nullable && present.as_ref().is_some_and(|p| p.contains(&false)) {
            return Err(ExportError::Unsupported(
                "a null in a number column that is not nullable",
            ));
        }
        let dictionary = match encoding {
            NumberEncoding::Dictionary => {
                Some(each_type!(&values, v => Dictionary::new(descr, v, present.as_deref()))?)
            }
            _ => None,
        };
        Ok(NumberPages {
            rows: values.len(),
            wide: values.wide(),
            // A dictionary's rows are its keys (null where the rows are).
            present: present.filter(|_| dictionary.is_none()),
            values,
            encoding,
            nullable,
            dictionary,
        })
    }

    /// The column `descr` of each row's value in `list`, given as its
    /// index there (`keys`, [`NO_KEY`] where the row is null), as a
    /// dictionary: the pc from the instructions' texts the rows index,
    /// a task's ids from the rows' tasks, made without a hash lookup a
    /// row. The list may repeat a value, and hold one no row names;
    /// where it holds each once (as almost always), the keys are the
    /// rows' indices as they are.
    pub fn from_list(
        descr: &ColumnDescPtr,
        list: &[u64],
        keys: Keys<'a>,
    ) -> Result<Self, ExportError> {
        let wide = match descr.physical_type() {
            PhysicalType::INT64 => true,
            PhysicalType::INT32 if list.iter().all(|v| u32::try_from(*v).is_ok()) => false,
            _ => {
                return Err(ExportError::Unsupported(
                    "a listed number column's values do not fit its type",
                ))
            }
        };
        let keys = keys.fit(descr, list.len())?;
        let (distinct, remap) = distinct(list.iter().copied());
        // The statistics are of the values the rows hold, not the list's.
        let named = keys.named_items(list.len());
        let held = list
            .iter()
            .zip(&named)
            .filter(|(_, n)| **n)
            .map(|(v, _)| *v);
        let range = held.clone().min().zip(held.max());
        Ok(NumberPages {
            rows: keys.len(),
            values: Numbers::U64(Cow::Borrowed(&[])),
            wide,
            present: None,
            encoding: NumberEncoding::Dictionary,
            nullable: descr.max_def_level() > 0,
            dictionary: Some(Dictionary {
                distinct,
                keys,
                remap: (!is_identity(&remap)).then_some(remap),
                range,
            }),
        })
    }
}

/// `f` of each present value of `rows`, widened, in order.
fn each_present<T: Number>(
    values: &[T],
    present: Option<&[bool]>,
    rows: Range<usize>,
    mut f: impl FnMut(u64),
) {
    let values = values.get(rows.clone()).unwrap_or_default();
    match present {
        None => values.iter().for_each(|v| f((*v).into())),
        Some(p) => {
            let p = p.get(rows).unwrap_or_default();
            for (v, _) in values.iter().zip(p).filter(|(_, ok)| **ok) {
                f((*v).into());
            }
        }
    }
}

/// `values` PLAIN, `W` bytes each (8 for INT64, 4 for INT32: an INT32
/// column's values fit 32 bits), written in place: a loop of fixed-size
/// copies without a capacity check a value.
fn put_plain<T: Number, const W: usize>(values: &[T], out: &mut Vec<u8>) {
    let at = out.len();
    out.resize(at + values.len() * W, 0);
    for (bytes, v) in out[at..].chunks_exact_mut(W).zip(values) {
        let v: u64 = (*v).into();
        bytes.copy_from_slice(&v.to_le_bytes()[..W]);
    }
}

/// Min and max of the present values (`None`: there are none), and how
/// many rows are null: one pass without branches in the values' own
/// type, which the compiler makes vector instructions of where the
/// target has them for the type.
fn min_max<T: Number>(values: &[T], present: Option<&[bool]>) -> (Option<(u64, u64)>, u64) {
    let (mut lo, mut hi) = (T::MAX, T::MIN);
    let nulls = match present {
        None => {
            for v in values {
                (lo, hi) = (lo.min(*v), hi.max(*v));
            }
            0
        }
        Some(p) => {
            for (v, ok) in values.iter().zip(p) {
                lo = if *ok { lo.min(*v) } else { lo };
                hi = if *ok { hi.max(*v) } else { hi };
            }
            p.iter().filter(|ok| !**ok).count()
        }
    };
    let some = values.len() > nulls;
    (some.then(|| (lo.into(), hi.into())), nulls as u64)
}

impl ColumnPages for NumberPages<'_> {
    fn rows(&self) -> usize {
        self.rows
    }

    fn dictionary(&self) -> Result<Option<(Vec<u8>, u32)>, ExportError> {
        let Some(d) = &self.dictionary else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(d.distinct.len() * 8);
        for v in &d.distinct {
            match self.wide {
                true => out.extend_from_slice(&v.to_le_bytes()),
                // An INT32 column's values fit 32 bits.
                false => out.extend_from_slice(&(*v as u32).to_le_bytes()),
            }
        }
        // Checked in `Dictionary::new`.
        Ok(Some((out, d.distinct.len() as u32)))
    }

    fn encoding(&self) -> Encoding {
        match self.encoding {
            NumberEncoding::Plain => Encoding::PLAIN,
            NumberEncoding::Delta => Encoding::DELTA_BINARY_PACKED,
            NumberEncoding::Dictionary => Encoding::RLE_DICTIONARY,
        }
    }

    fn data_page(&self, rows: Range<usize>) -> (Vec<u8>, u32) {
        // At most ROWS_PER_PAGE.
        let count = rows.len() as u32;
        let mut out = Vec::with_capacity(rows.len() * 8 + 64);
        let present = self.present.as_deref();
        if let Some(d) = &self.dictionary {
            let width = index_width(d.distinct.len());
            return d
                .keys
                .data_page(rows, self.nullable, width, d.remap.as_deref());
        }
        if self.nullable {
            let at = levels_header(rows.len(), &mut out);
            match present.map(|p| p.get(rows.clone()).unwrap_or_default()) {
                Some(p) => {
                    for (byte, group) in out[at..].iter_mut().zip(p.chunks(8)) {
                        *byte = group
                            .iter()
                            .enumerate()
                            .fold(0, |b, (i, ok)| b | u8::from(*ok) << i);
                    }
                }
                None => out[at..].fill(0xff),
            }
        }
        match (self.encoding, self.wide) {
            (NumberEncoding::Delta, _) => {
                let mut values = Vec::with_capacity(rows.len());
                each_type!(&self.values, v => each_present(v, present, rows, |x| values.push(x)));
                delta_binary_packed(&values, &mut out);
            }
            // Every row's value: the bytes made in place (a push a value
            // was most of these columns' work).
            (_, true) if present.is_none() => {
                each_type!(&self.values, v => put_plain::<_, 8>(v.get(rows).unwrap_or_default(), &mut out))
            }
            (_, false) if present.is_none() => {
                each_type!(&self.values, v => put_plain::<_, 4>(v.get(rows).unwrap_or_default(), &mut out))
            }
            (_, true) => each_type!(&self.values, v => each_present(v, present, rows, |x| {
                out.extend_from_slice(&x.to_le_bytes())
            })),
            // An INT32 column's values fit 32 bits.
            (_, false) => each_type!(&self.values, v => each_present(v, present, rows, |x| {
                out.extend_from_slice(&(x as u32).to_le_bytes())
            })),
        }
        (out, count)
    }

    fn statistics(&self) -> Option<Statistics> {
        let present = self.present.as_deref();
        let (range, nulls) = match &self.dictionary {
            Some(d) => (d.range, d.keys.nulls() as u64),
            None => each_type!(&self.values, v => min_max(v, present)),
        };
        // Unsigned values as their bits, as arrow-rs writes them: readers
        // compare them as the column's logical type says.
        Some(match self.wide {
            true => Statistics::int64(
                range.map(|r| r.0 as i64),
                range.map(|r| r.1 as i64),
                None,
                Some(nulls),
                false,
            ),
            false => Statistics::int32(
                range.map(|r| r.0 as u32 as i32),
                range.map(|r| r.1 as u32 as i32),
                None,
                Some(nulls),
                false,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunks::{encode, tests::read_back, ROWS_PER_PAGE};
    use arrow_array::cast::AsArray;
    use arrow_array::types::{UInt32Type, UInt64Type, UInt8Type};
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::ArrowSchemaConverter;

    fn descr(data_type: DataType, nullable: bool) -> ColumnDescPtr {
        let schema = Schema::new(vec![Field::new("n", data_type, nullable)]);
        ArrowSchemaConverter::new()
            .convert(&schema)
            .unwrap()
            .column(0)
    }

    /// Over two pages: a value in most rows, null in every seventh.
    fn rows() -> (Vec<u64>, Vec<bool>) {
        let n = ROWS_PER_PAGE + 500;
        let values = (0..n as u64)
            .map(|i| match i % 5 {
                // Above i64::MAX: compared as unsigned.
                0 => u64::MAX - i,
                1 => 0x1000,
                _ => 0x1000 + i / 3,
            })
            .collect();
        let present = (0..n).map(|i| i % 7 != 3).collect();
        (values, present)
    }

    /// `values` written as column `data_type` and read back as u64s.
    fn round_trip(
        data_type: DataType,
        values: Numbers,
        present: Option<Vec<bool>>,
        encoding: NumberEncoding,
    ) -> Vec<Option<u64>> {
        let nullable = present.is_some();
        let arrays = read_back(Field::new("n", data_type.clone(), nullable), |descr| {
            let pages = NumberPages::new(&descr, values, present, encoding).unwrap();
            encode(descr, &pages).unwrap()
        });
        let mut out = Vec::new();
        for a in arrays {
            match data_type {
                DataType::UInt64 => out.extend(a.as_primitive::<UInt64Type>().iter()),
                DataType::UInt32 => out.extend(
                    a.as_primitive::<UInt32Type>()
                        .iter()
                        .map(|v| v.map(u64::from)),
                ),
                _ => out.extend(
                    a.as_primitive::<UInt8Type>()
                        .iter()
                        .map(|v| v.map(u64::from)),
                ),
            }
        }
        out
    }

    #[test]
    fn numbers_read_back_in_every_encoding_with_their_nulls() {
        let (values, present) = rows();
        let want: Vec<Option<u64>> = values
            .iter()
            .zip(&present)
            .map(|(v, ok)| ok.then_some(*v))
            .collect();
        for encoding in [
            NumberEncoding::Plain,
            NumberEncoding::Delta,
            NumberEncoding::Dictionary,
        ] {
            let got = round_trip(
                DataType::UInt64,
                Numbers::U64(values.clone().into()),
                Some(present.clone()),
                encoding,
            );
            assert_eq!(got, want, "{encoding:?}, nullable");
            let got = round_trip(
                DataType::UInt64,
                Numbers::U64(values.clone().into()),
                None,
                encoding,
            );
            let all: Vec<Option<u64>> = values.iter().map(|v| Some(*v)).collect();
            assert_eq!(got, all, "{encoding:?}, required");
        }
        let narrow: Vec<u8> = values.iter().map(|v| *v as u8).collect();
        let want8: Vec<Option<u64>> = want.iter().map(|v| v.map(|v| v as u8 as u64)).collect();
        for encoding in [NumberEncoding::Plain, NumberEncoding::Dictionary] {
            let got = round_trip(
                DataType::UInt8,
                Numbers::U8(narrow.clone().into()),
                Some(present.clone()),
                encoding,
            );
            assert_eq!(got, want8, "u8, {encoding:?}");
        }
    }

    #[test]
    fn steps_that_count_up_by_one_read_back_from_deltas_of_no_bits() {
        // Runs of +1 (a block's deltas less the least take 0 bits), a jump
        // in a miniblock, a last block cut short, over two pages.
        let mut steps: Vec<u64> = (1000..1000 + ROWS_PER_PAGE as u64 + 300).collect();
        for s in &mut steps[5000..] {
            *s += 1 << 40;
        }
        for n in [steps.len(), 1, 2, 129, 130] {
            let values = steps[..n].to_vec();
            let got = round_trip(
                DataType::UInt64,
                Numbers::U64(values.clone().into()),
                None,
                NumberEncoding::Delta,
            );
            let want: Vec<Option<u64>> = values.iter().map(|v| Some(*v)).collect();
            assert_eq!(got, want, "{n} steps");
        }
    }

    #[test]
    fn a_listed_column_reads_back_as_the_values_its_rows_index() {
        // A list that repeats a value (two texts of one pc), indexed over
        // two pages.
        let list = [0x1000u64, 0x1004, 0x1000, u64::MAX];
        let rows: Vec<u32> = (0..ROWS_PER_PAGE as u32 + 70).map(|i| i * 7 % 4).collect();
        let arrays = read_back(Field::new("pc", DataType::UInt64, false), |descr| {
            encode(
                descr.clone(),
                &NumberPages::from_list(&descr, &list, Keys::new(&rows)).unwrap(),
            )
            .unwrap()
        });
        let got: Vec<u64> = arrays
            .iter()
            .flat_map(|a| a.as_primitive::<UInt64Type>().values().to_vec())
            .collect();
        let want: Vec<u64> = rows.iter().map(|i| list[*i as usize]).collect();
        assert_eq!(got, want);
        let pages =
            NumberPages::from_list(&descr(DataType::UInt64, false), &list, Keys::new(&rows))
                .unwrap();
        let (_, entries) = pages.dictionary().unwrap().unwrap();
        assert_eq!(entries, 3, "0x1000 once");
        let d = descr(DataType::UInt64, false);
        assert!(
            NumberPages::from_list(&d, &list, Keys::new(&[4][..])).is_err(),
            "past the list"
        );
        assert!(
            NumberPages::from_list(&d, &[7, 8], Keys::new(&[2][..])).is_err(),
            "past a list of distinct values"
        );
        assert!(
            NumberPages::from_list(&descr(DataType::UInt32, false), &list, Keys::new(&[][..]))
                .is_err(),
            "a value past INT32"
        );
        assert!(
            NumberPages::from_list(&d, &list, Keys::new(&[0, NO_KEY][..])).is_err(),
            "a null where none may be"
        );
    }

    /// A chunk's statistics: min, max and nulls.
    type MinMaxNulls = (Option<i32>, Option<i32>, u64);

    /// `keys` into `list` written as a nullable UInt32 column, read back,
    /// and the chunk's statistics.
    fn listed_u32(list: &[u64], keys: Keys) -> (Vec<Option<u64>>, MinMaxNulls) {
        let d = descr(DataType::UInt32, true);
        let pages = NumberPages::from_list(&d, list, keys).unwrap();
        let Some(Statistics::Int32(s)) = pages.statistics() else {
            panic!("INT32 statistics");
        };
        let stats = (
            s.min_opt().copied(),
            s.max_opt().copied(),
            s.null_count_opt().unwrap(),
        );
        let arrays = read_back(Field::new("pid", DataType::UInt32, true), |descr| {
            encode(descr, &pages).unwrap()
        });
        let got = arrays
            .iter()
            .flat_map(|a| {
                a.as_primitive::<UInt32Type>()
                    .iter()
                    .map(|v| v.map(u64::from))
            })
            .collect();
        (got, stats)
    }

    #[test]
    fn a_listed_column_with_nulls_reads_back_page_by_page() {
        // Over four pages: one all null (a run of level 0), one all named
        // (a run of level 1), one mixed, and a short last one. The list
        // holds a value no row names (a task switched away from at once)
        // and repeats one: neither counts in the statistics.
        let n = 3 * ROWS_PER_PAGE + 10;
        let list = [40u64, 7, 900, 40];
        let keys: Vec<u32> = (0..n)
            .map(|row| match row / ROWS_PER_PAGE {
                0 => NO_KEY,
                1 => 3,
                _ if row % 3 == 0 => NO_KEY,
                _ => 1,
            })
            .collect();
        let want: Vec<Option<u64>> = keys
            .iter()
            .map(|k| (*k != NO_KEY).then(|| list[*k as usize]))
            .collect();
        let nulls = want.iter().filter(|v| v.is_none()).count() as u64;
        let (got, stats) = listed_u32(&list, Keys::new(&keys));
        assert_eq!(got, want);
        assert_eq!(stats, (Some(7), Some(40), nulls), "900 is named by no row");
        let (got, stats) = listed_u32(&list, Keys::new(vec![NO_KEY; 10]));
        assert_eq!(got, vec![None; 10]);
        assert_eq!(stats, (None, None, 10), "every row null");
        // One key for every row (a CPU's column), over two pages.
        let (got, stats) = listed_u32(&[5], Keys::same(0, ROWS_PER_PAGE + 3));
        assert_eq!(got, vec![Some(5); ROWS_PER_PAGE + 3]);
        assert_eq!(stats, (Some(5), Some(5), 0));
    }

    #[test]
    fn statistics_compare_as_unsigned_and_count_nulls() {
        let (values, present) = rows();
        let nulls = present.iter().filter(|ok| !**ok).count() as u64;
        let want_max = values
            .iter()
            .zip(&present)
            .filter(|(_, ok)| **ok)
            .map(|(v, _)| *v)
            .max()
            .unwrap();
        assert!(want_max > i64::MAX as u64);
        // A dictionary's come from its distinct values: the same.
        for encoding in [NumberEncoding::Plain, NumberEncoding::Dictionary] {
            let pages = NumberPages::new(
                &descr(DataType::UInt64, true),
                Numbers::U64(values.clone().into()),
                Some(present.clone()),
                encoding,
            )
            .unwrap();
            let Some(Statistics::Int64(s)) = pages.statistics() else {
                panic!("INT64 statistics");
            };
            assert_eq!(s.min_opt().map(|v| *v as u64), Some(0x1000), "{encoding:?}");
            assert_eq!(
                s.max_opt().map(|v| *v as u64),
                Some(want_max),
                "{encoding:?}"
            );
            assert_eq!(s.null_count_opt(), Some(nulls), "{encoding:?}");
        }
        let narrow = NumberPages::new(
            &descr(DataType::UInt8, false),
            Numbers::U8(vec![9, 200, 3, 77].into()),
            None,
            NumberEncoding::Plain,
        )
        .unwrap();
        let Some(Statistics::Int32(s)) = narrow.statistics() else {
            panic!("INT32 statistics");
        };
        assert_eq!(
            (s.min_opt(), s.max_opt(), s.null_count_opt()),
            (Some(&3), Some(&200), Some(0))
        );

        let none = NumberPages::new(
            &descr(DataType::UInt8, true),
            Numbers::U8(vec![7; 10].into()),
            Some(vec![false; 10]),
            NumberEncoding::Plain,
        )
        .unwrap();
        let Some(Statistics::Int32(s)) = none.statistics() else {
            panic!("INT32 statistics");
        };
        assert_eq!(
            (s.min_opt(), s.max_opt(), s.null_count_opt()),
            (None, None, Some(10))
        );
    }

    #[test]
    fn numbers_that_do_not_fit_their_column_are_refused() {
        let u64s = || Numbers::U64(vec![1, 2].into());
        let new = |d: DataType, nullable, values, present, encoding| {
            NumberPages::new(&descr(d, nullable), values, present, encoding).is_ok()
        };
        use NumberEncoding::*;
        assert!(new(DataType::UInt64, false, u64s(), None, Plain));
        assert!(
            !new(DataType::UInt32, false, u64s(), None, Plain),
            "u64 in INT32"
        );
        assert!(
            !new(
                DataType::UInt64,
                false,
                Numbers::U8(vec![1].into()),
                None,
                Plain
            ),
            "u8 in INT64"
        );
        assert!(
            !new(
                DataType::UInt8,
                false,
                Numbers::U8(vec![1].into()),
                None,
                Delta
            ),
            "INT32 deltas"
        );
        assert!(
            !new(
                DataType::UInt64,
                false,
                u64s(),
                Some(vec![true, false]),
                Plain
            ),
            "a null where none may be"
        );
        assert!(new(
            DataType::UInt64,
            true,
            u64s(),
            Some(vec![true, false]),
            Plain
        ));
        assert!(
            !new(DataType::UInt64, true, u64s(), Some(vec![true]), Plain),
            "rows and presence differ"
        );
    }
}
