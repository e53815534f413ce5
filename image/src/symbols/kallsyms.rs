//! The symbol table a Linux kernel carries for itself, recovered from the
//! kernel image. Distribution kernels often ship without usable symbols
//! (Debian's `System.map` is a stub naming the `-dbg` package, and the
//! vmlinux inside a bzImage is stripped), but a kernel built with
//! `CONFIG_KALLSYMS` keeps a compressed copy of its symbols in `.rodata`
//! for `/proc/kallsyms`. Nothing labels it in a stripped image, so its
//! tables (written by the kernel's `scripts/kallsyms.c`, each 8-aligned)
//! are found by their shape and every step is cross-checked:
//!
//! - `kallsyms_token_table`: 256 NUL-terminated tokens. Byte values no
//!   token replaced stand for themselves, so "0" to "9" sit in a row; the
//!   table is found from them. `kallsyms_token_index` after it must hold
//!   each token's offset.
//! - `kallsyms_num_syms`, then `kallsyms_names`: per symbol a length
//!   (one byte, two when the top bit is set) and that many token numbers;
//!   the first character is the `nm` type. Found by scanning back from
//!   the token table for a count whose names end where
//!   `kallsyms_markers` (the offset of every 256th name) starts, with
//!   every marker matching.
//! - `kallsyms_offsets` and `kallsyms_relative_base`
//!   (`CONFIG_KALLSYMS_BASE_RELATIVE`, the x86-64 default since 4.6):
//!   before `num_syms` up to 6.x, after the token index in later layouts.
//!   Both places and both offset encodings are tried; the one whose code
//!   addresses come out sorted, as the kernel sorts them, is taken.
//!
//! A hand-written reader: no crate decodes these tables.

use super::map::code_table;
use super::table::SymbolTable;
use super::SymbolError;

const ALIGN: usize = 8;
/// Bounds that keep a damaged or foreign image from sending the search
/// far afield: more symbols than any kernel has, further back than any
/// kernel's name table reaches.
const MAX_SYMBOLS: usize = 4_000_000;
const MAX_TABLES_SPAN: usize = 256 << 20;

fn align_up(x: usize) -> usize {
    x.div_ceil(ALIGN) * ALIGN
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The token table: each token's bytes, and where the table and the
/// token index after it end.
struct Tokens<'a> {
    tokens: Vec<&'a [u8]>,
    start: usize,
    index_end: usize,
}

/// Reads 256 non-empty tokens at `start` and checks the index after them.
fn tokens_at(image: &[u8], start: usize) -> Option<Tokens<'_>> {
    let mut tokens = Vec::with_capacity(256);
    let mut at = start;
    for _ in 0..256 {
        let len = image.get(at..)?.iter().position(|&b| b == 0)?;
        if len == 0 {
            return None;
        }
        tokens.push(&image[at..at + len]);
        at += len + 1;
    }
    let index = align_up(at);
    let mut offset = 0usize;
    for (i, t) in tokens.iter().enumerate() {
        if usize::from(u16_at(image, index + 2 * i)?) != offset {
            return None;
        }
        offset += t.len() + 1;
    }
    Some(Tokens {
        tokens,
        start,
        index_end: index + 512,
    })
}

/// Finds the token table from its run of digit tokens.
fn find_tokens(image: &[u8]) -> Option<Tokens<'_>> {
    const DIGITS: &[u8] = b"0\x001\x002\x003\x004\x005\x006\x007\x008\x009\x00";
    let mut from = 0;
    while let Some(pos) = image
        .get(from..)?
        .windows(DIGITS.len())
        .position(|w| w == DIGITS)
    {
        let hit = from + pos;
        from = hit + 1;
        // "0" is token 0x30: step back over the 48 tokens before it.
        let mut start = hit;
        let mut ok = true;
        for _ in 0..0x30 {
            if start < 2 || image[start - 1] != 0 {
                ok = false;
                break;
            }
            match image[..start - 1].iter().rposition(|&b| b == 0) {
                Some(nul) if nul + 1 < start - 1 => start = nul + 1,
                _ => {
                    ok = false;
                    break;
                }
            }
        }
        if ok && start % ALIGN == 0 {
            if let Some(t) = tokens_at(image, start) {
                return Some(t);
            }
        }
    }
    None
}

