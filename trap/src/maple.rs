//! The entries of a Linux maple tree (how kernels 6.1 and later keep a
//! process's VMAs), read from guest memory.
//!
//! The node format is the kernel's (`include/linux/maple_tree.h`), fixed
//! for 64-bit kernels whatever their configuration:
//!
//! | node | bytes 0..8 | pivots | slots | after |
//! |---|---|---|---|---|
//! | `maple_leaf_64`, `maple_range_64` | parent | 15 at 8 | 16 at 128 | metadata (`end`) at 248, in place of the last slot when the node is not full |
//! | `maple_arange_64` | parent | 9 at 8 | 10 at 80 | 10 gaps at 160, metadata (`end`) at 240 |
//!
//! A pointer to a node carries the node's type in bits 3..6 (nodes are
//! 256-byte aligned); the root pointer also has bit 1 set (an XArray
//! "internal" entry), a child pointer has bits 0..1 clear. A leaf's slots
//! hold the entries themselves. The guest owns every byte read here: the walk is bounded in
//! depth and nodes, and an entry is only a candidate for the caller to
//! check.

/// Bytes in a node.
const NODE_SIZE: usize = 256;
/// Node types (`enum maple_type`).
const LEAF_64: u64 = 1;
const RANGE_64: u64 = 2;
const ARANGE_64: u64 = 3;
/// A tree deeper than this is not a real one (a full 64-bit range in
/// 10-way nodes needs 20 levels at the very worst; VMA trees use few).
const MAX_DEPTH: u32 = 24;
/// Nodes read at most per walk.
const MAX_NODES: usize = 4096;

/// Reads guest memory at a linear address; false where it is not mapped.
pub type ReadMem<'a> = dyn FnMut(u64, &mut [u8]) -> bool + 'a;

/// The non-empty entries of the maple tree whose root pointer is `root`,
/// in index order, at most `limit` of them. `None` where a node cannot be
/// read or does not read as one.
pub fn entries(root: u64, read: &mut ReadMem<'_>, limit: usize) -> Option<Vec<u64>> {
    let mut walk = Walk {
        read,
        out: Vec::new(),
        nodes: 0,
        limit,
    };
    if is_root_node(root) {
        walk.node(root, u64::MAX, 0)?;
    } else if root != 0 {
        // A tree of one entry keeps it in the root pointer.
        walk.out.push(root);
    }
    Some(walk.out)
}

/// Whether a root pointer points to a node (`xa_is_node`).
fn is_root_node(entry: u64) -> bool {
    entry & 3 == 2 && entry > 4096
}

/// Whether a slot of an inner node reads as a child node's pointer.
fn is_child_node(entry: u64) -> bool {
    entry & 3 == 0 && entry > 4096
}

struct Walk<'r, 'a> {
    read: &'r mut ReadMem<'a>,
    out: Vec<u64>,
    nodes: usize,
    limit: usize,
}

