/* The vtrace demo OS: boots through PVH, schedules three tasks, exits. */
#include "kernel.h"
#include "vtrace.h"

struct hvm_start_info {
    u32 magic, version, flags, nr_modules;
    u64 modlist_paddr, cmdline_paddr, rsdp_paddr, memmap_paddr;
    u32 memmap_entries, reserved;
};

struct hvm_memmap_entry {
    u64 addr, size;
    u32 type, reserved;
};

static u64 ram_end(const struct hvm_start_info *si)
{
    u64 end = 0;
    const struct hvm_memmap_entry *m = (const void *)si->memmap_paddr;
    for (u32 i = 0; i < si->memmap_entries; i++)
        if (m[i].type == 1 && m[i].addr + m[i].size > end && m[i].addr < 0x100000000UL)
            end = m[i].addr + m[i].size;
    return end;
}

void kmain(const struct hvm_start_info *si)
{
    serial_init();
    kprintf("vtrace demo OS\n");
    if (si->magic != 0x336ec578)
        panic("no PVH start_info", NULL);
    const char *cmdline = si->cmdline_paddr ? (const char *)si->cmdline_paddr : "";
    u64 ram = ram_end(si);
    kprintf("memory: %lu MiB below 4 GiB, command line: \"%s\"\n", ram >> 20, cmdline);
    if ((vtrace_version() & 0xffff0000) == VTRACE_VERSION_MAGIC)
        kprintf("vtrace ABI %d\n", vtrace_version() & 0xffff);

    gdt_init();
    idt_init();
    pic_init();
    pit_init();
    mm_init(ram);
    int tasks = 1;
#ifdef DEMO_SMP
    smp_init(si->rsdp_paddr, cmdline);
    tasks = smp_tasks_wanted();
#endif
    if (tasks) {
        sched_init();
        tasks_spawn();
        kprintf("starting 3 tasks\n");
        vtrace_mark(1, 0);
        sched_run();
        vtrace_mark(2, ticks);
    }
#ifdef DEMO_SMP
    smp_finish();
#endif

    sched_print_outputs();
    kprintf("page faults: %lu, system calls: %lu\n", page_faults, syscalls);
    kprintf("timer ticks: %lu, context switches: %lu\n", ticks, context_switches);
    kprintf("yield traps: %lu\n", yield_traps);
    static const char bye[] = "demo OS done";
    vtrace_log(bye, sizeof bye - 1);
    kprintf("exiting\n");
    vtrace_exit(0);
    panic("still running after EXIT", NULL);
}
