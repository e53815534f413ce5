/*
 * The system-call table. Tasks enter it with an ordinary call (SYSCALL and
 * INT n are not usable on every host vtrace runs on); calls that must switch
 * tasks go through yield_trap with the request left in `pending`.
 */
#include "kernel.h"
#include "vtrace-sdt.h"

u64 syscalls;
int sched_current(void);

static struct {
    int op;
    i64 arg;
} pending;

static i64 sys_write(i64 buf, i64 len, i64 unused)
{
    (void)unused;
    task_output((const char *)buf, (size_t)len);
    return len;
}

static i64 sys_yield(i64 a, i64 b, i64 c)
{
    (void)a; (void)b; (void)c;
    yield_trap();
    return 0;
}

static i64 sys_sleep(i64 nticks, i64 b, i64 c)
{
    (void)b; (void)c;
    __asm__ volatile("cli");
    pending.op = SYS_SLEEP;
    pending.arg = (i64)ticks + nticks;
    yield_trap();
    __asm__ volatile("sti");
    return 0;
}

static i64 sys_exit(i64 code, i64 b, i64 c)
{
    (void)b; (void)c;
    __asm__ volatile("cli");
    pending.op = SYS_EXIT;
    pending.arg = code;
    yield_trap();
    panic("exited task resumed", NULL);
    return 0;
}

static i64 sys_getpid(i64 a, i64 b, i64 c)
{
    (void)a; (void)b; (void)c;
    return sched_current();
}

typedef i64 (*syscall_fn)(i64, i64, i64);

static const syscall_fn syscall_table[SYS_COUNT] = {
    [SYS_WRITE] = sys_write,
    [SYS_YIELD] = sys_yield,
    [SYS_SLEEP] = sys_sleep,
    [SYS_EXIT] = sys_exit,
    [SYS_GETPID] = sys_getpid,
};

i64 syscall(i64 nr, i64 a, i64 b, i64 c)
{
    VTRACE_PROBE(syscall, entry, nr);
    if (nr < 0 || nr >= SYS_COUNT)
        return -1;
    syscalls++;
    i64 ret = syscall_table[nr](a, b, c);
    VTRACE_PROBE(syscall, exit, nr, ret);
    return ret;
}

/* Called by schedule's caller (trap) for a yield that carries a request. */
struct frame *syscall_switch(struct frame *f)
{
    int op = pending.op;
    pending.op = 0;
    if (op == SYS_SLEEP)
        return sched_block_until(f, (u64)pending.arg);
    if (op == SYS_EXIT)
        return sched_exit(f, (int)pending.arg);
    return schedule(f);
}