/// The name entry at `at`: where its token numbers start and how many
/// there are (one length byte, two when the top bit is set).
fn name_entry(image: &[u8], at: usize) -> Option<(usize, usize)> {
    let len = usize::from(*image.get(at)?);
    if len & 0x80 == 0 {
        return Some((at + 1, len));
    }
    Some((at + 2, (len & 0x7f) | usize::from(*image.get(at + 1)?) << 7))
}

/// Where each of `count` names starting at `names` begins (relative to
/// `names`), and where the last ends; `None` if they run past `limit`.
fn name_bounds(
    image: &[u8],
    names: usize,
    count: usize,
    limit: usize,
) -> Option<(Vec<u32>, usize)> {
    let mut starts = Vec::with_capacity(count);
    let mut at = names;
    for _ in 0..count {
        starts.push(u32::try_from(at - names).ok()?);
        let (tokens, len) = name_entry(image, at)?;
        if len == 0 {
            return None;
        }
        at = tokens + len;
        if at > limit {
            return None;
        }
    }
    Some((starts, at))
}

/// The name table: where it starts, how many names, and where each begins.
struct Names {
    start: usize,
    count: usize,
    starts: Vec<u32>,
}

/// Scans back from the token table for `num_syms` and the names after it,
/// accepted only when `kallsyms_markers` after them agrees.
fn find_names(image: &[u8], tokens: &Tokens) -> Option<Names> {
    let lowest = tokens.start.saturating_sub(MAX_TABLES_SPAN).max(ALIGN);
    let mut names = tokens.start - tokens.start % ALIGN;
    while names >= lowest {
        let candidate = names;
        names -= ALIGN;
        let Some(count) = u32_at(image, candidate - ALIGN).map(|c| c as usize) else {
            continue;
        };
        // The count is a 4-byte value padded to 8 with zeros.
        if count == 0 || count > MAX_SYMBOLS || u32_at(image, candidate - 4) != Some(0) {
            continue;
        }
        // The first characters are nm types: a cheap test before the walk.
        let first_type = image
            .get(candidate + 1)
            .and_then(|&t| tokens.tokens.get(usize::from(t)));
        if !first_type.is_some_and(|t| t[0].is_ascii_alphabetic()) {
            continue;
        }
        let Some((starts, end)) = name_bounds(image, candidate, count, tokens.start) else {
            continue;
        };
        let markers = align_up(end);
        let agree = starts
            .iter()
            .step_by(256)
            .enumerate()
            .all(|(i, s)| u32_at(image, markers + 4 * i) == Some(*s));
        if agree {
            return Some(Names {
                start: candidate,
                count,
                starts,
            });
        }
    }
    None
}

/// Expands name `i` into its type and text.
fn expand(image: &[u8], tokens: &Tokens, names: &Names, i: usize) -> Option<(char, String)> {
    let (at, len) = name_entry(image, names.start + names.starts[i] as usize)?;
    let mut text = Vec::new();
    for &t in image.get(at..at + len)? {
        text.extend_from_slice(tokens.tokens[usize::from(t)]);
    }
    let (&kind, name) = text.split_first()?;
    Some((char::from(kind), String::from_utf8_lossy(name).into_owned()))
}

/// How `kallsyms_offsets` encode addresses.
#[derive(Clone, Copy)]
enum Encoding {
    /// `CONFIG_KALLSYMS_ABSOLUTE_PERCPU`: non-negative offsets are
    /// absolute (per-CPU data), negative ones count down from
    /// `relative_base - 1`.
    AbsolutePercpu,
    /// Unsigned offsets from `relative_base`.
    Relative,
}

fn address(encoding: Encoding, base: u64, offset: i32) -> u64 {
    match encoding {
        Encoding::AbsolutePercpu if offset >= 0 => offset as u64,
        Encoding::AbsolutePercpu => base.wrapping_sub(1).wrapping_sub(i64::from(offset) as u64),
        Encoding::Relative => base.wrapping_add(u64::from(offset as u32)),
    }
}

