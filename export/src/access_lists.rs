//! The six memory-access list columns: for each direction (reads,
//! writes), the addresses, the sizes and the values, a list per row
//! (null where the registers before the step are not known) and an item
//! per access. A direction's three columns are built in one walk over
//! the rows, page by page: their levels are the same but where a value
//! is not known, and walking the rows and working out the levels was
//! most of their work, done three times when each column walked alone.
//!
//! Levels (max repetition 1, max definition 3): a null list is (0, 0),
//! an empty one (0, 1), an item (0 for a row's first, else 1; 3, or 2
//! where it is a null value). A data page holds the repetition levels
//! (width 1) and the definition levels (width 2) as
//! `chunks::packed_levels` writes them, then the items: addresses as
//! DELTA_BINARY_PACKED INT64, sizes PLAIN INT32, values PLAIN u64 LE.

use std::ops::Range;
use std::sync::Mutex;

use parquet::basic::Encoding;
use parquet::schema::types::ColumnDescPtr;

use super::chunks::{delta_binary_packed, packed_levels, start_of, ColumnPages, ROWS_PER_PAGE};
use super::rows::SegmentRows;
use super::ExportError;
use vtrace_analyzer::Access;

/// Which memory accesses a list column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Direction {
    Reads,
    Writes,
}

/// A data page's plain bytes and its number of values.
type Page = (Vec<u8>, u32);

/// A column's data pages, built before its chunk is encoded; `encode`
/// takes each once, asking for the rows of page after page.
pub(super) struct BuiltPages {
    rows: usize,
    encoding: Encoding,
    /// Page `i` holds rows from `i × ROWS_PER_PAGE`; taken when encoded.
    pages: Mutex<Vec<Option<Page>>>,
}

impl ColumnPages for BuiltPages {
    fn rows(&self) -> usize {
        self.rows
    }

    fn encoding(&self) -> Encoding {
        self.encoding
    }

    fn data_page(&self, rows: Range<usize>) -> Page {
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        let page = pages
            .get_mut(rows.start / ROWS_PER_PAGE)
            .and_then(Option::take);
        debug_assert!(page.is_some(), "each page is asked for once");
        page.unwrap_or_default()
    }
}

/// One direction's three columns of a segment's rows.
pub(super) struct AccessColumns {
    pub address: BuiltPages,
    pub size: BuiltPages,
    pub value: BuiltPages,
}

impl AccessColumns {
    /// The `direction` accesses of `rows`, for the columns `descrs`
    /// (address, size, value: each a nullable list of nullable items).
    pub fn new(
        descrs: [&ColumnDescPtr; 3],
        rows: &SegmentRows,
        direction: Direction,
    ) -> Result<Self, ExportError> {
        if descrs
            .iter()
            .any(|d| d.max_def_level() != 3 || d.max_rep_level() != 1)
        {
            return Err(ExportError::Unsupported(
                "an access column that is not a nullable list of nullable items",
            ));
        }
        let n = rows.known.len();
        let (mut address, mut size, mut value) = (Vec::new(), Vec::new(), Vec::new());
        for start in (0..n).step_by(ROWS_PER_PAGE) {
            let [a, s, v] = pages(rows, direction, start..n.min(start + ROWS_PER_PAGE));
            address.push(Some(a));
            size.push(Some(s));
            value.push(Some(v));
        }
        let built = |encoding, pages| BuiltPages {
            rows: n,
            encoding,
            pages: Mutex::new(pages),
        };
        // Addresses walk arrays and the stack by small steps: as deltas
        // they pack far smaller (a `rep stos` over a page: one delta
        // repeated). Values and sizes do not (measured: Linux's values
        // three times the size as deltas).
        Ok(AccessColumns {
            address: built(Encoding::DELTA_BINARY_PACKED, address),
            size: built(Encoding::PLAIN, size),
            value: built(Encoding::PLAIN, value),
        })
    }
}

/// Each row's accesses in `rows` (`None` where they are not known),
/// walked in order: row 0's are its own (see `SegmentRows`), a row's end
/// is where the next one's start.
fn lists<'a>(
    r: &'a SegmentRows,
    direction: Direction,
    rows: Range<usize>,
) -> impl Iterator<Item = Option<&'a [Access]>> + 'a {
    let (first, flat, ends) = match direction {
        Direction::Reads => (&r.first_reads, &r.reads, &r.reads_end),
        Direction::Writes => (&r.first_writes, &r.writes, &r.writes_end),
    };
    let mut start = start_of(ends, rows.start);
    let known = r.known.get(rows.clone()).unwrap_or_default();
    let ends = ends.get(rows.clone()).unwrap_or_default();
    rows.zip(known.iter().zip(ends))
        .map(move |(row, (known, end))| {
            let end = *end as usize;
            let list = match row {
                0 => first.as_slice(),
                _ => flat.get(start..end).unwrap_or_default(),
            };
            start = end;
            known.then_some(list)
        })
}

