//! Symbol sources as `--symbols` and the trace's kernel give them: ELF
//! (symbols and DWARF lines), System.map, nm output, kallsyms, and a
//! bzImage's vmlinux; and what `run --probe` and `run --sample` read of a
//! kernel: its stapsdt notes, its variables' places, typed probes' plans
//! from DWARF, its tracepoints, and its ORC tables as gdb's symbol file
//! (with kallsyms found in the input, or a crafted symbol list over it).
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
    // A typed probe planned from the image's DWARF.
    if let Some(dwarf) = vtrace_image::probe_dwarf::DwarfTypes::from_elf(data) {
        if let Ok((routine, specs)) =
            vtrace_image::probe_fetch::parse_probe("main(argv->x->y, arg2:string, c)")
        {
            let _ = dwarf.plan(routine, &specs);
        }
    }
    // The ORC unwind tables, and the symbol file gdb gets from them.
    let _ = vtrace_image::orc::orc_table(data);
    let _ = vtrace_image::gdb_symbols::gdb_symbol_file(data, "fuzz");
    let kallsyms = vtrace_image::symbols::all_kallsyms(data, "fuzz").unwrap_or_default();
    let btf = vtrace_image::probe_fetch::read_btf(data);
    let _ = vtrace_image::tracepoints::tracepoints(data, &kallsyms, btf.as_ref());
    // Symbols that put the jump table and a tracepoint in the input.
    let crafted = [
        ('D', "__start___jump_table".to_string(), 0x40_0000),
        ('D', "__stop___jump_table".to_string(), 0x40_1000),
        ('D', "__tracepoint_x".to_string(), 0x40_0100),
        ('T', "__SCT__tp_func_x".to_string(), 0x40_0200),
    ];
    for tp in vtrace_image::tracepoints::tracepoints(data, &crafted, btf.as_ref()) {
        let _ = vtrace_image::tracepoints::format_detail(&tp);
    }
    if let Some(vmlinux) = vtrace_image::bzimage::vmlinux_inside(data) {
        let _ = Symbolizer::new().add_bytes(&vmlinux, "fuzz vmlinux", Scope::Any);
    }
});