/// Addresses of every symbol, from whichever layout and encoding gives
/// sorted code addresses in the kernel half of the address space.
fn addresses(image: &[u8], tokens: &Tokens, names: &Names, kinds: &[char]) -> Option<Vec<u64>> {
    let n = names.count;
    let table = align_up(4 * n);
    // (offsets, relative_base) positions: before num_syms, or after the
    // token index.
    let mut layouts = Vec::new();
    if let Some(base) = names.start.checked_sub(2 * ALIGN) {
        if let Some(offsets) = base.checked_sub(table) {
            layouts.push((offsets, base));
        }
    }
    let after = align_up(tokens.index_end);
    layouts.push((after, after + table));
    for (offsets, base_at) in layouts {
        let Some(base) = u64_at(image, base_at) else {
            continue;
        };
        if base < 0xffff_8000_0000_0000 {
            continue;
        }
        let Some(raw) = image.get(offsets..offsets + 4 * n) else {
            continue;
        };
        let raw: Vec<i32> = raw
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        for encoding in [Encoding::AbsolutePercpu, Encoding::Relative] {
            let all: Vec<u64> = raw.iter().map(|o| address(encoding, base, *o)).collect();
            let mut code = all
                .iter()
                .zip(kinds)
                .filter(|(_, k)| matches!(k, 't' | 'T'))
                .map(|(a, _)| *a);
            let Some(first) = code.next() else {
                continue;
            };
            let mut last = first;
            let sorted = first >= base
                && code.all(|a| {
                    let ok = a >= last;
                    last = a;
                    ok
                });
            if sorted {
                return Some(all);
            }
        }
    }
    None
}

/// Every symbol of the kernel image `image` as (`nm` type, name, address):
/// data and per-CPU symbols too (per-CPU ones are offsets from the CPU's
/// per-CPU base where the kernel links them that way).
pub fn all_symbols(image: &[u8], origin: &str) -> Result<Vec<(char, String, u64)>, SymbolError> {
    let none = || SymbolError::NoSymbols(origin.to_string());
    let tokens = find_tokens(image).ok_or_else(none)?;
    let names = find_names(image, &tokens).ok_or_else(none)?;
    let expanded: Vec<(char, String)> = (0..names.count)
        .map(|i| expand(image, &tokens, &names, i))
        .collect::<Option<_>>()
        .ok_or_else(none)?;
    let kinds: Vec<char> = expanded.iter().map(|(k, _)| *k).collect();
    let addresses = addresses(image, &tokens, &names, &kinds).ok_or_else(none)?;
    Ok(expanded
        .into_iter()
        .zip(addresses)
        .map(|((kind, name), addr)| (kind, name, addr))
        .collect())
}

