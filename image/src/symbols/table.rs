//! A sorted table of code symbols and the lookup of an address in it.

/// One routine (or code label) and where it starts. A symbol with an
/// empty name marks a hole: code from there to the next symbol is named
/// by none (the code after a stripped program's PLT).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Its first address.
    pub start: u64,
    /// Size in bytes when the source knows it (ELF), else 0.
    pub size: u64,
    /// Its name.
    pub name: String,
}

/// Code symbols of one source, sorted by address, one per address.
#[derive(Clone, Debug, Default)]
pub struct SymbolTable {
    symbols: Vec<Symbol>,
    /// Addresses at or past this are not covered (end of the last code
    /// section, or of the last symbol).
    end: u64,
}

/// How far past a sizeless last symbol an address still belongs to it.
/// System.map gives no sizes; a page is generous for a last routine and
/// keeps far-away addresses from resolving to it.
const SIZELESS_TAIL: u64 = 4096;

impl SymbolTable {
    /// Builds a table from symbols in any order. Where several share an
    /// address, the first in `symbols` wins: sources list their preferred
    /// names (global functions) first. `end` bounds the covered range;
    /// `None` derives it from the last symbol.
    pub fn new(mut symbols: Vec<Symbol>, end: Option<u64>) -> SymbolTable {
        // A stable sort keeps the sources' preference among equal starts.
        symbols.sort_by_key(|s| s.start);
        symbols.dedup_by_key(|s| s.start);
        let end = end.unwrap_or_else(|| {
            symbols
                .last()
                .map(|s| s.start.saturating_add(s.size.max(SIZELESS_TAIL)))
                .unwrap_or(0)
        });
        SymbolTable { symbols, end }
    }

    /// How many symbols.
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// The symbols, by address.
    pub fn symbols(&self) -> &[Symbol] {
        &self.symbols
    }

    /// Symbol `index`, in address order.
    pub fn get(&self, index: usize) -> Option<&Symbol> {
        self.symbols.get(index)
    }

    /// Lowest and one past the highest address covered.
    pub fn range(&self) -> Option<(u64, u64)> {
        Some((self.symbols.first()?.start, self.end))
    }

    /// Index of the symbol containing `addr`: the last one starting at or
    /// below it, up to the next symbol (padding between routines belongs to
    /// the one before, as in System.map, so ELF and map sources agree).
    pub fn lookup(&self, addr: u64) -> Option<usize> {
        if addr >= self.end {
            return None;
        }
        let i = self.symbols.partition_point(|s| s.start <= addr);
        i.checked_sub(1)
            .filter(|&i| !self.symbols[i].name.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(start: u64, size: u64, name: &str) -> Symbol {
        Symbol {
            start,
            size,
            name: name.into(),
        }
    }

    #[test]
    fn a_hole_is_named_by_no_symbol() {
        let t = SymbolTable::new(
            vec![
                sym(0x1000, 0x100, ".plt"),
                sym(0x1100, 0, ""),
                sym(0x2000, 0x10, "b"),
            ],
            Some(0x3000),
        );
        assert_eq!(t.lookup(0x10ff), Some(0));
        assert_eq!(t.lookup(0x1100), None);
        assert_eq!(t.lookup(0x1fff), None);
        assert_eq!(t.lookup(0x2000), Some(2));
    }

    #[test]
    fn lookup_covers_up_to_the_next_symbol_and_stops_at_the_end() {
        let t = SymbolTable::new(
            vec![sym(0x2000, 0x10, "b"), sym(0x1000, 0x20, "a")],
            Some(0x2010),
        );
        assert_eq!(t.lookup(0xfff), None);
        assert_eq!(
            t.lookup(0x1000).map(|i| &t.symbols()[i].name[..]),
            Some("a")
        );
        assert_eq!(
            t.lookup(0x1fff).map(|i| &t.symbols()[i].name[..]),
            Some("a")
        );
        assert_eq!(
            t.lookup(0x200f).map(|i| &t.symbols()[i].name[..]),
            Some("b")
        );
        assert_eq!(t.lookup(0x2010), None);
    }

    #[test]
    fn the_first_name_at_an_address_wins() {
        let t = SymbolTable::new(
            vec![sym(0x1000, 0, "global"), sym(0x1000, 0, "alias")],
            None,
        );
        assert_eq!(t.len(), 1);
        assert_eq!(t.symbols()[0].name, "global");
        assert_eq!(t.range(), Some((0x1000, 0x1000 + SIZELESS_TAIL)));
    }
}
