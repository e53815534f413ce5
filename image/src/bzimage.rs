//! Linux bzImages as files: the setup header, the version string and the
//! compressed payload, and the vmlinux ELF inside. The VMM boots from
//! them; the symbol reader and the probe and task readers look inside.

use linux_loader::loader::bootparam::setup_header;
use vm_memory::ByteValued;

use crate::decompress::{decompress, Compression};

/// Where the setup header starts in the file.
const HEADER_OFFSET: usize = 0x1f1;

/// Whether `bytes` carry a bzImage's "HdrS" signature.
pub fn is_bzimage(bytes: &[u8]) -> bool {
    bytes.get(0x202..0x206) == Some(b"HdrS")
}

/// The setup header (linux-loader's layout of it); `None` if the file is
/// too short to hold one.
pub fn read_header(bytes: &[u8]) -> Option<setup_header> {
    let mut header = setup_header::default();
    let len = header.as_slice().len();
    header
        .as_mut_slice()
        .copy_from_slice(bytes.get(HEADER_OFFSET..HEADER_OFFSET.checked_add(len)?)?);
    Some(header)
}

/// The kernel's version string, as `file` and the boot loaders print it.
pub fn version_string(bytes: &[u8], header: &setup_header) -> Option<String> {
    if header.kernel_version == 0 {
        return None;
    }
    let start = 0x200 + usize::from(header.kernel_version);
    let tail = bytes.get(start..)?;
    let end = tail.iter().take(256).position(|&b| b == 0)?;
    Some(String::from_utf8_lossy(&tail[..end]).into_owned())
}

/// The compressed payload, if the header describes one that lies inside
/// the file.
pub fn payload<'a>(bytes: &'a [u8], header: &setup_header) -> Option<&'a [u8]> {
    let setup_sects = if header.setup_sects == 0 {
        4
    } else {
        usize::from(header.setup_sects)
    };
    let start = (setup_sects + 1)
        .checked_mul(512)?
        .checked_add(header.payload_offset as usize)?;
    bytes.get(start..start.checked_add(header.payload_length as usize)?)
}

/// The vmlinux ELF inside a bzImage, decompressed on the host; `None` if
/// `bytes` is not a bzImage, its payload is not an ELF, or its compression
/// is one vtrace does not decompress (see [`decompress`]). The symbol
/// reader takes the kernel's own symbol table (kallsyms) from it.
pub fn vmlinux_inside(bytes: &[u8]) -> Option<Vec<u8>> {
    if !is_bzimage(bytes) {
        return None;
    }
    let header = read_header(bytes)?;
    let payload = payload(bytes, &header)?;
    decompress(payload, Compression::detect(payload))?
        .ok()
        .filter(|v| v.starts_with(b"\x7fELF"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_file_is_not_a_bzimage() {
        assert!(!is_bzimage(b"MZ"));
        assert!(read_header(&[0u8; 0x200]).is_none());
        assert!(vmlinux_inside(&[0u8; 0x300]).is_none());
    }
}
