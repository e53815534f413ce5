//! A vmlinux ELF's loaded bytes by link-time address: what its static
//! data holds before the kernel runs.

use object::{Object, ObjectSegment};

/// Longest string read (event and type names are short).
const MAX_STRING: usize = 128;

/// The loadable segments of a vmlinux, by address.
pub(super) struct ImageMemory<'a> {
    /// (start address, file bytes).
    segments: Vec<(u64, &'a [u8])>,
}

impl<'a> ImageMemory<'a> {
    /// The segments of `vmlinux`, if it is an ELF file.
    pub fn new(vmlinux: &'a [u8]) -> Option<ImageMemory<'a>> {
        let elf = object::File::parse(vmlinux).ok()?;
        let segments = elf
            .segments()
            .filter_map(|s| Some((s.address(), s.data().ok()?)))
            .collect();
        Some(ImageMemory { segments })
    }

    /// The bytes from `addr` to the end of its segment's file data.
    pub fn from(&self, addr: u64) -> Option<&'a [u8]> {
        self.segments.iter().find_map(|&(start, data)| {
            let offset = usize::try_from(addr.checked_sub(start)?).ok()?;
            data.get(offset..).filter(|d| !d.is_empty())
        })
    }

    /// The little-endian word at `addr`.
    pub fn u64_at(&self, addr: u64) -> Option<u64> {
        let bytes = self.from(addr)?.get(..8)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }

    /// The little-endian 32-bit word at `addr`.
    pub fn i32_at(&self, addr: u64) -> Option<i32> {
        let bytes = self.from(addr)?.get(..4)?;
        Some(i32::from_le_bytes(bytes.try_into().ok()?))
    }

    /// The NUL-terminated text at `addr` (printable ASCII, at most
    /// `MAX_STRING` bytes).
    pub fn c_string(&self, addr: u64) -> Option<String> {
        let bytes = self.from(addr)?;
        let end = bytes.iter().take(MAX_STRING).position(|&b| b == 0)?;
        let text = std::str::from_utf8(&bytes[..end]).ok()?;
        text.chars()
            .all(|c| c.is_ascii_graphic() || c == ' ')
            .then(|| text.to_string())
    }
}
