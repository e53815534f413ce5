/*
 * Physical frames and per-task address spaces. The kernel's identity map of
 * the first 1 GiB (PML4 slot 0) is shared by every address space; slot 1
 * (USER_BASE) is private to each task and filled on demand by page faults.
 */
#include "kernel.h"
#include "vtrace-sdt.h"

#define PTE_P 0x1UL
#define PTE_W 0x2UL
#define PTE_ADDR 0x000ffffffffff000UL

extern u64 boot_pml4[];
extern char __kernel_end[];

static u64 next_frame, frame_limit;
u64 page_faults;

void mm_init(u64 ram_end)
{
    next_frame = ((u64)__kernel_end + 0x3fffff) & ~0x3fffffUL; /* first 4 MiB boundary */
    frame_limit = ram_end < 0x40000000UL ? ram_end : 0x40000000UL;
}

u64 frame_alloc(void)
{
    if (next_frame + PAGE_SIZE > frame_limit)
        panic("out of memory", NULL);
    u64 f = next_frame;
    next_frame += PAGE_SIZE;
    memset((void *)f, 0, PAGE_SIZE);
    return f;
}

u64 aspace_create(void)
{
    u64 *pml4 = (u64 *)frame_alloc();
    pml4[0] = boot_pml4[0];
    return (u64)pml4;
}

static u64 *next_level(u64 *table, int index)
{
    if (!(table[index] & PTE_P))
        table[index] = frame_alloc() | PTE_P | PTE_W;
    return (u64 *)(table[index] & PTE_ADDR);
}

/* Returns 1 when the fault was a first touch of task memory and is now mapped. */
int page_fault(u64 addr, u64 error)
{
    if ((error & PTE_P) || addr < USER_BASE || addr >= USER_LIMIT)
        return 0;
    u64 *pml4 = (u64 *)(read_cr3() & PTE_ADDR);
    u64 *pdpt = next_level(pml4, (addr >> 39) & 511);
    u64 *pd = next_level(pdpt, (addr >> 30) & 511);
    u64 *pt = next_level(pd, (addr >> 21) & 511);
    pt[(addr >> 12) & 511] = frame_alloc() | PTE_P | PTE_W;
    page_faults++;
    VTRACE_PROBE(fault, page, addr);
    return 1;
}
