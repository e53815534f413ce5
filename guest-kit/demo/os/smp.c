/*
 * SMP mode of the demo OS (built with -DDEMO_SMP; `vtrace run --cpus N`).
 *
 * CPU 0 finds the other CPUs in the ACPI MADT (PVH start_info.rsdp_paddr),
 * starts each with INIT and STARTUP IPIs through its local APIC, and fills
 * a shared queue of work items (count the primes below n). The other CPUs
 * halt until CPU 0's wake IPI, then take items from the queue under a
 * spinlock and send CPU 0 a "done" IPI for each. CPU 0 runs the one-CPU
 * demo's tasks meanwhile (unless `smp_only`), then helps drain the queue,
 * waits for the last result and prints who did what.
 */
#include "kernel.h"
#include "vtrace-sdt.h"

#define LAPIC 0xfee00000UL
#define LAPIC_ID 0x20
#define LAPIC_EOI 0xb0
#define LAPIC_SVR 0xf0
#define LAPIC_ICR_LOW 0x300
#define LAPIC_ICR_HIGH 0x310
#define LAPIC_LVT_TIMER 0x320
#define LAPIC_TIMER_INITIAL 0x380
#define LAPIC_TIMER_DIVIDE 0x3e0

#define VEC_WAKE 0xf0
#define VEC_DONE 0xf1
#define VEC_SPURIOUS 0xff

#define MAX_CPUS 16
#define WORK_ITEMS 24
#define TRAMPOLINE 0x10000UL
#define AP_STACK 8192

/* `smp_park`: when the work is done, every CPU halts, and 5 s later CPU 0's
 * local APIC timer wakes it once to wake the others once (tests/smp.rs
 * starts a trace meanwhile). */
static int park;
static volatile int parked;

/* `smp_only`: CPU 0 runs none of the one-CPU demo's tasks and goes
 * straight to the queue, so that every CPU works from the wake IPI on, and
 * the queue gives its largest items first, so that none works on alone at
 * the end (`vtrace bench --cpus`: a guest whose CPUs are all busy). */
static int only;

struct rsdp {
    char signature[8];
    u8 checksum;
    char oem[6];
    u8 revision;
    u32 rsdt;
    u32 length;
    u64 xsdt;
} __attribute__((packed));

struct sdt {
    char signature[4];
    u32 length;
    u8 revision, checksum;
    char oem[6], oem_table[8];
    u32 oem_revision, creator, creator_revision;
} __attribute__((packed));

struct work {
    u64 n;
    u64 primes;
    int cpu;
};

extern u64 boot_pml4[];
extern char ap_trampoline[], ap_trampoline_end[];
extern void isr240(void), isr241(void), isr255(void);

/* Read by ap_long: the stack of the AP being started. */
u64 ap_boot_stack;

static u64 lapic_pd[512] __attribute__((aligned(4096)));
static u8 ap_stacks[MAX_CPUS][AP_STACK] __attribute__((aligned(16)));
static u8 apic_ids[MAX_CPUS];
static int ncpus;
static volatile int cpus_up;

static struct work work[WORK_ITEMS];
static volatile int queue_lock;
static volatile int queue_next;
static volatile int items_done;
static u64 items_by_cpu[MAX_CPUS];
static u64 lock_spins[MAX_CPUS];
static volatile u64 ipis_by_cpu[MAX_CPUS];

static u32 lapic_read(u32 reg) { return *(volatile u32 *)(LAPIC + reg); }
static void lapic_write(u32 reg, u32 v) { *(volatile u32 *)(LAPIC + reg) = v; }
static int this_cpu_id(void) { return (int)(lapic_read(LAPIC_ID) >> 24); }

static int cpu_index(int apic_id)
{
    for (int i = 0; i < ncpus; i++)
        if (apic_ids[i] == apic_id)
            return i;
    return 0;
}

static void send_ipi(int apic_id, u32 command)
{
    lapic_write(LAPIC_ICR_HIGH, (u32)apic_id << 24);
    lapic_write(LAPIC_ICR_LOW, command);
}

static void spin_lock(volatile int *lock, int cpu)
{
    while (__atomic_exchange_n(lock, 1, __ATOMIC_ACQUIRE)) {
        lock_spins[cpu]++;
        while (*lock)
            __asm__ volatile("pause");
    }
}

