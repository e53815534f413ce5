//! The files of an initramfs: one or more `newc` cpio archives one after
//! the other, each plain or compressed, as the kernel unpacks them
//! (init/initramfs.c; Debian's put the CPU microcode in a plain archive
//! before the compressed main one).

use std::collections::{BTreeSet, HashMap};

use crate::decompress::{decompressed, DecompressError};

/// Why an initramfs cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum InitramfsError {
    /// A compressed archive does not decompress.
    #[error(transparent)]
    Decompress(#[from] DecompressError),
    /// The bytes are neither a cpio archive nor compressed in a known form.
    #[error("neither a cpio archive nor compressed in a known form")]
    Unknown,
    /// An archive's header does not parse.
    #[error("a cpio header does not parse")]
    BadHeader,
}

/// The newc header: magic and 13 fields of 8 hex digits.
const HEADER: usize = 110;
/// Archives read at most (each decompression is bounded by
/// [`crate::decompress::MAX_DECOMPRESSED`]).
const MAX_ARCHIVES: usize = 16;

const fn align4(n: usize) -> usize {
    n.div_ceil(4) * 4
}

/// The regular files among `wanted` (absolute paths, as a Linux process's
/// map names them) in the initramfs `bytes`, with their contents. Entries
/// not wanted are skipped, so a large initramfs costs no memory beyond
/// its decompressed bytes.
pub fn files_in(
    bytes: &[u8],
    wanted: &BTreeSet<String>,
) -> Result<HashMap<String, Vec<u8>>, InitramfsError> {
    files_where(bytes, &|path| wanted.contains(path))
}

/// The regular files whose absolute path `wanted` accepts, as
/// [`files_in`] reads them.
pub fn files_where(
    bytes: &[u8],
    wanted: &dyn Fn(&str) -> bool,
) -> Result<HashMap<String, Vec<u8>>, InitramfsError> {
    let mut found = HashMap::new();
    let mut owned: Vec<u8>;
    let mut rest = bytes;
    for _ in 0..MAX_ARCHIVES {
        // Archives are padded with zeros (to four bytes, or more).
        let start = rest.iter().position(|b| *b != 0).unwrap_or(rest.len());
        rest = &rest[start..];
        if rest.is_empty() {
            return Ok(found);
        }
        if !rest.starts_with(b"07070") {
            owned = match decompressed(rest) {
                Some(Ok(plain)) => plain,
                Some(Err(why)) => return Err(why.into()),
                None if found.is_empty() => return Err(InitramfsError::Unknown),
                // Trailing bytes the kernel would ignore too.
                None => return Ok(found),
            };
            rest = &owned;
            let read = read_archive(rest, wanted, &mut found);
            rest = &rest[read..];
            continue;
        }
        let read = read_archive(rest, wanted, &mut found);
        if read == 0 {
            return Err(InitramfsError::BadHeader);
        }
        rest = &rest[read..];
    }
    Ok(found)
}

/// Reads one archive from the start of `bytes`, keeping the files wanted;
/// returns how many bytes it took (up to its trailer), 0 if none parsed.
fn read_archive(
    bytes: &[u8],
    wanted: &dyn Fn(&str) -> bool,
    found: &mut HashMap<String, Vec<u8>>,
) -> usize {
    let mut used = 0;
    for entry in cpio_reader::iter_files(bytes) {
        used += align4(HEADER + entry.name().len() + 1) + align4(entry.file().len());
        let path = format!(
            "/{}",
            entry
                .name()
                .trim_start_matches("./")
                .trim_start_matches('/')
        );
        // The file type is a field, not a set of bits (a symbolic link's
        // includes a regular file's).
        let regular = entry.mode().bits() & 0o170_000 == 0o100_000;
        if regular && wanted(&path) {
            found.insert(path, entry.file().to_vec());
        }
    }
    if used == 0 {
        return 0;
    }
    // The trailer entry ("TRAILER!!!"), which the iterator does not yield.
    (used + align4(HEADER + "TRAILER!!!".len() + 1)).min(bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A newc archive of (name, mode, contents), with its trailer.
    fn archive(entries: &[(&str, u32, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        let trailer: (&str, u32, &[u8]) = ("TRAILER!!!", 0, b"");
        for (i, (name, mode, data)) in entries.iter().chain([&trailer]).enumerate() {
            out.extend(
                format!(
                    "070701{:08x}{mode:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
                    i + 1,
                    0,
                    0,
                    1,
                    0,
                    data.len(),
                    0,
                    0,
                    0,
                    0,
                    name.len() + 1,
                    0
                )
                .as_bytes(),
            );
            out.extend(name.as_bytes());
            out.push(0);
            out.resize(align4(out.len()), 0);
            out.extend(*data);
            out.resize(align4(out.len()), 0);
        }
        out
    }

    const FILE: u32 = 0o100755;
    const DIR: u32 = 0o040755;

    fn wanted(paths: &[&str]) -> BTreeSet<String> {
        paths.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn finds_the_wanted_files_in_archives_one_after_the_other() {
        let mut bytes = archive(&[("kernel", DIR, b""), ("kernel/microcode.bin", FILE, b"mc")]);
        bytes.extend([0u8; 512]);
        bytes.extend(archive(&[
            ("bin", DIR, b""),
            ("bin/vtprog", FILE, b"\x7fELF prog"),
            ("./lib/libc.so", FILE, b"libc"),
            ("etc/motd", FILE, b"hello"),
            ("bin/sh", 0o120777, b"vtprog"),
        ]));
        let files = files_in(
            &bytes,
            &wanted(&["/bin/vtprog", "/lib/libc.so", "/bin", "/bin/sh"]),
        )
        .unwrap();
        assert_eq!(files.len(), 2, "{:?}", files.keys());
        assert_eq!(files["/bin/vtprog"], b"\x7fELF prog");
        assert_eq!(files["/lib/libc.so"], b"libc");
    }

    #[test]
    fn a_compressed_archive_after_a_plain_one_is_decompressed() {
        let mut bytes = archive(&[("early", FILE, b"x")]);
        let main = archive(&[("bin/sh", FILE, b"shell")]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &main).unwrap();
        bytes.extend(gz.finish().unwrap());
        let files = files_in(&bytes, &wanted(&["/bin/sh"])).unwrap();
        assert_eq!(files["/bin/sh"], b"shell");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(files_in(b"not an archive", &wanted(&["/x"])).is_err());
        let mut cut = archive(&[("bin/vtprog", FILE, &[7u8; 300])]);
        cut.truncate(200);
        let _ = files_in(&cut, &wanted(&["/bin/vtprog"]));
        let mut bad = archive(&[("a", FILE, b"1")]);
        bad[10] = b'z';
        assert!(files_in(&bad, &wanted(&["/a"])).is_err());
    }
}
