//! Symbol sources as `--symbols` and the trace's kernel give them: ELF
//! (symbols and DWARF lines), System.map, nm output, kallsyms, and a
//! bzImage's vmlinux.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vtrace_analyzer::symbols::{Scope, Symbolizer};

fuzz_target!(|data: &[u8]| {
    let mut symbols = Symbolizer::new();
    if symbols.add_bytes(data, "fuzz", Scope::Any).is_ok() {
        symbols.add_physical_alias(data);
    }
    let _ = symbols.addresses_of("start_kernel");
    if let Some(vmlinux) = vtrace_vmm::boot::vmlinux_inside(data) {
        let _ = Symbolizer::new().add_bytes(&vmlinux, "fuzz vmlinux", Scope::Any);
    }
});
