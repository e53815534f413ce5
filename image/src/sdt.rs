//! Static probes (SDT) compiled into a guest kernel: the sites its
//! `stapsdt` ELF notes describe (`guest-kit/include/vtrace-sdt.h` writes
//! them in systemtap's format, so `readelf -n` shows the same).
//!
//! A note's description, after the ELF note header (owner `stapsdt`,
//! type 3):
//!
//! | bytes | meaning |
//! |---|---|
//! | 8 | location: the probe's instruction (vtrace's: the hypercall's `IN`) |
//! | 8 | base: the address of `.stapsdt.base` at link time (prelink) |
//! | 8 | semaphore: a 16-bit counter the tracer sets, or 0 |
//! | NUL-terminated | provider |
//! | NUL-terminated | name |
//! | NUL-terminated | arguments, systemtap's notation (`-8@%rbx -8@%rcx`) |

use object::read::elf::{ElfFile64, FileHeader, SectionHeader};
use object::Endianness;
use serde::Serialize;

/// The ELF note type of a systemtap probe descriptor.
const NT_STAPSDT: u32 = 3;

/// Why an image's probes cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SdtError {
    /// Not a 64-bit ELF file.
    #[error("not a 64-bit ELF file ({0})")]
    NotElf(String),
    /// A note section or note is cut short or malformed.
    #[error("a stapsdt note is malformed: {0}")]
    BadNote(String),
}

impl SdtError {
    /// The status a command that fails with this error exits with: the
    /// image is not what it should be (sysexits.h's `EX_DATAERR`).
    pub fn exit_status(&self) -> i32 {
        match self {
            SdtError::NotElf(_) | SdtError::BadNote(_) => exitcode::DATAERR,
        }
    }
}

/// One probe site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProbeSite {
    /// The provider (`sched`).
    pub provider: String,
    /// The probe's name within its provider (`switch`).
    pub name: String,
    /// The linear address of the site's instruction.
    pub pc: u64,
    /// The linear address of its semaphore, if it has one.
    pub semaphore: Option<u64>,
    /// The semaphore's guest-physical address, from the loadable segment
    /// that holds it (where the kernel is loaded as its ELF says).
    pub semaphore_physical: Option<u64>,
    /// The arguments in systemtap's notation (`-8@%rbx`), one per
    /// argument.
    pub arguments: Vec<String>,
}

impl ProbeSite {
    /// `provider:name`, as `--probe` and the trace name it.
    pub fn probe(&self) -> String {
        format!("{}:{}", self.provider, self.name)
    }
}

/// The probe sites the image's `stapsdt` notes describe, in note order
/// (none where it has no such notes).
pub fn probe_sites(elf: &[u8]) -> Result<Vec<ProbeSite>, SdtError> {
    let file = ElfFile64::<Endianness>::parse(elf).map_err(|e| SdtError::NotElf(e.to_string()))?;
    let endian = file.endian();
    let header = file.elf_header();
    let sections = header
        .sections(endian, elf)
        .map_err(|e| SdtError::NotElf(e.to_string()))?;
    let loads = crate::symbols::load_segments(elf);
    let mut sites = Vec::new();
    for section in sections.iter() {
        let Some(mut notes) = section
            .notes(endian, elf)
            .map_err(|e| SdtError::BadNote(e.to_string()))?
        else {
            continue;
        };
        while let Some(note) = notes.next().map_err(|e| SdtError::BadNote(e.to_string()))? {
            if note.name() != b"stapsdt" || note.n_type(endian) != NT_STAPSDT {
                continue;
            }
            let mut site = parse_description(note.desc())?;
            site.semaphore_physical = site.semaphore.and_then(|s| physical(&loads, s));
            sites.push(site);
        }
    }
    Ok(sites)
}

/// Where a linear address of the image lies in guest-physical memory.
fn physical(loads: &[(u64, u64, u64)], addr: u64) -> Option<u64> {
    loads
        .iter()
        .find(|(start, end, _)| (*start..*end).contains(&addr))
        .and_then(|(start, _, phys)| phys.checked_add(addr - start))
}

