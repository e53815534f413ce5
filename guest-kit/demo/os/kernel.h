/* Shared declarations of the vtrace demo OS. */
#ifndef DEMO_KERNEL_H
#define DEMO_KERNEL_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long u64;
typedef long i64;
typedef unsigned long size_t;

#define NULL ((void *)0)
#define PAGE_SIZE 4096UL

/* Register frame built by entry.S; the layout must match its pushes. */
struct frame {
    u64 r15, r14, r13, r12, r11, r10, r9, r8;
    u64 rbp, rdi, rsi, rdx, rcx, rbx, rax;
    u64 vector, error;
    u64 rip, cs, rflags, rsp, ss;
};

#define VEC_TIMER 32
#define VEC_YIELD 0x80

/* Timer rate: 1193182 Hz / 4773 = 249.98 Hz, like a HZ=250 kernel. */
#define PIT_DIVISOR 4773
#define PIT_HZ_X100 24998

/* io.c */
static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port)); }
static inline u8 inb(u16 port) { u8 v; __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline u64 read_cr2(void) { u64 v; __asm__ volatile("mov %%cr2, %0" : "=r"(v)); return v; }
static inline u64 read_cr3(void) { u64 v; __asm__ volatile("mov %%cr3, %0" : "=r"(v)); return v; }
static inline void write_cr3(u64 v) { __asm__ volatile("mov %0, %%cr3" : : "r"(v) : "memory"); }

/* lib.c */
void *memset(void *d, int c, size_t n);
void *memcpy(void *d, const void *s, size_t n);
size_t strlen(const char *s);
int fmt(char *buf, size_t cap, const char *f, ...);

/* serial.c */
void serial_init(void);
void serial_write(const char *s, size_t n);
void kprintf(const char *f, ...);
void panic(const char *why, struct frame *f);

/* interrupts.c */
void gdt_init(void);
void idt_init(void);
void pic_init(void);
void pit_init(void);
void irq_eoi(int irq);
extern volatile u64 ticks;
/* Each timer tick and each yield trap calls schedule() once. */
extern u64 yield_traps;

/* mm.c */
#define USER_BASE 0x0000008000000000UL  /* PML4 slot 1: per-task memory */
#define USER_LIMIT (USER_BASE + 0x40000000UL)
void mm_init(u64 ram_end);
u64 frame_alloc(void);
u64 aspace_create(void);
int page_fault(u64 addr, u64 error);
extern u64 page_faults;

/* sched.c */
struct task;
void sched_init(void);
struct task *task_create(const char *name, void (*entry)(void));
struct frame *schedule(struct frame *current);
struct frame *sched_block_until(struct frame *f, u64 tick);
struct frame *sched_exit(struct frame *f, int code);
void sched_run(void);
void task_output(const char *s, size_t n);
void sched_print_outputs(void);
extern u64 context_switches;
extern int tasks_alive;

/* syscall.c */
enum { SYS_WRITE, SYS_YIELD, SYS_SLEEP, SYS_EXIT, SYS_GETPID, SYS_COUNT };
i64 syscall(i64 nr, i64 a, i64 b, i64 c);
extern u64 syscalls;
struct frame *syscall_switch(struct frame *f);
int sched_current(void);
void yield_trap(void);

/* tasks.c */
void tasks_spawn(void);

#ifdef DEMO_SMP
/* interrupts.c */
void idt_set_gate(int vec, u64 handler);
void idt_load(void);
/* smp.c */
void smp_init(u64 rsdp_paddr, const char *cmdline);
void smp_finish(void);
int smp_tasks_wanted(void);
struct frame *smp_interrupt(struct frame *f);
#endif

#endif
