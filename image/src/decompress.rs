//! Decompressing a bzImage payload on the host. KVM's emulator runs the
//! kernel's own decompressor at about a million instructions a second where
//! kernel code is emulated, which makes booting take minutes; on the host it
//! takes a fraction of a second.

use std::io::Read;

/// Why a payload did not decompress.
#[derive(Debug, thiserror::Error)]
pub enum DecompressError {
    /// It would be bigger than [`MAX_DECOMPRESSED`].
    #[error("more than {} MiB decompressed (vtrace's limit)", MAX_DECOMPRESSED >> 20)]
    TooLarge,
    /// The decoder found the stream corrupt (its own words).
    #[error("{0}")]
    Corrupt(String),
    /// The stream stops before its end marker.
    #[error("the compressed stream ends early")]
    EndsEarly,
    /// An LZ4 legacy container without one block.
    #[error("no LZ4 blocks in the payload")]
    NoLz4Blocks,
}

fn corrupt(e: impl std::fmt::Display) -> DecompressError {
    DecompressError::Corrupt(e.to_string())
}

/// Payload compression, identified by magic bytes as the kernel's own
/// `decompress_method()` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// gzip (or the old 0x9e variant).
    Gzip,
    /// bzip2.
    Bzip2,
    /// LZMA (the "alone" format).
    Lzma,
    /// XZ.
    Xz,
    /// LZO (vtrace does not unpack it).
    Lzo,
    /// LZ4, the legacy frame the kernel uses.
    Lz4,
    /// Zstandard.
    Zstd,
    /// None of these.
    Unknown,
}

impl Compression {
    /// The compression `payload` starts with.
    pub fn detect(payload: &[u8]) -> Compression {
        match payload {
            [0x1f, 0x8b | 0x9e, ..] => Compression::Gzip,
            [b'B', b'Z', b'h', ..] => Compression::Bzip2,
            [0x5d, 0x00, 0x00, ..] => Compression::Lzma,
            [0xfd, b'7', b'z', b'X', b'Z', 0x00, ..] => Compression::Xz,
            [0x89, b'L', b'Z', b'O', ..] => Compression::Lzo,
            [0x02, 0x21, 0x4c, 0x18, ..] => Compression::Lz4,
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Compression::Zstd,
            _ => Compression::Unknown,
        }
    }

    /// Its name, as the kernel's config calls it.
    pub fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Bzip2 => "bzip2",
            Compression::Lzma => "LZMA",
            Compression::Xz => "XZ",
            Compression::Lzo => "LZO",
            Compression::Lz4 => "LZ4",
            Compression::Zstd => "zstd",
            Compression::Unknown => "unknown",
        }
    }
}

/// Decompresses `payload`; `None` if this compression is not done on the
/// host (the guest's decompressor then runs instead).
pub fn decompress(payload: &[u8], kind: Compression) -> Option<Result<Vec<u8>, DecompressError>> {
    let mut out = Vec::new();
    // One byte past the limit tells a payload that would exceed it.
    let limit = MAX_DECOMPRESSED + 1;
    // Each decoder reads one stream: the kernel appends the uncompressed
    // size after it.
    let read_all = |reader: &mut dyn Read, out: &mut Vec<u8>| {
        reader
            .take(limit)
            .read_to_end(out)
            .map(|_| ())
            .map_err(corrupt)
    };
    let result = match kind {
        Compression::Gzip => read_all(&mut flate2::read::GzDecoder::new(payload), &mut out),
        Compression::Xz => xz2::stream::Stream::new_stream_decoder(u64::MAX, 0)
            .map_err(corrupt)
            .and_then(|stream| liblzma(payload, stream, &mut out)),
        // The kernel's LZMA is the "alone" format `lzma -9` writes.
        Compression::Lzma => xz2::stream::Stream::new_lzma_decoder(u64::MAX)
            .map_err(corrupt)
            .and_then(|stream| liblzma(payload, stream, &mut out)),
        Compression::Bzip2 => read_all(&mut bzip2::read::BzDecoder::new(payload), &mut out),
        Compression::Zstd => zstd::stream::read::Decoder::new(payload)
            .map(|d| d.single_frame().take(limit))
            .and_then(|mut d| d.read_to_end(&mut out))
            .map(|_| ())
            .map_err(corrupt),
        Compression::Lz4 => lz4_legacy(payload, &mut out),
        _ => return None,
    };
    if out.len() as u64 > MAX_DECOMPRESSED {
        return Some(Err(DecompressError::TooLarge));
    }
    Some(result.map(|()| out))
}

/// `payload` decompressed as its magic bytes say (a compressed initramfs,
/// say); `None` where it is not compressed in a form the host reads.
pub fn decompressed(payload: &[u8]) -> Option<Result<Vec<u8>, DecompressError>> {
    decompress(payload, Compression::detect(payload))
}

/// No kernel is bigger than this decompressed; a crafted payload (a
/// "zip bomb") must not take the host's memory.
pub const MAX_DECOMPRESSED: u64 = 1 << 30;

/// Runs a liblzma decoder over `payload` up to its stream's end. xz2's
/// reader is not used: it takes the size the kernel appends after the
/// stream for a corrupt second stream.
fn liblzma(
    mut payload: &[u8],
    mut stream: xz2::stream::Stream,
    out: &mut Vec<u8>,
) -> Result<(), DecompressError> {
    loop {
        if out.len() as u64 > MAX_DECOMPRESSED {
            return Ok(());
        }
        if out.capacity() - out.len() < 1 << 16 {
            out.reserve(4 << 20);
        }
        let (read, written) = (stream.total_in(), out.len());
        let status = stream
            .process_vec(payload, out, xz2::stream::Action::Run)
            .map_err(corrupt)?;
        let used = usize::try_from(stream.total_in() - read).unwrap_or(usize::MAX);
        payload = payload.get(used..).unwrap_or_default();
        if status == xz2::stream::Status::StreamEnd {
            return Ok(());
        }
        if used == 0 && out.len() == written {
            return Err(DecompressError::EndsEarly);
        }
    }
}

