/*
 * The demo workload: three tasks, each in its own address space, whose
 * memory comes from page faults on first touch. Each leaves one line of
 * output; the lines do not depend on timing.
 */
#include "kernel.h"
#include "vtrace.h"

static void say(const char *s)
{
    syscall(SYS_WRITE, (i64)s, (i64)strlen(s), 0);
}

static void say_result(const char *name, const char *what, u64 value)
{
    char line[96];
    int n = fmt(line, sizeof line, "%s: %s %lu (pid %d)\n", name, what, value,
                (int)syscall(SYS_GETPID, 0, 0, 0));
    syscall(SYS_WRITE, (i64)line, n, 0);
}

/* Sieve of Eratosthenes over task memory: counts primes below 10000. */
static void task_sieve(void)
{
    enum { N = 10000 };
    u8 *composite = (u8 *)USER_BASE;
    u64 count = 0;
    for (u64 i = 2; i < N; i++) {
        if (i == N / 2)
            syscall(SYS_YIELD, 0, 0, 0);
        if (composite[i])
            continue;
        count++;
        for (u64 j = i * i; j < N; j += i)
            composite[j] = 1;
    }
    say_result("sieve", "primes below 10000:", count);
    syscall(SYS_EXIT, 0, 0, 0);
}

/* Bitwise CRC-32 of 8 KiB of generated data in task memory. */
static void task_crc(void)
{
    enum { LEN = 8192 };
    u8 *data = (u8 *)(USER_BASE + 0x100000);
    for (u64 i = 0; i < LEN; i++)
        data[i] = (u8)(i * 7 + (i >> 5));
    u32 crc = 0xffffffffu;
    for (u64 i = 0; i < LEN; i++) {
        crc ^= data[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1)));
        if (i == LEN / 2)
            syscall(SYS_YIELD, 0, 0, 0);
    }
    say_result("crc32", "checksum of 8 KiB:", crc ^ 0xffffffffu);
    syscall(SYS_EXIT, 0, 0, 0);
}

/* Sleeps on the timer three times, then multiplies two small matrices. */
static void task_matrix(void)
{
    enum { N = 24 };
    u64 *a = (u64 *)(USER_BASE + 0x200000);
    u64 *b = a + N * N;
    u64 *c = b + N * N;
    for (int round = 0; round < 3; round++)
        syscall(SYS_SLEEP, 2, 0, 0);
    say("matrix: woke 3 times\n");
    for (u64 i = 0; i < N * N; i++) {
        a[i] = i % 7 + 1;
        b[i] = i % 5 + 2;
    }
    u64 trace = 0;
    for (int i = 0; i < N; i++) {
        /* A region of interest for `vtrace run --disk`: tracing starts at
         * the 3rd row and stops at the end of the 4th (pass counts). */
        vtrace_trace_start(3);
        for (int j = 0; j < N; j++) {
            u64 s = 0;
            for (int k = 0; k < N; k++)
                s += a[i * N + k] * b[k * N + j];
            c[i * N + j] = s;
        }
        trace += c[i * N + i];
        vtrace_trace_stop(2);
    }
    say_result("matrix", "trace of 24x24 product:", trace);
    syscall(SYS_EXIT, 0, 0, 0);
}

void tasks_spawn(void)
{
    task_create("sieve", task_sieve);
    task_create("crc32", task_crc);
    task_create("matrix", task_matrix);
}
