//! A typed `fn:` probe's values, read at the routine's entry: the
//! argument registers, the pointers the probe follows and the text it
//! reads, each read bounded and only from pages that are present. What is
//! not there is recorded as unavailable, never guessed.

use vtrace_image::probe_fetch::{ArgSource, Fetch, FetchKind, MAX_TEXT};
use vtrace_storage::{ProbeField, ProbeValue, Regs};

/// Reads guest memory at a linear address into the buffer, up to the
/// first page that is not present; says how many bytes it read.
pub(crate) type ReadMemory<'a> = dyn FnMut(u64, &mut [u8]) -> usize + 'a;

/// The values of `fetches` with the vCPU's registers `regs`.
pub(crate) fn fetch_values(
    fetches: &[Fetch],
    regs: &Regs,
    read: &mut ReadMemory<'_>,
) -> Vec<ProbeField> {
    fetches
        .iter()
        .map(|f| ProbeField {
            name: f.label.clone(),
            value: fetch(f, regs, read),
        })
        .collect()
}

/// The argument's value from where `source` says it is, or the address
/// that could not be read.
fn argument(source: ArgSource, regs: &Regs, read: &mut ReadMemory<'_>) -> Result<u64, u64> {
    let register = |r: usize| regs.gpr.get(r).copied().unwrap_or(0);
    Ok(match source {
        ArgSource::Register { register: r, size } => register(r) & mask(size),
        ArgSource::Memory {
            base,
            disp,
            size,
            signed,
        } => {
            let addr = base.map_or(0, register).wrapping_add(disp);
            let v = read_u64(addr, size, read).ok_or(addr)?;
            match (signed, size) {
                (true, 1..=7) => {
                    let shift = 64 - 8 * u32::from(size);
                    (((v << shift) as i64) >> shift) as u64
                }
                _ => v,
            }
        }
        ArgSource::Address { register: r, disp } => register(r).wrapping_add(disp),
        ArgSource::Constant(c) => c,
    })
}

fn fetch(f: &Fetch, regs: &Regs, read: &mut ReadMemory<'_>) -> ProbeValue {
    let mut value = match argument(f.source, regs, read) {
        Ok(v) => v,
        Err(addr) => return ProbeValue::Unavailable { addr },
    };
    for offset in &f.loads {
        let addr = value.wrapping_add(*offset);
        match read_u64(addr, 8, read) {
            Some(v) => value = v,
            None => return ProbeValue::Unavailable { addr },
        }
    }
    // Where the value is: in memory at `addr` (a field), or `value`
    // itself (an argument).
    let at = f.field.map(|offset| value.wrapping_add(offset));
    match (f.kind, at) {
        (FetchKind::Int { size, signed }, None) => ProbeValue::Int {
            value: value & mask(size),
            size,
            signed,
        },
        (FetchKind::Int { size, signed }, Some(addr)) => match read_u64(addr, size, read) {
            Some(value) => ProbeValue::Int {
                value,
                size,
                signed,
            },
            None => ProbeValue::Unavailable { addr },
        },
        (FetchKind::Pointer, None) => ProbeValue::Pointer(value),
        (FetchKind::Pointer, Some(addr)) => match read_u64(addr, 8, read) {
            Some(p) => ProbeValue::Pointer(p),
            None => ProbeValue::Unavailable { addr },
        },
        (FetchKind::TextAt, None) => read_text(value, MAX_TEXT, read),
        (FetchKind::TextAt, Some(addr)) => match read_u64(addr, 8, read) {
            Some(p) => read_text(p, MAX_TEXT, read),
            None => ProbeValue::Unavailable { addr },
        },
        (FetchKind::TextInPlace { max }, at) => read_text(at.unwrap_or(value), max, read),
    }
}

/// The low `size` bytes.
fn mask(size: u8) -> u64 {
    match size {
        1..=7 => (1u64 << (8 * u32::from(size))) - 1,
        _ => u64::MAX,
    }
}

/// A little-endian integer of `size` bytes (at most 8) at `addr`, where
/// all of it is present.
pub(crate) fn read_u64(addr: u64, size: u8, read: &mut ReadMemory<'_>) -> Option<u64> {
    let mut bytes = [0u8; 8];
    let n = usize::from(size.min(8));
    (read(addr, &mut bytes[..n]) == n).then(|| u64::from_le_bytes(bytes))
}

