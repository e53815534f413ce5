/*
 * vtprog: the user program of the Linux process tests, built static with
 * symbols: a few routines of its own, whose names a trace must show, and
 * system calls made directly (write), so its steps stay few. It first
 * asks its pid twice, the x86-64 way (getpid, 39) and the i386 way
 * (int 0x80 with 20, which a 64-bit program may make too: the kernel's
 * ia32 table, where x86-64's 20 would be writev), and exits with 3 if the
 * two differ.
 *
 *   vtprog [N]   counts the primes below N (default 200) and says how many;
 *                with "loop", does so for ever.
 */
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) long ia32_getpid(void)
{
    long ret;
    /* The kernel saves and restores every register but RAX here (r8-r11
     * were zeroed before 4.x). */
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "r8", "r9", "r10", "r11", "memory");
    return ret;
}

__attribute__((noinline)) int is_prime(unsigned n)
{
    if (n < 2)
        return 0;
    for (unsigned d = 2; d * d <= n; d++)
        if (n % d == 0)
            return 0;
    return 1;
}

__attribute__((noinline)) unsigned count_primes(unsigned below)
{
    unsigned count = 0;
    for (unsigned n = 0; n < below; n++)
        count += is_prime(n);
    return count;
}

__attribute__((noinline)) void say_count(unsigned below, unsigned count)
{
    char line[64] = "vtprog: ", digits[16];
    char *end = line + strlen(line);
    unsigned values[2] = { count, below };
    for (int v = 0; v < 2; v++) {
        int n = 0;
        unsigned x = values[v];
        do
            digits[n++] = (char)('0' + x % 10);
        while ((x /= 10));
        while (n)
            *end++ = digits[--n];
        const char *sep = v == 0 ? " primes below " : " done\n";
        memcpy(end, sep, strlen(sep));
        end += strlen(sep);
    }
    write(1, line, (size_t)(end - line));
}

int main(int argc, char **argv)
{
    int loop = argc > 1 && !strcmp(argv[1], "loop");
    unsigned below = 200;
    if (argc > 1 && !loop) {
        below = 0;
        for (const char *c = argv[1]; *c >= '0' && *c <= '9'; c++)
            below = below * 10 + (unsigned)(*c - '0');
    }
    if (ia32_getpid() != (long)getpid())
        return 3;
    do
        say_count(below, count_primes(below));
    while (loop);
    return 0;
}
