/* GDT/TSS, IDT, the 8259 PIC pair, the 8254 PIT, and trap dispatch. */
#include "kernel.h"
#include "vtrace-sdt.h"

struct tss {
    u32 reserved0;
    u64 rsp[3];
    u64 reserved1;
    u64 ist[7];
    u64 reserved2;
    u16 reserved3;
    u16 iomap_base;
} __attribute__((packed));

struct idt_entry {
    u16 off_lo;
    u16 selector;
    u8 ist;
    u8 type;
    u16 off_mid;
    u32 off_hi;
    u32 zero;
} __attribute__((packed));

struct table_ptr {
    u16 limit;
    u64 base;
} __attribute__((packed));

extern u64 boot_gdt[];
extern const u64 isr_table[48];

static struct tss tss;
static struct idt_entry idt[256];
static u8 df_stack[8192] __attribute__((aligned(16)));
volatile u64 ticks;
u64 yield_traps;

void gdt_init(void)
{
    u64 base = (u64)&tss;
    u64 limit = sizeof tss - 1;
    tss.ist[0] = (u64)(df_stack + sizeof df_stack); /* double faults get a fresh stack */
    tss.iomap_base = sizeof tss;
    boot_gdt[3] = (limit & 0xffff) | ((base & 0xffffff) << 16) | (0x89UL << 40) |
                  (((limit >> 16) & 0xf) << 48) | (((base >> 24) & 0xff) << 56);
    boot_gdt[4] = base >> 32;
    __asm__ volatile("ltr %w0" : : "r"(0x18));
}

static void idt_set(int vec, u64 handler, int ist)
{
    idt[vec].off_lo = handler & 0xffff;
    idt[vec].selector = 0x08;
    idt[vec].ist = (u8)ist;
    idt[vec].type = 0x8e; /* present, interrupt gate */
    idt[vec].off_mid = (handler >> 16) & 0xffff;
    idt[vec].off_hi = handler >> 32;
    idt[vec].zero = 0;
}

void idt_init(void)
{
    for (int v = 0; v < 48; v++)
        idt_set(v, isr_table[v], v == 8 ? 1 : 0);
    struct table_ptr p = { sizeof idt - 1, (u64)idt };
    __asm__ volatile("lidt %0" : : "m"(p));
}

#ifdef DEMO_SMP
void idt_set_gate(int vec, u64 handler)
{
    idt_set(vec, handler, 0);
}

/* Another CPU loads the same IDT and GDT (no TSS: one TSS cannot be busy
 * on two CPUs, and the other CPUs change no privilege level). */
void idt_load(void)
{
    struct table_ptr p = { sizeof idt - 1, (u64)idt };
    __asm__ volatile("lidt %0" : : "m"(p));
}
#endif

void pic_init(void)
{
    outb(0x20, 0x11); outb(0xa0, 0x11);   /* ICW1: edge, cascade, ICW4 */
    outb(0x21, 0x20); outb(0xa1, 0x28);   /* ICW2: vectors 32..47 */
    outb(0x21, 0x04); outb(0xa1, 0x02);   /* ICW3: slave on IRQ2 */
    outb(0x21, 0x01); outb(0xa1, 0x01);   /* ICW4: 8086 mode */
    outb(0x21, 0xfe); outb(0xa1, 0xff);   /* only IRQ0 (timer) unmasked */
}

void pit_init(void)
{
    outb(0x43, 0x34);                     /* channel 0, lo/hi, mode 2 */
    outb(0x40, PIT_DIVISOR & 0xff);
    outb(0x40, PIT_DIVISOR >> 8);
}

void irq_eoi(int irq)
{
    if (irq >= 8)
        outb(0xa0, 0x20);
    outb(0x20, 0x20);
}

static const char *const exception_names[32] = {
    "divide error", "debug", "NMI", "breakpoint", "overflow", "bound range",
    "invalid opcode", "device not available", "double fault", "coprocessor overrun",
    "invalid TSS", "segment not present", "stack fault", "general protection",
    "page fault", "reserved", "x87 error", "alignment check", "machine check",
    "SIMD error", "virtualization", "control protection",
};

struct frame *trap(struct frame *f)
{
    if (f->vector == VEC_TIMER) {
        ticks++;
        VTRACE_PROBE(timer, tick, ticks);
        irq_eoi(0);
        return schedule(f);
    }
    if (f->vector == VEC_YIELD) {
        yield_traps++;
        return syscall_switch(f);
    }
#ifdef DEMO_SMP
    if (f->vector >= 0xf0)
        return smp_interrupt(f);
#endif
    if (f->vector == 14 && page_fault(read_cr2(), f->error))
        return f;
    if (f->vector >= 33 && f->vector < 48) {
        irq_eoi((int)f->vector - 32); /* spurious or unexpected IRQ */
        return f;
    }
    const char *name = f->vector < 32 && exception_names[f->vector] ? exception_names[f->vector]
                                                                    : "unexpected vector";
    panic(name, f);
    return f;
}
