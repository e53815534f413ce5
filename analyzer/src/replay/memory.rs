//! What a trace says memory held at a step: the values its steps loaded
//! and stored (where the registers make them exact), the bytes captures
//! copied, the code it ran, and the read-only parts of the kernel's image.
//!
//! A byte's value at step N (before step N runs) is taken from the last
//! access to it before N in the same traced stretch: a store's value, or
//! the value a load saw. A store whose value is not known (`add [m], 1`)
//! makes the byte unknown from there on. With no access before N in the
//! stretch, the first access after N tells, if it is a load: nothing the
//! trace saw wrote the byte in between. Across a break in the trace (tracing
//! stopped and started, a gap) nothing carries: the guest ran unseen.
//! Code bytes hold at every step (the trace fetched them), and so do the
//! image's read-only segments, unless an access says otherwise.

/// Bit 63 of CR3 (keep the PCID's translations) and the PCID in its low 12
/// bits are not part of the address space's identity.
const CR3_ROOT: u64 = 0x000f_ffff_ffff_f000;

/// Addresses from here up are the kernel's half, the same in every address
/// space.
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;

/// How a trace's addresses divide into address spaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spaces {
    /// The kernel runs in the upper half (Linux): an address below it
    /// belongs to the address space (CR3) it was used in.
    Split,
    /// The kernel runs in the lower half (the demo OS): every address
    /// space maps it the same, and a lower-half address cannot be told
    /// apart by CR3.
    Flat,
}

impl Spaces {
    /// The tag of address space `cr3`'s lower half.
    pub fn root(self, cr3: u64) -> u64 {
        match self {
            Spaces::Split => (cr3 & CR3_ROOT) | 1,
            Spaces::Flat => 0,
        }
    }

    /// How a trace divides, from its kernel steps' addresses: `Split`
    /// where most run in the upper half.
    pub fn of_kernel_steps(upper: u64, lower: u64) -> Spaces {
        if upper > lower {
            Spaces::Split
        } else {
            Spaces::Flat
        }
    }
}

/// The address space `addr` belongs to, used where the lower half's tag
/// is `root` ([`Spaces::root`]): 0 for the kernel's half.
pub fn space_of(root: u64, addr: u64) -> u64 {
    if addr >= KERNEL_HALF {
        0
    } else {
        root
    }
}

/// One access of a step, as the index keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    /// [`space_of`] the access.
    pub space: u64,
    /// Its first byte.
    pub addr: u64,
    /// The step that made it (for a capture, the step it came before).
    pub step: u64,
    /// The value, little-endian, where known.
    pub value: Option<u64>,
    /// Bytes, 1 to 8.
    pub size: u8,
    /// A store (else a load or a capture).
    pub store: bool,
}

impl Observation {
    /// The byte at `addr` if this access covers it: `Some(None)` where it
    /// covers it without a known value.
    fn byte(&self, addr: u64) -> Option<Option<u8>> {
        let at = addr.checked_sub(self.addr)?;
        if at >= u64::from(self.size) {
            return None;
        }
        Some(self.value.map(|v| (v >> (8 * at)) as u8))
    }

    /// Whether it happened before step `n` ran, as seen from there: a load
    /// by step `n` itself sees memory as it was before `n`.
    fn before(&self, n: u64) -> bool {
        self.step < n || (self.step == n && !self.store)
    }
}

/// Every [`Observation`] of a trace, sorted for look-up by address.
#[derive(Debug, Default)]
pub struct MemoryIndex {
    /// Sorted by space, address, then step.
    seen: Vec<Observation>,
    /// Where the trace broke: the first step of each traced stretch after
    /// the first, sorted.
    breaks: Vec<u64>,
}

impl MemoryIndex {
    /// An index of `seen` (any order) with the stretches `breaks` start.
    pub fn new(mut seen: Vec<Observation>, mut breaks: Vec<u64>) -> MemoryIndex {
        seen.sort_unstable_by_key(|o| (o.space, o.addr, o.step));
        breaks.sort_unstable();
        breaks.dedup();
        MemoryIndex { seen, breaks }
    }