/// The LZ4 "legacy" container the kernel build uses (`lz4 -l`): a magic,
/// then blocks of at most 8 MiB, each prefixed by its compressed length.
/// lz4_flex decodes the blocks; the container is four lines, so it is read
/// here rather than pulling in a second LZ4 implementation for it.
fn lz4_legacy(payload: &[u8], out: &mut Vec<u8>) -> Result<(), DecompressError> {
    const MAGIC: u32 = 0x184c_2102;
    const BLOCK_MAX: usize = 8 << 20;
    let mut pos = 4;
    let mut block = vec![0u8; BLOCK_MAX];
    while pos + 4 <= payload.len() {
        let len = u32::from_le_bytes([
            payload[pos],
            payload[pos + 1],
            payload[pos + 2],
            payload[pos + 3],
        ]);
        pos += 4;
        if len == MAGIC {
            continue; // concatenated stream
        }
        let Some(data) = payload.get(pos..pos + len as usize) else {
            // What is left is the kernel's appended size field, not a block.
            break;
        };
        let n = lz4_flex::block::decompress_into(data, &mut block)
            .map_err(|e| corrupt(format!("LZ4 block at offset {}: {e}", pos - 4)))?;
        out.extend_from_slice(&block[..n]);
        if out.len() as u64 > MAX_DECOMPRESSED {
            break;
        }
        pos += len as usize;
    }
    if out.is_empty() {
        return Err(DecompressError::NoLz4Blocks);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn detects_the_kernel_formats() {
        assert_eq!(
            Compression::detect(&[0x02, 0x21, 0x4c, 0x18, 0]),
            Compression::Lz4
        );
        assert_eq!(Compression::detect(b"\xfd7zXZ\x00"), Compression::Xz);
        assert_eq!(Compression::detect(b"hello"), Compression::Unknown);
    }

    #[test]
    fn gzip_and_zstd_round_trip_with_trailing_size() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&data).unwrap();
        let mut gz = gz.finish().unwrap();
        gz.extend_from_slice(&(data.len() as u32).to_le_bytes());
        assert_eq!(decompress(&gz, Compression::Gzip).unwrap().unwrap(), data);

        let mut zs = zstd::encode_all(&data[..], 3).unwrap();
        zs.extend_from_slice(&(data.len() as u32).to_le_bytes());
        assert_eq!(decompress(&zs, Compression::Zstd).unwrap().unwrap(), data);
    }

    #[test]
    fn lz4_legacy_blocks_with_trailing_size() {
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 13) as u8).collect();
        let block = lz4_flex::block::compress(&data);
        let mut payload = 0x184c_2102u32.to_le_bytes().to_vec();
        for _ in 0..2 {
            payload.extend_from_slice(&(block.len() as u32).to_le_bytes());
            payload.extend_from_slice(&block);
        }
        payload.extend_from_slice(&(2 * data.len() as u32).to_le_bytes());
        let out = decompress(&payload, Compression::Lz4).unwrap().unwrap();
        assert_eq!(out.len(), 2 * data.len());
        assert_eq!(&out[..data.len()], &data[..]);
    }

    #[test]
    fn xz_lzma_and_bzip2_round_trip_with_trailing_size() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let size = (data.len() as u32).to_le_bytes();
        let with_size = |mut v: Vec<u8>| {
            v.extend_from_slice(&size);
            v
        };
        // As the kernel's build compresses: xz with CRC32 and the x86 BCJ
        // filter, LZMA alone, bzip2 -9.
        let mut filters = xz2::stream::Filters::new();
        filters.x86();
        filters.lzma2(&xz2::stream::LzmaOptions::new_preset(6).unwrap());
        let stream =
            xz2::stream::Stream::new_stream_encoder(&filters, xz2::stream::Check::Crc32).unwrap();
        let mut xz = xz2::write::XzEncoder::new_stream(Vec::new(), stream);
        xz.write_all(&data).unwrap();
        let xz = with_size(xz.finish().unwrap());
        assert_eq!(Compression::detect(&xz), Compression::Xz);
        assert_eq!(decompress(&xz, Compression::Xz).unwrap().unwrap(), data);

        let options = xz2::stream::LzmaOptions::new_preset(9).unwrap();
        let stream = xz2::stream::Stream::new_lzma_encoder(&options).unwrap();
        let mut lzma = xz2::write::XzEncoder::new_stream(Vec::new(), stream);
        lzma.write_all(&data).unwrap();
        let lzma = with_size(lzma.finish().unwrap());
        assert_eq!(Compression::detect(&lzma), Compression::Lzma);
        assert_eq!(decompress(&lzma, Compression::Lzma).unwrap().unwrap(), data);

        let mut bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::best());
        bz.write_all(&data).unwrap();
        let bz = with_size(bz.finish().unwrap());
        assert_eq!(Compression::detect(&bz), Compression::Bzip2);
        assert_eq!(decompress(&bz, Compression::Bzip2).unwrap().unwrap(), data);
    }

    #[test]
    fn lzo_is_left_to_the_guest() {
        assert!(decompress(b"\x89LZO\x00", Compression::Lzo).is_none());
    }
}
