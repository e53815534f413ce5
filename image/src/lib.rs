//! `vtrace-image`: what vtrace reads from a guest's images, for both sides
//! of a trace. `vtrace run` needs it to boot a bzImage, to resolve
//! `--start-at` and the other places to names, to find static probes and
//! sampled variables and to follow Linux tasks; `vtrace analyze` needs it to
//! name what the trace recorded. Neither side needs the other for it: the
//! VMM and the analyzer both depend on this crate, not on each other.
//!
//! - [`bzimage`] and [`decompress`]: Linux bzImages, the vmlinux inside,
//!   and every compression a kernel or an initramfs may use.
//! - [`symbols`]: routines, variables and lines from ELF and DWARF,
//!   System.map and the kernel's own kallsyms, found from a trace's
//!   metadata.
//! - [`sdt`]: static probe sites (`stapsdt` notes).
//! - [`linux_tasks`]: where a Linux kernel keeps its running task (BTF).
//! - [`probe_fetch`]: typed `fn:` probe arguments, planned from BTF.
//! - [`tracepoints`]: the kernel's own tracepoints, their sites and
//!   arguments.
//! - [`initramfs`] and [`user_routine`]: programs in an initramfs, and
//!   places inside them.
//! - [`orc`] and [`gdb_symbols`]: the kernel's unwind tables, and a symbol
//!   file that lets gdb name and unwind a kernel that has no DWARF.

// Every number in a kernel image, symbol file or initramfs is the file's
// to choose: a cast that could cut one short must be a checked conversion.
#![warn(clippy::cast_possible_truncation)]

pub mod bzimage;
pub mod decompress;
pub mod gdb_symbols;
pub mod initramfs;
pub mod linux_tasks;
pub mod orc;
pub mod probe_dwarf;
pub mod probe_fetch;
pub mod sdt;
pub mod symbols;
pub mod tracepoints;
pub mod user_routine;
