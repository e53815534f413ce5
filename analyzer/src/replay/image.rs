//! Read-only memory from an ELF image: what a kernel's text and read-only
//! data hold at every step, without the trace having touched it.

use object::{Object, ObjectSegment, SegmentFlags};

/// The read-only loadable segments of an ELF image, at their virtual
/// addresses.
#[derive(Clone, Debug, Default)]
pub struct ReadOnlyImage {
    /// Start address and bytes of each segment.
    ranges: Vec<(u64, Vec<u8>)>,
}

/// ELF segment flag: writable.
const PF_W: u32 = 2;

impl ReadOnlyImage {
    /// The read-only segments of the ELF image `bytes` (none where it is
    /// not one).
    pub fn from_elf(bytes: &[u8]) -> ReadOnlyImage {
        let mut ranges = Vec::new();
        if let Ok(file) = object::File::parse(bytes) {
            for segment in file.segments() {
                let writable = match segment.flags() {
                    SegmentFlags::Elf { p_flags } => p_flags & PF_W != 0,
                    _ => true,
                };
                if writable {
                    continue;
                }
                if let Ok(data) = segment.data() {
                    if !data.is_empty() {
                        ranges.push((segment.address(), data.to_vec()));
                    }
                }
            }
        }
        ReadOnlyImage { ranges }
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The byte at `addr`, where the image has one.
    pub fn byte(&self, addr: u64) -> Option<u8> {
        self.ranges.iter().find_map(|(start, data)| {
            let at = usize::try_from(addr.checked_sub(*start)?).ok()?;
            data.get(at).copied()
        })
    }
}