static void spin_unlock(volatile int *lock)
{
    __atomic_store_n(lock, 0, __ATOMIC_RELEASE);
}

/* The MADT's enabled local APICs, CPU 0 (this one) first. A machine
 * without ACPI tables has one CPU (vtrace gives a one-CPU machine none),
 * which then does all the work itself. */
static void find_cpus(u64 rsdp_paddr)
{
    apic_ids[0] = 0;
    ncpus = 1;
    if (!rsdp_paddr)
        return;
    apic_ids[0] = (u8)this_cpu_id();
    const struct rsdp *rsdp = (const void *)rsdp_paddr;
    if (rsdp->revision < 2)
        panic("SMP mode needs ACPI 2.0 tables (PVH start_info.rsdp_paddr)", NULL);
    const struct sdt *xsdt = (const void *)rsdp->xsdt;
    const u64 *entry = (const u64 *)(xsdt + 1);
    u32 entries = (xsdt->length - sizeof *xsdt) / 8;
    for (u32 i = 0; i < entries; i++) {
        const struct sdt *t = (const void *)entry[i];
        if (t->signature[0] != 'A' || t->signature[1] != 'P' || t->signature[2] != 'I' ||
            t->signature[3] != 'C')
            continue;
        const u8 *p = (const u8 *)t + sizeof *t + 8, *end = (const u8 *)t + t->length;
        for (; p + 2 <= end && p[1] >= 2; p += p[1])
            if (p[0] == 0 && (p[4] & 1) && p[3] != apic_ids[0] && ncpus < MAX_CPUS)
                apic_ids[ncpus++] = p[3];
    }
}

static void map_lapic(void)
{
    /* 2 MiB page at 0xfee00000, uncached (PCD | PWT), in PDPT slot 3. */
    u64 *boot_pdpt = (u64 *)(boot_pml4[0] & ~0xfffUL);
    lapic_pd[(LAPIC >> 21) & 511] = LAPIC | 0x83 | 0x18;
    boot_pdpt[3] = (u64)lapic_pd | 0x3;
    write_cr3(read_cr3());
}

static void lapic_enable(void)
{
    lapic_write(LAPIC_SVR, 0x100 | VEC_SPURIOUS);
}

static u64 count_primes(u64 n)
{
    u64 count = 0;
    for (u64 k = 2; k < n; k++) {
        int prime = 1;
        for (u64 d = 2; d * d <= k; d++)
            if (k % d == 0) {
                prime = 0;
                break;
            }
        count += prime;
    }
    return count;
}

/* Takes items from the queue until it is empty; returns how many. Not
 * inlined, so that `vtrace run --trace-function take_work` has a call to
 * follow on each CPU. */
__attribute__((noinline)) int take_work(int cpu)
{
    int taken = 0;
    for (;;) {
        spin_lock(&queue_lock, cpu);
        int i = queue_next < WORK_ITEMS ? queue_next++ : -1;
        spin_unlock(&queue_lock);
        if (i < 0)
            return taken;
        VTRACE_PROBE(smp, work, cpu, i);
        work[i].primes = count_primes(work[i].n);
        work[i].cpu = cpu;
        items_by_cpu[cpu]++;
        taken++;
        __atomic_add_fetch(&items_done, 1, __ATOMIC_RELEASE);
        if (cpu != 0)
            send_ipi(apic_ids[0], VEC_DONE);
    }
}

void ap_main(void)
{
    int cpu = cpu_index(this_cpu_id());
    idt_load();
    lapic_enable();
    __atomic_add_fetch(&cpus_up, 1, __ATOMIC_RELEASE);
    for (;;) {
        /* Wait for the wake IPI, then drain the queue. */
        __asm__ volatile("sti; hlt; cli");
        take_work(cpu);
    }
}

/* Vectors 0xf0 and up (interrupts.c's trap). */
struct frame *smp_interrupt(struct frame *f)
{
    if (f->vector != VEC_SPURIOUS) {
        ipis_by_cpu[cpu_index(this_cpu_id())]++;
        if (parked && f->vector == VEC_DONE)  /* smp_park's one-shot */
            lapic_write(LAPIC_ICR_LOW, 0xc0000 | 0x4000 | VEC_WAKE);
        lapic_write(LAPIC_EOI, 0);
    }
    return f;
}