fn parse_description(desc: &[u8]) -> Result<ProbeSite, SdtError> {
    let word = |i: usize| -> Result<u64, SdtError> {
        let bytes = desc
            .get(i * 8..i * 8 + 8)
            .ok_or_else(|| SdtError::BadNote(format!("{} bytes of description", desc.len())))?;
        let mut b = [0u8; 8];
        b.copy_from_slice(bytes);
        Ok(u64::from_le_bytes(b))
    };
    let (pc, semaphore) = (word(0)?, word(2)?);
    let mut strings = desc[24..].split(|&b| b == 0);
    let mut text = |what: &str| -> Result<String, SdtError> {
        let s = strings
            .next()
            .ok_or_else(|| SdtError::BadNote(format!("no {what}")))?;
        String::from_utf8(s.to_vec()).map_err(|_| SdtError::BadNote(format!("{what} not UTF-8")))
    };
    let provider = text("provider")?;
    let name = text("name")?;
    let arguments = text("arguments").unwrap_or_default();
    if provider.is_empty() || name.is_empty() {
        return Err(SdtError::BadNote("an empty provider or name".into()));
    }
    Ok(ProbeSite {
        provider,
        name,
        pc,
        semaphore: (semaphore != 0).then_some(semaphore),
        semaphore_physical: None,
        arguments: arguments.split_whitespace().map(str::to_string).collect(),
    })
}

/// One probe of an image: its sites together.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProbeListing {
    /// `provider:name`.
    pub probe: String,
    /// How many arguments it passes.
    pub arguments: usize,
    /// Its sites' addresses, in hex.
    pub sites: Vec<String>,
}

/// The sites grouped by probe, sorted by name.
pub fn listing(sites: &[ProbeSite]) -> Vec<ProbeListing> {
    let mut out: Vec<ProbeListing> = Vec::new();
    for site in sites {
        let probe = site.probe();
        let address = format!("{:#x}", site.pc);
        match out.iter_mut().find(|p| p.probe == probe) {
            Some(p) => {
                p.sites.push(address);
                p.arguments = p.arguments.max(site.arguments.len());
            }
            None => out.push(ProbeListing {
                probe,
                arguments: site.arguments.len(),
                sites: vec![address],
            }),
        }
    }
    out.sort_by(|a, b| a.probe.cmp(&b.probe));
    out
}

/// The listing as a table.
pub fn format_listing(probes: &[ProbeListing]) -> String {
    use std::fmt::Write as _;
    let width = probes
        .iter()
        .map(|p| p.probe.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!("{:width$}  {:>4}  sites\n", "probe", "args");
    for p in probes {
        let _ = writeln!(
            out,
            "{:width$}  {:>4}  {}",
            p.probe,
            p.arguments,
            p.sites.join(" ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn description(pc: u64, sema: u64, strings: &[&str]) -> Vec<u8> {
        let mut d = Vec::new();
        for w in [pc, 0, sema] {
            d.extend_from_slice(&w.to_le_bytes());
        }
        for s in strings {
            d.extend_from_slice(s.as_bytes());
            d.push(0);
        }
        d
    }

    #[test]
    fn a_description_gives_site_semaphore_and_arguments() {
        let d = description(0x1000, 0x2000, &["sched", "switch", "-8@%rbx -8@%rcx"]);
        let site = parse_description(&d).unwrap();
        assert_eq!(site.probe(), "sched:switch");
        assert_eq!((site.pc, site.semaphore), (0x1000, Some(0x2000)));
        assert_eq!(site.arguments, ["-8@%rbx", "-8@%rcx"]);
        let none = parse_description(&description(0x1000, 0, &["a", "b", ""])).unwrap();
        assert_eq!((none.semaphore, none.arguments.len()), (None, 0));
    }

    #[test]
    fn a_short_or_nameless_description_is_refused() {
        assert!(parse_description(&[0; 20]).is_err());
        assert!(parse_description(&description(1, 2, &[])).is_err());
        assert!(parse_description(&description(1, 2, &["", "x", ""])).is_err());
    }

    #[test]
    fn a_semaphore_is_placed_by_its_segment() {
        let loads = [(0xffff_8000_0000_0000, 0xffff_8000_0001_0000, 0x100_0000)];
        assert_eq!(physical(&loads, 0xffff_8000_0000_0010), Some(0x100_0010));
        assert_eq!(physical(&loads, 0x10), None);
    }

    #[test]
    fn the_demo_os_has_the_probes_a_reader_wants() {
        let sites = probe_sites(vtrace_demo::DEMO_OS_ELF).unwrap();
        let names: Vec<String> = listing(&sites).into_iter().map(|p| p.probe).collect();
        assert_eq!(
            names,
            [
                "fault:page",
                "sched:switch",
                "syscall:entry",
                "syscall:exit",
                "timer:tick"
            ]
        );
        // Loaded identity-mapped: every semaphore at its own address.
        assert!(sites
            .iter()
            .all(|s| s.semaphore.is_some() && s.semaphore_physical == s.semaphore));
    }
}