impl Walk<'_, '_> {
    /// Visits the node `entry` points to, covering indices up to `max`.
    fn node(&mut self, entry: u64, max: u64, depth: u32) -> Option<()> {
        self.nodes += 1;
        if depth > MAX_DEPTH || self.nodes > MAX_NODES {
            return None;
        }
        let kind = (entry >> 3) & 0xf;
        let at = entry & !0xff;
        let mut node = [0u8; NODE_SIZE];
        if !(self.read)(at, &mut node) {
            return None;
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&node[i * 8..i * 8 + 8]);
            u64::from_le_bytes(b)
        };
        let (pivots, slots, end) = match kind {
            LEAF_64 | RANGE_64 => {
                // `ma_data_end`: a node whose last pivot is unset says
                // where its data ends in its metadata; a full one ends at
                // its last pivot, or in the slot after it.
                let end = match word(1 + 14) {
                    0 => usize::from(node[248]),
                    last if last == max => 14,
                    _ => 15,
                };
                (15, 16, end)
            }
            ARANGE_64 => (9, 10, usize::from(node[240])),
            _ => return None,
        };
        let slot_at = 1 + pivots;
        for i in 0..=end.min(slots - 1) {
            let child = word(slot_at + i);
            if child == 0 {
                continue;
            }
            if kind == LEAF_64 {
                if self.out.len() >= self.limit {
                    return Some(());
                }
                self.out.push(child);
            } else {
                if !is_child_node(child) {
                    return None;
                }
                let child_max = if i < pivots { word(1 + i) } else { max };
                self.node(child, child_max, depth + 1)?;
            }
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Guest memory of whole nodes, by address.
    #[derive(Default)]
    struct Memory(HashMap<u64, [u8; NODE_SIZE]>);

    impl Memory {
        /// Puts a node of `kind` at `at` with the given pivots and slots
        /// and metadata end; returns its pointer as a parent holds it (a
        /// root pointer has bit 1 set as well).
        fn node(&mut self, at: u64, kind: u64, pivots: &[u64], slots: &[u64], end: u8) -> u64 {
            let mut n = [0u8; NODE_SIZE];
            let (pivot_at, slot_at, meta) = match kind {
                ARANGE_64 => (8, 80, 240),
                _ => (8, 128, 248),
            };
            for (i, p) in pivots.iter().enumerate() {
                n[pivot_at + i * 8..pivot_at + i * 8 + 8].copy_from_slice(&p.to_le_bytes());
            }
            for (i, s) in slots.iter().enumerate() {
                n[slot_at + i * 8..slot_at + i * 8 + 8].copy_from_slice(&s.to_le_bytes());
            }
            if pivots.len() < 15 || kind == ARANGE_64 {
                n[meta] = end;
            }
            self.0.insert(at, n);
            at | (kind << 3) | 4
        }

        fn walk(&self, root: u64, limit: usize) -> Option<Vec<u64>> {
            let mut read = |at: u64, buf: &mut [u8]| match self.0.get(&at) {
                Some(n) if buf.len() == NODE_SIZE => {
                    buf.copy_from_slice(n);
                    true
                }
                _ => false,
            };
            entries(root, &mut read, limit)
        }
    }

    const VMA: u64 = 0xffff_8880_0100_0000;

    #[test]
    fn a_two_level_tree_gives_its_leaf_entries_in_order() {
        let mut m = Memory::default();
        // Two leaves under an allocation-range root; the first leaf has a
        // gap (an empty slot) between its entries.
        let a = m.node(
            0xffff_8880_0200_0000,
            LEAF_64,
            &[0x3fff, 0x4fff, 0x5fff],
            &[VMA, 0, VMA + 0x100, VMA + 0x200],
            3,
        );
        let b = m.node(
            0xffff_8880_0200_0100,
            LEAF_64,
            &[0x7fff],
            &[VMA + 0x300, 0],
            1,
        );
        let root = m.node(0xffff_8880_0300_0000, ARANGE_64, &[0x5fff], &[a, b], 1) | 2;
        assert_eq!(
            m.walk(root, 100),
            Some(vec![VMA, VMA + 0x100, VMA + 0x200, VMA + 0x300])
        );
        assert_eq!(m.walk(root, 2), Some(vec![VMA, VMA + 0x100]));
    }

    #[test]
    fn a_full_leaf_ends_where_its_pivots_say() {
        let mut m = Memory::default();
        let pivots: Vec<u64> = (1..=15).map(|i| i * 0x1000).collect();
        let slots: Vec<u64> = (0..16).map(|i| VMA + i * 0x100).collect();
        // Its last pivot is the node's maximum: slot 15 is not data.
        let full = m.node(0xffff_8880_0200_0000, LEAF_64, &pivots, &slots, 0);
        let root = m.node(0xffff_8880_0300_0000, RANGE_64, &[0xf000], &[full, 0], 0) | 2;
        assert_eq!(m.walk(root, 100).map(|e| e.len()), Some(15));
    }

    #[test]
    fn the_guest_cannot_make_the_walk_loop_or_read_garbage_as_nodes() {
        let mut m = Memory::default();
        // A node that is its own child.
        let at = 0xffff_8880_0200_0000;
        let me = at | (RANGE_64 << 3) | 4;
        m.node(at, RANGE_64, &[0x1000], &[me, me], 1);
        assert_eq!(m.walk(me | 2, 100), None);
        // A child that is not a node pointer, and an unreadable one.
        let bad = m.node(0xffff_8880_0400_0000, RANGE_64, &[], &[VMA | 2], 0);
        assert_eq!(m.walk(bad | 2, 100), None);
        let gone = m.node(
            0xffff_8880_0500_0000,
            ARANGE_64,
            &[],
            &[0xffff_8880_0600_0000 | (LEAF_64 << 3) | 4],
            0,
        );
        assert_eq!(m.walk(gone | 2, 100), None);
        // No tree, and a tree of one entry.
        assert_eq!(m.walk(0, 100), Some(vec![]));
        assert_eq!(m.walk(VMA, 100), Some(vec![VMA]));
    }
}