    /// How many accesses it holds.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    fn stretch(&self, step: u64) -> usize {
        self.breaks.partition_point(|&b| b <= step)
    }

    /// The accesses that start at `addr` in `space`, in step order.
    fn at(&self, space: u64, addr: u64) -> &[Observation] {
        let from = self
            .seen
            .partition_point(|o| (o.space, o.addr) < (space, addr));
        let to = self
            .seen
            .partition_point(|o| (o.space, o.addr) <= (space, addr));
        &self.seen[from..to]
    }

    /// The step nearest `from` whose access touches `len` bytes at `addr`
    /// in `space`: the first from `from` on (`forward`), else the last
    /// before it. `stores` and `loads` say which accesses count.
    ///
    /// It walks the accesses that start in the range (or up to 7 bytes
    /// below it), not the range's bytes: a watch over half the address
    /// space costs what the trace holds, no more.
    pub fn nearest_access(
        &self,
        space: u64,
        range: (u64, u64),
        from: u64,
        kinds: (bool, bool),
        forward: bool,
    ) -> Option<u64> {
        let (addr, len) = range;
        let (stores, loads) = kinds;
        let end = addr.saturating_add(len.max(1));
        let first = addr.saturating_sub(7);
        let lo = self
            .seen
            .partition_point(|o| (o.space, o.addr) < (space, first));
        let hi = self
            .seen
            .partition_point(|o| (o.space, o.addr) < (space, end));
        let touches = |o: &&Observation| {
            (if o.store { stores } else { loads })
                && o.addr.saturating_add(u64::from(o.size)) > addr
        };
        let steps = self.seen[lo..hi].iter().filter(touches).map(|o| o.step);
        match forward {
            true => steps.filter(|&s| s >= from).min(),
            false => steps.filter(|&s| s < from).max(),
        }
    }

    /// The byte at `addr` in `space` before step `n` runs: `Some(Some(v))`
    /// known, `Some(None)` touched in a way that leaves it unknown, `None`
    /// where the trace says nothing of it.
    pub fn byte(&self, space: u64, addr: u64, n: u64) -> Option<Option<u8>> {
        let stretch = self.stretch(n);
        // The latest access before n and the earliest after it, among
        // those that cover the byte (an access starts at most 7 bytes
        // below it).
        let mut last: Option<&Observation> = None;
        let mut next: Option<&Observation> = None;
        for back in 0..8u64 {
            let Some(start) = addr.checked_sub(back) else {
                break;
            };
            let runs = self.at(space, start);
            let split = runs.partition_point(|o| o.before(n));
            // A load of no known value tells nothing.
            let telling =
                |o: &&Observation| o.byte(addr).is_some() && (o.store || o.value.is_some());
            let earlier = runs[..split].iter().rev().find(telling);
            let later = runs[split..].iter().find(telling);
            if let Some(o) = earlier {
                if last.is_none_or(|l| (o.step, o.store) > (l.step, l.store)) {
                    last = Some(o);
                }
            }
            if let Some(o) = later {
                if next.is_none_or(|l| (o.step, o.store) < (l.step, l.store)) {
                    next = Some(o);
                }
            }
        }
        if let Some(o) = last.filter(|o| self.stretch(o.step) == stretch) {
            return o.byte(addr);
        }
        match next.filter(|o| self.stretch(o.step) == stretch) {
            Some(o) if !o.store => o.byte(addr),
            Some(_) => Some(None),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(addr: u64, step: u64, size: u8, value: u64) -> Observation {
        Observation {
            space: 0,
            addr,
            step,
            value: Some(value),
            size,
            store: false,
        }
    }

    fn store(addr: u64, step: u64, size: u8, value: Option<u64>) -> Observation {
        Observation {
            store: true,
            value,
            ..load(addr, step, size, 0)
        }
    }

    #[test]
    fn the_last_access_before_the_step_tells() {
        let index = MemoryIndex::new(
            vec![
                store(0x1000, 10, 8, Some(0x1122_3344_5566_7788)),
                store(0x1002, 20, 1, Some(0xaa)),
            ],
            vec![],
        );
        // Before step 10 ran the byte is unknown: a store tells only after.
        assert_eq!(index.byte(0, 0x1000, 10), Some(None));
        assert_eq!(index.byte(0, 0x1000, 11), Some(Some(0x88)));
        assert_eq!(index.byte(0, 0x1007, 11), Some(Some(0x11)));
        assert_eq!(index.byte(0, 0x1002, 20), Some(Some(0x66)));
        assert_eq!(index.byte(0, 0x1002, 21), Some(Some(0xaa)));
        assert_eq!(index.byte(0, 0x1008, 21), None);
        assert_eq!(index.byte(1, 0x1000, 21), None, "another address space");
    }

    #[test]
    fn a_load_after_the_step_tells_what_was_there() {
        let index = MemoryIndex::new(vec![load(0x2000, 50, 4, 0xdead_beef)], vec![]);
        assert_eq!(index.byte(0, 0x2000, 5), Some(Some(0xef)));
        // A load by the step itself sees memory before it.
        assert_eq!(index.byte(0, 0x2003, 50), Some(Some(0xde)));
        assert_eq!(index.byte(0, 0x2003, 51), Some(Some(0xde)));
    }

    #[test]
    fn a_store_of_unknown_value_hides_what_came_before() {
        let index = MemoryIndex::new(
            vec![load(0x3000, 5, 8, 7), store(0x3000, 9, 8, None)],
            vec![],
        );
        assert_eq!(index.byte(0, 0x3000, 9), Some(Some(7)));
        assert_eq!(index.byte(0, 0x3000, 10), Some(None));
        // Before the first access, a later store says nothing of it.
        let index = MemoryIndex::new(vec![store(0x3000, 9, 8, None)], vec![]);
        assert_eq!(index.byte(0, 0x3000, 3), Some(None));
        let index = MemoryIndex::new(vec![store(0x3000, 9, 8, Some(1))], vec![]);
        assert_eq!(index.byte(0, 0x3000, 3), Some(None));
    }

    #[test]
    fn the_nearest_store_to_a_range_is_found_both_ways() {
        let index = MemoryIndex::new(
            vec![
                store(0x5000, 10, 8, Some(1)),
                load(0x5004, 20, 4, 2),
                store(0x5006, 30, 2, None),
                store(0x5010, 40, 8, Some(3)),
            ],
            vec![],
        );
        let stores = (true, false);
        // An 8-byte store at 0x5000 covers 0x5004.
        assert_eq!(
            index.nearest_access(0, (0x5004, 4), 0, stores, true),
            Some(10)
        );
        assert_eq!(
            index.nearest_access(0, (0x5004, 4), 11, stores, true),
            Some(30)
        );
        assert_eq!(
            index.nearest_access(0, (0x5004, 4), 30, stores, false),
            Some(10)
        );
        assert_eq!(
            index.nearest_access(0, (0x5004, 4), 31, stores, false),
            Some(30)
        );
        assert_eq!(index.nearest_access(0, (0x5004, 4), 31, stores, true), None);
        // Loads count where asked.
        assert_eq!(
            index.nearest_access(0, (0x5004, 1), 11, (false, true), true),
            Some(20)
        );
        assert_eq!(index.nearest_access(1, (0x5004, 4), 0, stores, true), None);
    }

    #[test]
    fn a_watch_over_the_whole_address_space_walks_the_accesses_only() {
        let index = MemoryIndex::new(
            vec![
                store(0x5000, 10, 8, Some(1)),
                store(u64::MAX - 3, 20, 4, None),
            ],
            vec![],
        );
        let stores = (true, false);
        // Byte by byte this range would take centuries.
        let all = (0, 0x7fff_ffff_ffff_ffff);
        assert_eq!(index.nearest_access(0, all, 0, stores, true), Some(10));
        assert_eq!(index.nearest_access(0, all, 11, stores, true), None);
        let to_the_top = (0x8000, u64::MAX);
        assert_eq!(
            index.nearest_access(0, to_the_top, 0, stores, true),
            Some(20)
        );
        assert_eq!(
            index.nearest_access(0, (0, u64::MAX), 30, stores, false),
            Some(20)
        );
    }

    #[test]
    fn nothing_carries_across_a_break() {
        let index = MemoryIndex::new(
            vec![store(0x4000, 10, 1, Some(1)), load(0x4001, 200, 1, 2)],
            vec![100],
        );
        assert_eq!(index.byte(0, 0x4000, 50), Some(Some(1)));
        assert_eq!(index.byte(0, 0x4000, 150), None);
        assert_eq!(index.byte(0, 0x4001, 150), Some(Some(2)));
        assert_eq!(index.byte(0, 0x4001, 50), None);
    }

    #[test]
    fn user_addresses_belong_to_their_address_space() {
        let root = Spaces::Split.root(0x8000_0000_0010_2003);
        assert_eq!(root, 0x10_2001);
        assert_eq!(space_of(root, 0x40_0000), 0x10_2001);
        assert_eq!(space_of(root, 0xffff_ffff_8100_0000), 0);
        assert_eq!(space_of(Spaces::Flat.root(0x10_2000), 0x40_0000), 0);
    }
}
