/* Freestanding helpers: the demo OS links no C library. */
#include <stdarg.h>
#include "kernel.h"

/* String instructions, as real kernels use: one instruction per call keeps
 * page-fault handling (which zeroes frames with interrupts off) short. */
void *memset(void *d, int c, size_t n)
{
    void *ret = d;
    __asm__ volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
    return ret;
}

void *memcpy(void *d, const void *s, size_t n)
{
    void *ret = d;
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
    return ret;
}

size_t strlen(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}

static size_t put_num(char *buf, size_t pos, size_t cap, u64 v, int base, int width)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v % (u64)base];
        v /= (u64)base;
    } while (v);
    while (n < width)
        tmp[n++] = '0';
    while (n--)
        if (pos + 1 < cap)
            buf[pos++] = tmp[n];
    return pos;
}

/* A small vsnprintf: %s %d %u %x %lx %lu %ld %c, with an optional 0-width. */
static int vfmt(char *buf, size_t cap, const char *f, va_list ap)
{
    size_t pos = 0;
    for (; *f; f++) {
        if (*f != '%') {
            if (pos + 1 < cap)
                buf[pos++] = *f;
            continue;
        }
        f++;
        int width = 0;
        while (*f >= '0' && *f <= '9')
            width = width * 10 + (*f++ - '0');
        int is_long = 0;
        while (*f == 'l') {
            is_long = 1;
            f++;
        }
        switch (*f) {
        case 's': {
            const char *s = va_arg(ap, const char *);
            while (*s)
                if (pos + 1 < cap)
                    buf[pos++] = *s++;
                else
                    s++;
            break;
        }
        case 'c':
            if (pos + 1 < cap)
                buf[pos++] = (char)va_arg(ap, int);
            break;
        case 'd': {
            i64 v = is_long ? va_arg(ap, i64) : va_arg(ap, int);
            if (v < 0) {
                if (pos + 1 < cap)
                    buf[pos++] = '-';
                v = -v;
            }
            pos = put_num(buf, pos, cap, (u64)v, 10, width);
            break;
        }
        case 'u':
            pos = put_num(buf, pos, cap, is_long ? va_arg(ap, u64) : va_arg(ap, u32), 10, width);
            break;
        case 'x':
            pos = put_num(buf, pos, cap, is_long ? va_arg(ap, u64) : va_arg(ap, u32), 16, width);
            break;
        default:
            if (pos + 1 < cap)
                buf[pos++] = *f;
        }
    }
    if (cap)
        buf[pos] = 0;
    return (int)pos;
}

int fmt(char *buf, size_t cap, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vfmt(buf, cap, f, ap);
    va_end(ap);
    return n;
}

void kprintf(const char *f, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, f);
    int n = vfmt(buf, sizeof buf, f, ap);
    va_end(ap);
    serial_write(buf, (size_t)n);
}
