//! Finding the symbols of the kernel a trace recorded, without being told.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use vtrace_storage::{image_id, TraceMetadata, BUILTIN_DEMO};

use super::{Scope, SymbolError, Symbolizer};

/// What [`discover`] loaded and what it could not.
#[derive(Debug, Default)]
pub struct Discovery {
    /// What was loaded, one line each ("vmlinux (12345 routines)").
    pub loaded: Vec<String>,
    /// Things a user should know: a kernel that changed since the run.
    pub warnings: Vec<String>,
    /// Where nothing was found: what each place said, then that no symbols
    /// were found. Empty when some were; a caller given symbols for the
    /// kernel some other way need not say it.
    pub not_found: Vec<String>,
}

impl Discovery {
    /// Everything to tell a user who gave no symbols of their own.
    pub fn all_warnings(&self) -> impl Iterator<Item = &String> {
        self.warnings.iter().chain(&self.not_found)
    }
}

/// What the caller knows about kernel images that this crate does not.
pub struct KernelImages<'a> {
    /// The `kernel` values of built-in guests and their ELF bytes (the CLI
    /// passes the demo OS it embeds).
    pub builtin: &'a [(&'a str, &'a [u8])],
}

impl<'a> std::fmt::Debug for KernelImages<'a> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelImages").finish_non_exhaustive()
    }
}

/// Files that may hold the symbols of a kernel image at `kernel`, best
/// first: the image itself when it is an ELF, a debug vmlinux from the
/// distribution's debug package, then System.map files beside it (the
/// Debian and Fedora layout: /boot/vmlinuz-V with /boot/System.map-V).
/// The kernel's own kallsyms table comes after all of them: it has no
/// sizes and no line numbers.
fn candidates(kernel: &Path) -> Vec<PathBuf> {
    let mut out = vec![kernel.to_path_buf()];
    let dir = kernel.parent().unwrap_or(Path::new("."));
    let name = kernel
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(version) = name
        .strip_prefix("vmlinuz-")
        .or_else(|| name.strip_prefix("vmlinux-"))
    {
        out.push(PathBuf::from(format!(
            "/usr/lib/debug/boot/vmlinux-{version}"
        )));
        out.push(PathBuf::from(format!(
            "/usr/lib/debug/lib/modules/{version}/vmlinux"
        )));
        out.push(dir.join(format!("System.map-{version}")));
    }
    out.push(dir.join("System.map"));
    out
}

/// Loads the symbols of the kernel `metadata` names into `symbols`.
pub fn discover(
    metadata: &TraceMetadata,
    images: &KernelImages,
    symbols: &mut Symbolizer,
) -> Discovery {
    let mut d = Discovery::default();
    let Some(kernel) = metadata.kernel.as_deref() else {
        d.not_found.push(
            "the trace does not say which kernel ran (it predates that record); \
             give its symbols with --symbols FILE"
                .into(),
        );
        return d;
    };
    if let Some((_, bytes)) = images.builtin.iter().find(|(k, _)| *k == kernel) {
        builtin(metadata, kernel, bytes, symbols, &mut d);
        return d;
    }
    let kernel = Path::new(kernel);
    // Read once: it is checked against the trace and may hold the symbols.
    let image = match super::read_symbol_file(kernel) {
        Ok(bytes) => Some(bytes),
        Err(e @ (SymbolError::NotAFile { .. } | SymbolError::TooLarge { .. })) => {
            d.warnings.push(format!("the trace names {e}; not read"));
            None
        }
        Err(_) => None,
    };
    if let (Some(id), Some(bytes)) = (&metadata.kernel_id, &image) {
        if *id != image_id(bytes) {
            d.warnings.push(format!(
                "{} changed since it was traced: symbols found for it may be wrong",
                kernel.display()
            ));
        }
    }
    // Said only if nothing is found in the end: Debian's System.map is a
    // stub, which is no news when the kernel's own table does the job.
    let mut problems = Vec::new();
    let found = from_files(kernel, image.as_deref(), symbols, &mut problems)
        .or_else(|| from_kallsyms(kernel, image.as_deref()?, symbols, &mut problems));
    match found {
        Some(origin) => d.loaded.push(origin),
        None => {
            d.not_found.extend(problems);
            d.not_found.push(format!(
                "no symbols found for {} (looked for an ELF image, a debug vmlinux, \
                 System.map beside it and the kernel's own kallsyms table): give them \
                 with --symbols FILE",
                kernel.display()
            ));
        }
    }
    d
}