/* Where `key` is on the command line: what follows it, else NULL. */
static const char *option(const char *cmdline, const char *key)
{
    for (const char *p = cmdline; *p; p++) {
        int i = 0;
        while (key[i] && p[i] == key[i])
            i++;
        if (!key[i])
            return p + i;
    }
    return 0;
}

/* The work's size: `smp_work=N` on the command line multiplies each
 * item's range (1 to 1000; 1 without it), for `vtrace bench --cpus`. */
static u64 work_scale(const char *cmdline)
{
    const char *p = option(cmdline, "smp_work=");
    if (!p)
        return 1;
    u64 n = 0;
    for (; *p >= '0' && *p <= '9' && n <= 1000; p++)
        n = n * 10 + (u64)(*p - '0');
    return n >= 1 && n <= 1000 ? n : 1;
}

void smp_init(u64 rsdp_paddr, const char *cmdline)
{
    u64 scale = work_scale(cmdline);
    park = option(cmdline, "smp_park") != 0;
    only = option(cmdline, "smp_only") != 0;
    map_lapic();
    find_cpus(rsdp_paddr);
    idt_set_gate(VEC_WAKE, (u64)isr240);
    idt_set_gate(VEC_DONE, (u64)isr241);
    idt_set_gate(VEC_SPURIOUS, (u64)isr255);
    lapic_enable();
    memcpy((void *)TRAMPOLINE, ap_trampoline, (size_t)(ap_trampoline_end - ap_trampoline));
    for (int i = 1; i < ncpus; i++) {
        ap_boot_stack = (u64)(ap_stacks[i] + AP_STACK);
        send_ipi(apic_ids[i], 0x4500);                       /* INIT */
        send_ipi(apic_ids[i], 0x4600 | (TRAMPOLINE >> 12));  /* STARTUP */
        while (cpus_up < i)
            __asm__ volatile("pause");
    }
    kprintf("SMP: %d CPUs up (APIC IDs", ncpus);
    for (int i = 0; i < ncpus; i++)
        kprintf(" %d", apic_ids[i]);
    kprintf(")\n");
    /* With `smp_only`, the largest items first, so that the CPUs run out
     * of work at about the same time: the last item taken is the
     * smallest. In ascending order, one CPU worked the largest alone, 3 %
     * of `vtrace bench --cpus 2`'s steps, while the other idled. Without
     * it the items grow (CPU 0 joins late anyway), as the tests' traces of
     * the first steps have them. */
    for (int i = 0; i < WORK_ITEMS; i++) {
        u64 rank = only ? (u64)(WORK_ITEMS - 1 - i) : (u64)i;
        work[i].n = (200 + 40 * rank) * scale;
    }
    if (ncpus > 1)
        lapic_write(LAPIC_ICR_LOW, 0xc0000 | 0x4000 | VEC_WAKE);  /* all but self */
}

/* Whether CPU 0 runs the one-CPU demo's tasks (see `smp_only`). */
int smp_tasks_wanted(void)
{
    return !only;
}

void smp_finish(void)
{
    take_work(0);
    __asm__ volatile("cli");
    while (items_done < WORK_ITEMS)
        __asm__ volatile("sti; hlt; cli");
    u64 primes = 0;
    for (int i = 0; i < WORK_ITEMS; i++)
        primes += work[i].primes;
    kprintf("SMP: %d work items, %lu primes counted\n", WORK_ITEMS, primes);
    for (int c = 0; c < ncpus; c++)
        kprintf("SMP: CPU %d: %lu items, %lu IPIs taken, %lu lock spins\n", c, items_by_cpu[c],
                ipis_by_cpu[c], lock_spins[c]);
    if (park) {
        kprintf("SMP: parked, every CPU halts\n");
        /* The other CPUs already halt, waiting for a wake IPI; with the PIC
         * masked, no timer tick or serial interrupt comes for CPU 0, only
         * its local APIC timer's one-shot (1.28 us a count). */
        outb(0x21, 0xff);
        outb(0xa1, 0xff);
        parked = 1;
        lapic_write(LAPIC_TIMER_DIVIDE, 0xa);
        lapic_write(LAPIC_LVT_TIMER, VEC_DONE);
        lapic_write(LAPIC_TIMER_INITIAL, 3906250);
        for (;;)
            __asm__ volatile("sti; hlt; cli");
    }
}