/// The address, size and value pages of `rows`, and their numbers of
/// values as Parquet counts them (one per item, and one for a null or
/// empty list).
fn pages(r: &SegmentRows, direction: Direction, rows: Range<usize>) -> [Page; 3] {
    let mut repetition = Vec::with_capacity(rows.len() * 2);
    // An item's definition level where it has a value: the address's and
    // the size's, and the value's where it is known.
    let mut definition = Vec::with_capacity(rows.len() * 2);
    let mut value_definition = Vec::with_capacity(rows.len() * 2);
    let mut addresses = Vec::with_capacity(rows.len());
    let mut sizes = Vec::with_capacity(rows.len());
    let mut values = Vec::with_capacity(rows.len());
    for list in lists(r, direction, rows) {
        match list {
            None | Some([]) => {
                let level = u8::from(list.is_some());
                repetition.push(0);
                definition.push(level);
                value_definition.push(level);
            }
            Some(list) => {
                for (i, access) in list.iter().enumerate() {
                    repetition.push(u8::from(i > 0));
                    definition.push(3);
                    addresses.push(access.addr);
                    sizes.push(u32::from(access.size));
                    match access.value {
                        Some(v) => {
                            value_definition.push(3);
                            values.push(v);
                        }
                        None => value_definition.push(2),
                    }
                }
            }
        }
    }
    let mut repeated = Vec::with_capacity(repetition.len() / 8 + 16);
    packed_levels(&repetition, 1, &mut repeated);
    let mut levels = repeated.clone();
    packed_levels(&definition, 2, &mut levels);
    // A page of ROWS_PER_PAGE rows holds far fewer than 2^32 accesses (a
    // segment holds at most 2^27 bytes).
    let count = repetition.len() as u32;

    let mut address = Vec::with_capacity(levels.len() + addresses.len() * 2 + 64);
    address.extend_from_slice(&levels);
    delta_binary_packed(&addresses, &mut address);
    let mut size = levels;
    size.reserve(sizes.len() * 4);
    for s in &sizes {
        size.extend_from_slice(&s.to_le_bytes());
    }
    let mut value = repeated;
    packed_levels(&value_definition, 2, &mut value);
    value.reserve(values.len() * 8);
    for v in &values {
        value.extend_from_slice(&v.to_le_bytes());
    }
    [(address, count), (size, count), (value, count)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunks::{encode, tests::read_back};

    #[test]
    fn access_lists_read_back_with_their_nulls() {
        use arrow_array::cast::AsArray;
        use arrow_array::types::{UInt16Type, UInt64Type};
        use arrow_schema::{DataType, Field};

        // Over two pages: unknown rows (null lists), empty lists, and
        // lists of 1 to 3 accesses whose addresses jump anywhere (deltas
        // that wrap) and whose values are known or not.
        let n = ROWS_PER_PAGE + 300;
        let mut rows = SegmentRows::default();
        let access = |row: u64, i: u64| Access {
            addr: match (row + i) % 7 {
                0 => u64::MAX - row,
                1 => 0,
                _ => 0x1000 + 8 * row + i,
            },
            size: (1 + (row + i) % 8) as u16,
            value: (!row.is_multiple_of(3)).then_some(row * 10 + i),
        };
        rows.first_reads = vec![access(0, 0), access(0, 1)];
        for row in 0..n as u64 {
            rows.known.push(row % 11 != 5);
            if row > 0 {
                rows.reads.extend((0..row % 4).map(|i| access(row, i)));
            }
            rows.reads_end.push(rows.reads.len() as u32);
        }
        let want: Vec<Option<Vec<Access>>> = (0..n as u64)
            .map(|row| {
                let count = if row == 0 { 2 } else { row % 4 };
                rows.known[row as usize].then(|| (0..count).map(|i| access(row, i)).collect())
            })
            .collect();
        let item =
            |t: DataType| DataType::List(std::sync::Arc::new(Field::new_list_field(t, true)));
        // The three columns built at once, each read back alone.
        let read = |t: DataType, part: usize| {
            read_back(Field::new("l", item(t), true), |descr| {
                let columns = AccessColumns::new([&descr; 3], &rows, Direction::Reads).unwrap();
                let pages = [columns.address, columns.size, columns.value];
                encode(descr, &pages[part]).unwrap()
            })
        };
        let lists = |arrays: Vec<arrow_array::ArrayRef>| -> Vec<Option<arrow_array::ArrayRef>> {
            arrays
                .iter()
                .flat_map(|a| a.as_list::<i32>().iter().collect::<Vec<_>>())
                .collect()
        };
        let addresses = lists(read(DataType::UInt64, 0));
        let sizes = lists(read(DataType::UInt16, 1));
        let values = lists(read(DataType::UInt64, 2));
        assert_eq!(addresses.len(), n);
        for (row, want) in want.iter().enumerate() {
            let got = |l: &Option<arrow_array::ArrayRef>| l.is_some();
            assert_eq!(got(&addresses[row]), want.is_some(), "row {row}");
            let Some(want) = want else { continue };
            fn items<T: arrow_array::ArrowPrimitiveType>(
                list: &Option<arrow_array::ArrayRef>,
            ) -> Vec<Option<T::Native>> {
                let list = list.as_ref().expect("a list");
                list.as_primitive::<T>().iter().collect()
            }
            let a = items::<UInt64Type>(&addresses[row]);
            let s = items::<UInt16Type>(&sizes[row]);
            let v = items::<UInt64Type>(&values[row]);
            assert_eq!(
                a,
                want.iter().map(|x| Some(x.addr)).collect::<Vec<_>>(),
                "row {row}"
            );
            assert_eq!(
                s,
                want.iter().map(|x| Some(x.size)).collect::<Vec<_>>(),
                "row {row}"
            );
            assert_eq!(
                v,
                want.iter().map(|x| x.value).collect::<Vec<_>>(),
                "row {row}"
            );
        }
    }
}