/// Text at `addr` up to its NUL, at most `max` bytes (and
/// [`MAX_TEXT`]).
fn read_text(addr: u64, max: usize, read: &mut ReadMemory<'_>) -> ProbeValue {
    let mut buf = vec![0u8; max.min(MAX_TEXT)];
    let n = read(addr, &mut buf);
    if n == 0 && !buf.is_empty() {
        return ProbeValue::Unavailable { addr };
    }
    buf.truncate(n);
    match buf.iter().position(|&b| b == 0) {
        Some(end) => {
            buf.truncate(end);
            ProbeValue::Text {
                bytes: buf,
                complete: true,
            }
        }
        None => ProbeValue::Text {
            bytes: buf,
            complete: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guest memory: one present page at 0x1000.
    fn memory() -> Vec<u8> {
        let mut page = vec![0u8; 0x1000];
        // A structure at 0x1100: a pointer at +8 to the text at 0x1200, an
        // int -100 at +16, and a pointer at +24 to another at 0x1300.
        page[0x108..0x110].copy_from_slice(&0x1200u64.to_le_bytes());
        page[0x110..0x114].copy_from_slice(&(-100i32).to_le_bytes());
        page[0x118..0x120].copy_from_slice(&0x1300u64.to_le_bytes());
        page[0x200..0x20c].copy_from_slice(b"/dev/console");
        page[0x320..0x324].copy_from_slice(&7u32.to_le_bytes());
        // Text running to the end of the page, with no NUL.
        page[0xff0..].fill(b'x');
        page
    }

    fn read_from(page: &[u8]) -> impl FnMut(u64, &mut [u8]) -> usize + '_ {
        move |addr, buf| {
            let Some(start) = addr.checked_sub(0x1000).filter(|s| *s < 0x1000) else {
                return 0;
            };
            let start = start as usize;
            let n = buf.len().min(page.len() - start);
            buf[..n].copy_from_slice(&page[start..start + n]);
            n
        }
    }

    fn fetch_of(label: &str, loads: &[u64], field: Option<u64>, kind: FetchKind) -> Fetch {
        Fetch {
            label: label.into(),
            source: ArgSource::register(7),
            loads: loads.to_vec(),
            field,
            kind,
        }
    }

    #[test]
    fn fetches_follow_pointers_read_text_and_say_what_is_missing() {
        let page = memory();
        let mut regs = Regs::default();
        regs.gpr[7] = 0x1100;
        let int = FetchKind::Int {
            size: 4,
            signed: true,
        };
        let fetches = [
            fetch_of("p", &[], None, FetchKind::Pointer),
            fetch_of("p->name", &[], Some(8), FetchKind::TextAt),
            fetch_of("p->n", &[], Some(16), int),
            fetch_of("p->next->count", &[24], Some(0x20), int),
            fetch_of("p->bad->count", &[0x800], Some(0), int),
            fetch_of(
                "p:u8",
                &[],
                None,
                FetchKind::Int {
                    size: 1,
                    signed: false,
                },
            ),
            fetch_of("tail", &[], Some(0xef0), FetchKind::TextInPlace { max: 64 }),
        ];
        let values = fetch_values(&fetches, &regs, &mut read_from(&page));
        let v: Vec<&ProbeValue> = values.iter().map(|f| &f.value).collect();
        assert_eq!(v[0], &ProbeValue::Pointer(0x1100));
        assert_eq!(
            v[1],
            &ProbeValue::Text {
                bytes: b"/dev/console".to_vec(),
                complete: true
            }
        );
        assert_eq!(
            v[2],
            &ProbeValue::Int {
                value: 0xffff_ff9c,
                size: 4,
                signed: true
            }
        );
        assert_eq!(
            v[3],
            &ProbeValue::Int {
                value: 7,
                size: 4,
                signed: true
            }
        );
        // The pointer at 0x1900 is 0: its target is not in memory.
        assert_eq!(v[4], &ProbeValue::Unavailable { addr: 0 });
        assert_eq!(
            v[5],
            &ProbeValue::Int {
                value: 0,
                size: 1,
                signed: false
            }
        );
        // Cut where the page ends, not invented beyond it.
        assert_eq!(
            v[6],
            &ProbeValue::Text {
                bytes: vec![b'x'; 16],
                complete: false
            }
        );
        assert_eq!(values[3].name, "p->next->count");
    }

    /// A tracepoint site's arguments: a register's low bytes, a stack slot
    /// (`mov esi, [rbp-0x44]`), a sign-extended one, an address, a constant.
    #[test]
    fn arguments_come_from_where_the_site_keeps_them() {
        let mut page = memory();
        page[0x3bc..0x3c0].copy_from_slice(&(-3i32).to_le_bytes());
        let mut regs = Regs::default();
        regs.gpr[5] = 0x1400; // rbp
        regs.gpr[12] = 0xdead_0000_0000_0007;
        let int = |size, signed| FetchKind::Int { size, signed };
        let at = |source, kind| Fetch {
            label: "a".into(),
            source,
            loads: Vec::new(),
            field: None,
            kind,
        };
        let slot = |signed| ArgSource::Memory {
            base: Some(5),
            disp: (-0x44i64) as u64,
            size: 4,
            signed,
        };
        let fetches = [
            at(
                ArgSource::Register {
                    register: 12,
                    size: 4,
                },
                int(8, false),
            ),
            at(slot(false), int(8, false)),
            at(slot(true), int(8, true)),
            at(
                ArgSource::Address {
                    register: 5,
                    disp: (-0x44i64) as u64,
                },
                FetchKind::Pointer,
            ),
            at(ArgSource::Constant(9), int(4, false)),
            at(
                ArgSource::Memory {
                    base: None,
                    disp: 0x9000,
                    size: 8,
                    signed: false,
                },
                int(8, false),
            ),
        ];
        let values = fetch_values(&fetches, &regs, &mut read_from(&page));
        let v: Vec<&ProbeValue> = values.iter().map(|f| &f.value).collect();
        let int_of = |value, size, signed| ProbeValue::Int {
            value,
            size,
            signed,
        };
        assert_eq!(v[0], &int_of(7, 8, false), "the register's low half");
        assert_eq!(v[1], &int_of(0xffff_fffd, 8, false));
        assert_eq!(v[2], &int_of(u64::MAX - 2, 8, true));
        assert_eq!(v[3], &ProbeValue::Pointer(0x13bc));
        assert_eq!(v[4], &int_of(9, 4, false));
        assert_eq!(v[5], &ProbeValue::Unavailable { addr: 0x9000 });
    }
}
