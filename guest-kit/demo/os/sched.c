/*
 * A preemptive round-robin scheduler. Tasks run at CPL 0 (a vtrace test
 * guest must: user mode is not stepped on every host) but each has its own
 * address space. The timer and yield_trap both enter schedule().
 */
#include "kernel.h"
#include "vtrace-sdt.h"

#define MAX_TASKS 8
#define STACK_SIZE 16384
#define OUT_SIZE 512

enum state { FREE, READY, SLEEPING, DEAD };

struct task {
    const char *name;
    enum state state;
    u64 cr3;
    u64 wake_tick;
    struct frame *frame;
    char out[OUT_SIZE];
    size_t out_len;
};

extern u64 boot_pml4[];
static struct task tasks[MAX_TASKS];
static int ntasks;
static int current = -1; /* -1: the boot context, which becomes the idle loop */
static struct frame *idle_frame;
u64 context_switches;
int tasks_alive;

void sched_init(void)
{
    ntasks = 0;
    tasks_alive = 0;
}

struct task *task_create(const char *name, void (*entry)(void))
{
    struct task *t = &tasks[ntasks++];
    u64 stack = 0;
    for (u64 i = 0; i < STACK_SIZE / PAGE_SIZE; i++) {
        u64 f = frame_alloc(); /* frames are handed out consecutively */
        if (i == 0)
            stack = f;
    }
    struct frame *fr = (struct frame *)(stack + STACK_SIZE - sizeof(struct frame));
    memset(fr, 0, sizeof *fr);
    fr->rip = (u64)entry;
    fr->cs = 0x08;
    fr->rflags = 0x202; /* IF */
    fr->rsp = stack + STACK_SIZE - sizeof(struct frame) - 8;
    fr->ss = 0x10;
    t->name = name;
    t->state = READY;
    t->cr3 = aspace_create();
    t->frame = fr;
    tasks_alive++;
    return t;
}

static int pick_next(void)
{
    for (int i = 1; i <= ntasks; i++) {
        int c = (current + i + ntasks) % ntasks;
        if (current < 0)
            c = i - 1;
        struct task *t = &tasks[c];
        if (t->state == SLEEPING && ticks >= t->wake_tick)
            t->state = READY;
        if (t->state == READY)
            return c;
    }
    return -1;
}

static struct frame *switch_to(int next)
{
    if (next != current) {
        context_switches++;
        VTRACE_PROBE(sched, switch, current, next);
    }
    current = next;
    if (next < 0) {
        write_cr3((u64)boot_pml4);
        return idle_frame;
    }
    write_cr3(tasks[next].cr3);
    return tasks[next].frame;
}

struct frame *schedule(struct frame *f)
{
    if (current < 0)
        idle_frame = f;
    else
        tasks[current].frame = f;
    return switch_to(pick_next());
}

struct frame *sched_block_until(struct frame *f, u64 tick)
{
    tasks[current].state = SLEEPING;
    tasks[current].wake_tick = tick;
    return schedule(f);
}

struct frame *sched_exit(struct frame *f, int code)
{
    (void)code;
    tasks[current].state = DEAD;
    tasks_alive--;
    return schedule(f);
}

int sched_current(void)
{
    return current;
}

void task_output(const char *s, size_t n)
{
    struct task *t = &tasks[current];
    if (n > OUT_SIZE - t->out_len)
        n = OUT_SIZE - t->out_len;
    memcpy(t->out + t->out_len, s, n);
    t->out_len += n;
}

/* Task output is printed in task order at the end, so the console does not
 * depend on where the timer happened to preempt. */
void sched_print_outputs(void)
{
    for (int i = 0; i < ntasks; i++)
        serial_write(tasks[i].out, tasks[i].out_len);
}

/* The boot context idles here until every task has exited. */
void sched_run(void)
{
    __asm__ volatile("sti");
    while (tasks_alive > 0) {
        yield_trap();
        if (tasks_alive > 0)
            __asm__ volatile("sti; hlt");
    }
    __asm__ volatile("cli");
}