/// Recovers the code symbols of the kernel image `image` (a vmlinux ELF,
/// stripped or not, or any dump holding its `.rodata`).
pub fn recover(image: &[u8], origin: &str) -> Result<SymbolTable, SymbolError> {
    let all = all_symbols(image, origin)?;
    let kinds: Vec<String> = all.iter().map(|(k, _, _)| k.to_string()).collect();
    code_table(
        all.into_iter()
            .zip(&kinds)
            .map(|((_, name, addr), kind)| (addr, kind.as_str(), name)),
        origin,
    )
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    const BASE: u64 = 0xffff_ffff_8100_0000;

    /// Token `i` is byte `i` for printable ASCII, token 1 is "start_",
    /// the rest are filler that names never use.
    fn token(i: u8) -> Vec<u8> {
        match i {
            1 => b"start_".to_vec(),
            0x20..=0x7e => vec![i],
            _ => format!("<{i}>").into_bytes(),
        }
    }

    fn encode(kind: char, name: &str) -> Vec<u8> {
        let mut t = vec![kind as u8];
        match name.strip_prefix("start_") {
            Some(rest) => {
                t.push(1);
                t.extend(rest.bytes());
            }
            None => t.extend(name.bytes()),
        }
        let mut out = vec![t.len() as u8];
        out.extend(t);
        out
    }

    fn pad(b: &mut Vec<u8>) {
        while !b.len().is_multiple_of(ALIGN) {
            b.push(0);
        }
    }

    /// Symbols in address order: one per-CPU variable, then code.
    fn symbols() -> Vec<(u64, char, String)> {
        let mut s = vec![(0x1000, 'D', "fixed_percpu_data".to_string())];
        s.push((BASE, 'T', "startup_64".into()));
        for i in 1..300u64 {
            let kind = if i % 3 == 0 { 't' } else { 'T' };
            s.push((BASE + 0x40 * i, kind, format!("fn_{i}")));
        }
        s.push((BASE + 0x40 * 300, 'T', "start_kernel".into()));
        s
    }

    /// A kernel image with the tables laid out as `scripts/kallsyms.c`
    /// writes them: offsets first (`offsets_first`, up to 6.x) or after
    /// the token index, with `seqs_of_names` between markers and tokens as
    /// 6.2 and later have it.
    fn image(offsets_first: bool, encoding: Encoding) -> Vec<u8> {
        let syms = symbols();
        let offsets: Vec<u8> = syms
            .iter()
            .flat_map(|(addr, _, _)| {
                let o: i32 = match encoding {
                    Encoding::AbsolutePercpu if *addr < BASE => *addr as i32,
                    Encoding::AbsolutePercpu => -((addr - BASE) as i32) - 1,
                    Encoding::Relative => addr.wrapping_sub(BASE) as u32 as i32,
                };
                o.to_le_bytes()
            })
            .collect();
        let mut b = vec![0xaa; 64];
        let offsets_and_base = |b: &mut Vec<u8>| {
            b.extend(&offsets);
            pad(b);
            b.extend(BASE.to_le_bytes());
        };
        if offsets_first {
            offsets_and_base(&mut b);
        }
        b.extend((syms.len() as u32).to_le_bytes());
        pad(&mut b);
        let names_at = b.len();
        let mut markers = Vec::new();
        for (i, (_, kind, name)) in syms.iter().enumerate() {
            if i % 256 == 0 {
                markers.push((b.len() - names_at) as u32);
            }
            b.extend(encode(*kind, name));
        }
        pad(&mut b);
        for m in markers {
            b.extend(m.to_le_bytes());
        }
        pad(&mut b);
        b.extend(std::iter::repeat_n(7u8, 3 * syms.len()));
        pad(&mut b);
        let mut index = Vec::new();
        let token_table = b.len();
        for i in 0..=255u8 {
            index.push((b.len() - token_table) as u16);
            b.extend(token(i));
            b.push(0);
        }
        pad(&mut b);
        for i in index {
            b.extend(i.to_le_bytes());
        }
        pad(&mut b);
        if !offsets_first {
            offsets_and_base(&mut b);
        }
        b.extend([0x55; 64]);
        b
    }

    fn check(table: &SymbolTable) {
        let find = |addr: u64| table.lookup(addr).map(|i| table.symbols()[i].name.as_str());
        assert_eq!(find(BASE), Some("startup_64"));
        assert_eq!(find(BASE + 0x40 * 7 + 5), Some("fn_7"));
        assert_eq!(find(BASE + 0x40 * 299), Some("fn_299"));
        assert_eq!(find(BASE + 0x40 * 300 + 1), Some("start_kernel"));
        assert_eq!(find(0x1000), None, "data is not code");
        assert_eq!(table.symbols().len(), 301);
    }

    #[test]
    fn finds_the_tables_in_either_layout_and_encoding() {
        for offsets_first in [true, false] {
            for encoding in [Encoding::AbsolutePercpu, Encoding::Relative] {
                let image = image(offsets_first, encoding);
                let table = recover(&image, "test image").unwrap_or_else(|e| {
                    panic!("offsets first {offsets_first}: {e}");
                });
                check(&table);
            }
        }
    }

    #[test]
    fn damage_gives_no_symbols_never_a_panic() {
        let good = image(true, Encoding::AbsolutePercpu);
        assert!(recover(&[0u8; 4096], "zeros").is_err());
        for cut in (0..good.len()).step_by(97) {
            let _ = recover(&good[..cut], "cut");
        }
        for at in (0..good.len()).step_by(61) {
            let mut bad = good.clone();
            bad[at] ^= 0xff;
            if let Ok(table) = recover(&bad, "flipped") {
                // A flipped byte in padding or filler changes nothing; a
                // flipped offset moves one symbol: never a table of junk.
                assert!(table.symbols().len() >= 300, "byte {at}");
            }
        }
    }
}
