//! The events column written by hand, as `chunks` writes the access
//! lists: a list of texts a row (the events recorded before the step),
//! most of them empty. Levels (max repetition 1, max definition 2: the
//! list is required, its items nullable, none null): an empty list is
//! (0, 0), an item (0 for a row's first, else 1; 2). A data page holds
//! the repetition levels (width 1) and the definition levels (width 2)
//! as `chunks::packed_levels` writes them, then each item PLAIN (u32 LE
//! length, then its bytes).

use std::ops::Range;

use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::schema::types::ColumnDescPtr;

use super::chunks::{ends_fit, packed_levels, start_of, ColumnPages};
use super::ExportError;

/// The events of a segment's rows: row 0's are `first`, then
/// `events` up to its end in `ends`; each other row's are `events` from
/// the end of the row before to its own.
pub(super) struct EventPages<'a> {
    first: &'a [String],
    events: &'a [String],
    ends: &'a [u32],
}

impl<'a> EventPages<'a> {
    /// The column `descr` (a required list of nullable texts).
    pub fn new(
        descr: &ColumnDescPtr,
        first: &'a [String],
        events: &'a [String],
        ends: &'a [u32],
    ) -> Result<Self, ExportError> {
        if descr.max_def_level() != 2
            || descr.max_rep_level() != 1
            || descr.physical_type() != PhysicalType::BYTE_ARRAY
        {
            return Err(ExportError::Unsupported(
                "an events column that is not a required list of texts",
            ));
        }
        if !ends_fit(ends, events.len()) {
            return Err(ExportError::Unsupported(
                "an events column's rows end out of order or past its events",
            ));
        }
        Ok(EventPages {
            first,
            events,
            ends,
        })
    }
}

impl ColumnPages for EventPages<'_> {
    fn rows(&self) -> usize {
        self.ends.len()
    }

    fn encoding(&self) -> Encoding {
        Encoding::PLAIN
    }

    fn data_page(&self, rows: Range<usize>) -> (Vec<u8>, u32) {
        let mut start = start_of(self.ends, rows.start);
        let ends = self.ends.get(rows.clone()).unwrap_or_default();
        // Most pages have no events: every row an empty list, (0, 0).
        let last = ends.last().map_or(start, |e| *e as usize);
        if last == start && (rows.start > 0 || self.first.is_empty()) {
            let mut out = Vec::with_capacity(2 * (rows.len() / 8 + 16));
            for width in [1, 2] {
                zero_levels(rows.len(), width, &mut out);
            }
            // At most ROWS_PER_PAGE.
            return (out, rows.len() as u32);
        }
        let mut repetition = Vec::with_capacity(rows.len());
        let mut definition = Vec::with_capacity(rows.len());
        let mut values = Vec::new();
        for (row, end) in rows.zip(ends) {
            let end = *end as usize;
            let own = self.events.get(start..end).unwrap_or_default();
            let first: &[String] = if row == 0 { self.first } else { &[] };
            start = end;
            let mut items = 0;
            for (i, event) in first.iter().chain(own).enumerate() {
                repetition.push(u8::from(i > 0));
                definition.push(2);
                // An event's words are far fewer than 4 GiB.
                values.extend_from_slice(&(event.len() as u32).to_le_bytes());
                values.extend_from_slice(event.as_bytes());
                items += 1;
            }
            if items == 0 {
                repetition.push(0);
                definition.push(0);
            }
        }
        let mut out = Vec::with_capacity(values.len() + repetition.len() / 2 + 64);
        packed_levels(&repetition, 1, &mut out);
        packed_levels(&definition, 2, &mut out);
        out.extend_from_slice(&values);
        // A page's rows and events are far fewer than 2^32.
        (out, repetition.len() as u32)
    }
}

/// `count` levels of 0 of `width` bits, as [`packed_levels`] writes
/// them, without a level a row to pack.
fn zero_levels(count: usize, width: u8, out: &mut Vec<u8>) {
    let mut header = Vec::new();
    vtrace_storage::put_varint(&mut header, ((count.div_ceil(8) as u64) << 1) | 1);
    let bytes = count.div_ceil(8) * usize::from(width);
    // A page's levels take far fewer than 4 GiB.
    out.extend_from_slice(&((header.len() + bytes) as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.resize(out.len() + bytes, 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunks::{encode, tests::read_back, ROWS_PER_PAGE};
    use arrow_array::cast::AsArray;
    use arrow_schema::{DataType, Field};
    use std::sync::Arc;

    #[test]
    fn events_read_back_row_by_row() {
        // Over two pages: most rows without events, some with one or two,
        // and row 0 with those carried from the segment before.
        let n = ROWS_PER_PAGE + 40;
        let row_events = |row: usize| -> Vec<String> {
            (0..[0, 0, 0, 1, 2][row % 5])
                .map(|i| format!("event {row}.{i} \u{e9}"))
                .collect()
        };
        let first = vec!["carried".to_string()];
        let (mut events, mut ends) = (Vec::new(), Vec::new());
        for row in 0..n {
            events.extend(row_events(row));
            ends.push(events.len() as u32);
        }
        let mut want: Vec<Vec<String>> = (0..n).map(row_events).collect();
        want[0].insert(0, "carried".to_string());
        let list = DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true)));
        let arrays = read_back(Field::new("events", list, false), |descr| {
            let pages = EventPages::new(&descr, &first, &events, &ends).unwrap();
            encode(descr, &pages).unwrap()
        });
        let got: Vec<Vec<String>> = arrays
            .iter()
            .flat_map(|a| {
                a.as_list::<i32>()
                    .iter()
                    .map(|l| {
                        let l = l.expect("no null list");
                        l.as_string::<i32>()
                            .iter()
                            .map(|s| s.expect("no null item").to_string())
                            .collect()
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn zero_levels_are_packed_levels_of_zeros() {
        for (count, width) in [(1, 1), (8, 1), (9, 2), (65_536, 2), (65_541, 1)] {
            let (mut fast, mut packed) = (Vec::new(), Vec::new());
            zero_levels(count, width, &mut fast);
            packed_levels(&vec![0; count], width, &mut packed);
            assert_eq!(fast, packed, "{count} of width {width}");
        }
    }
}