/// The symbols of a kernel built into vtrace (the demo OS), with a warning
/// where the trace ran another build of it.
fn builtin(
    metadata: &TraceMetadata,
    kernel: &str,
    bytes: &[u8],
    symbols: &mut Symbolizer,
    d: &mut Discovery,
) {
    if metadata
        .kernel_id
        .as_deref()
        .is_some_and(|id| id != image_id(bytes))
    {
        d.warnings.push(format!(
            "this trace ran a different build of the {} than this vtrace embeds \
             (vtrace {} wrote it): symbols may be wrong",
            if kernel.starts_with(BUILTIN_DEMO) {
                "demo OS"
            } else {
                kernel
            },
            metadata
                .vtrace_version
                .as_deref()
                .unwrap_or("of unknown version"),
        ));
    }
    match symbols.add_elf(bytes, "built-in demo OS", Scope::Any) {
        Ok(()) => d
            .loaded
            .push("built-in demo OS (ELF symbols and DWARF lines)".into()),
        Err(e) => d.warnings.push(e.to_string()),
    }
}

/// Symbols from a file: the kernel image itself where it is an ELF with
/// symbols, a debug vmlinux, a System.map. Where they came from, if found.
fn from_files(
    kernel: &Path,
    image: Option<&[u8]>,
    symbols: &mut Symbolizer,
    problems: &mut Vec<String>,
) -> Option<String> {
    let elf = image.filter(|b| b.starts_with(b"\x7fELF"));
    for path in candidates(kernel) {
        let origin = path.display().to_string();
        let result = if path == kernel {
            // The image itself counts only as an ELF with symbols: a
            // bzImage or a stripped vmlinux sends us on to the others.
            match elf {
                Some(bytes) => match symbols.add_elf(bytes, &origin, Scope::Any) {
                    Err(SymbolError::NoSymbols(_)) => continue,
                    other => other,
                },
                None => continue,
            }
        } else if path.is_file() {
            symbols.add_file(&path, Scope::Any)
        } else {
            continue;
        };
        match result {
            Ok(()) => {
                if let Some(elf) = elf {
                    symbols.add_physical_alias(elf);
                }
                return Some(origin);
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    None
}

/// Symbols from the kernel's own kallsyms table, in the ELF image or the
/// vmlinux inside a bzImage. Where they came from, if found.
fn from_kallsyms(
    kernel: &Path,
    image: &[u8],
    symbols: &mut Symbolizer,
    problems: &mut Vec<String>,
) -> Option<String> {
    let vmlinux = if image.starts_with(b"\x7fELF") {
        Cow::Borrowed(image)
    } else {
        Cow::Owned(crate::bzimage::vmlinux_inside(image)?)
    };
    let origin = format!("{} (the kernel's own kallsyms table)", kernel.display());
    match symbols.add_kallsyms(&vmlinux, &origin, Scope::Any) {
        Ok(()) => {
            symbols.add_physical_alias(&vmlinux);
            Some(origin)
        }
        Err(e) => {
            problems.push(e.to_string());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_images() -> KernelImages<'static> {
        KernelImages { builtin: &[] }
    }

    #[test]
    fn finds_system_map_beside_a_bzimage() {
        let dir = std::env::temp_dir().join(format!("vtrace-discover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kernel = dir.join("vmlinuz-9.9-test");
        std::fs::write(&kernel, b"MZ not an elf").unwrap();
        std::fs::write(
            dir.join("System.map-9.9-test"),
            "ffffffff81000000 T _stext\n",
        )
        .unwrap();
        let meta = TraceMetadata {
            kernel: Some(kernel.display().to_string()),
            kernel_id: Some(image_id(b"MZ not an elf")),
            ..Default::default()
        };
        let mut s = Symbolizer::new();
        let d = discover(&meta, &no_images(), &mut s);
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        assert_eq!(s.format(0xffffffff81000004, 0), "_stext+0x4");
        std::fs::write(&kernel, b"MZ rebuilt").unwrap();
        let d = discover(&meta, &no_images(), &mut Symbolizer::new());
        assert!(d.warnings[0].contains("changed since"), "{:?}", d.warnings);
        assert!(d.not_found.is_empty(), "{:?}", d.not_found);
        // Gone: nothing found is said apart from the warnings.
        std::fs::remove_dir_all(&dir).unwrap();
        let d = discover(&meta, &no_images(), &mut Symbolizer::new());
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        assert!(
            d.not_found.last().unwrap().starts_with("no symbols found"),
            "{:?}",
            d.not_found
        );
    }

    #[test]
    fn the_demo_os_comes_from_the_builtin_list() {
        let meta = TraceMetadata {
            kernel: Some(BUILTIN_DEMO.into()),
            kernel_id: Some(image_id(vtrace_demo::DEMO_OS_ELF)),
            ..Default::default()
        };
        let mut s = Symbolizer::new();
        let images = KernelImages {
            builtin: &[(BUILTIN_DEMO, vtrace_demo::DEMO_OS_ELF)],
        };
        let d = discover(&meta, &images, &mut s);
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        assert!(s.func_count() > 50);
    }
}
