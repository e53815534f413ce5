//! Decompressing a bzImage payload on the host. KVM's emulator runs the
//! kernel's own decompressor at about a million instructions a second where
//! kernel code is emulated, which makes booting take minutes; on the host it
//! takes a fraction of a second.

use std::io::Read;

/// Payload compression, identified by magic bytes as the kernel's own
/// `decompress_method()` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    Gzip,
    Bzip2,
    Lzma,
    Xz,
    Lzo,
    Lz4,
    Zstd,
    Unknown,
}

impl Compression {
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
pub fn decompress(payload: &[u8], kind: Compression) -> Option<Result<Vec<u8>, String>> {
    let mut out = Vec::new();
    // One byte past the limit tells a payload that would exceed it.
    let limit = MAX_DECOMPRESSED + 1;
    let result = match kind {
        Compression::Gzip => flate2::read::GzDecoder::new(payload)
            .take(limit)
            .read_to_end(&mut out)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        // The kernel appends the uncompressed size after the frame, so only
        // one frame is read.
        Compression::Zstd => zstd::stream::read::Decoder::new(payload)
            .map(|d| d.single_frame().take(limit))
            .and_then(|mut d| d.read_to_end(&mut out))
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Compression::Lz4 => lz4_legacy(payload, &mut out),
        _ => return None,
    };
    if out.len() as u64 > MAX_DECOMPRESSED {
        return Some(Err(format!(
            "the kernel decompresses to more than {} MiB",
            MAX_DECOMPRESSED >> 20
        )));
    }
    Some(result.map(|()| out))
}

/// `payload` decompressed as its magic bytes say (a compressed initramfs,
/// say); `None` where it is not compressed in a form the host reads.
pub fn decompressed(payload: &[u8]) -> Option<Result<Vec<u8>, String>> {
    decompress(payload, Compression::detect(payload))
}

/// No kernel is bigger than this decompressed; a crafted payload (a
/// "zip bomb") must not take the host's memory.
pub const MAX_DECOMPRESSED: u64 = 1 << 30;

/// The LZ4 "legacy" container the kernel build uses (`lz4 -l`): a magic,
/// then blocks of at most 8 MiB, each prefixed by its compressed length.
/// lz4_flex decodes the blocks; the container is four lines, so it is read
/// here rather than pulling in a second LZ4 implementation for it.
fn lz4_legacy(payload: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
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
            .map_err(|e| format!("LZ4 block at offset {}: {e}", pos - 4))?;
        out.extend_from_slice(&block[..n]);
        if out.len() as u64 > MAX_DECOMPRESSED {
            break;
        }
        pos += len as usize;
    }
    if out.is_empty() {
        return Err("no LZ4 blocks in the payload".into());
    }
    Ok(())
}

#[cfg(test)]
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
    fn xz_is_left_to_the_guest() {
        assert!(decompress(b"\xfd7zXZ\x00", Compression::Xz).is_none());
    }
}
