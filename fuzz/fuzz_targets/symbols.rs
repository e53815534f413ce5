//! Symbol sources as `--symbols` and the trace's kernel give them: ELF
//! (symbols and DWARF lines), System.map, nm output, kallsyms, and a
//! bzImage's vmlinux; and what `run --probe` and `run --sample` read of a
//! kernel: its stapsdt notes and its variables' places.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vtrace_image::symbols::{Scope, Symbolizer};

fuzz_target!(|data: &[u8]| {
    let mut symbols = Symbolizer::new();
    if symbols.add_bytes(data, "fuzz", Scope::Any).is_ok() {
        symbols.add_physical_alias(data);
    }
    let _ = symbols.addresses_of("start_kernel");
    let _ = vtrace_image::sdt::probe_sites(data);
    let _ = vtrace_image::symbols::find_variable(data, "jiffies");
    let _ = vtrace_image::symbols::physical_of(data, 0xffff_ffff_8100_0000);
    if let Some(vmlinux) = vtrace_image::bzimage::vmlinux_inside(data) {
        let _ = Symbolizer::new().add_bytes(&vmlinux, "fuzz vmlinux", Scope::Any);
    }
});
