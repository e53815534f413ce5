/*
 * vtrace-sdt.h: static probes (SDT) for C guests that run at CPL 0.
 *
 *     VTRACE_PROBE(provider, name, args...)    up to 6 integer arguments
 *
 *     VTRACE_PROBE(sched, switch, prev, next);
 *
 * Each site
 *   - gets an ELF note in systemtap's format (section .note.stapsdt, owner
 *     "stapsdt", type 3), so `readelf -n`, `vtrace probes list` and the
 *     tools that read systemtap's probes all see it;
 *   - has a 16-bit semaphore in section .probes, which vtrace sets while the
 *     probe is enabled (`vtrace run --probe`, `vtrace ctl probe enable`);
 *   - costs, while disabled, one compare of the semaphore in memory and a
 *     branch not taken: the check is an asm goto, so the arguments are not
 *     even computed, and the firing code is laid out away from the hot path;
 *   - fires, while enabled, the PROBE hypercall: one IN from VTRACE_PORT,
 *     whose address the note gives as the probe's location, with the
 *     arguments in RBX, RCX, RSI, RDI, R8, R9 (the note's argument list
 *     says so in systemtap's notation, "-8@%rbx").
 *
 * Needs GCC (asm goto, local labels, cold labels) and code built without
 * -fpic: the note holds absolute addresses, as a kernel's do. The linker
 * script must keep .probes in a loaded, writable segment, and must not
 * discard .note.stapsdt. Several sites may share a provider and name; each
 * has its own semaphore, and vtrace sets all of a probe's.
 */
#ifndef VTRACE_SDT_H
#define VTRACE_SDT_H

#include "vtrace.h"

/* The note, as systemtap's <sys/sdt.h> writes it: owner "stapsdt", type 3,
 * then the location (label 990, the IN), the base (for prelinked
 * libraries; unused here but kept for the tools), the semaphore, and the
 * provider, name and argument strings. */
#define _VTRACE_SDT_NOTE(provider, name, argfmt)                               \
    ".pushsection .note.stapsdt,\"\",\"note\"\n\t"                             \
    ".balign 4\n\t"                                                            \
    ".4byte 992f-991f, 994f-993f, 3\n"                                         \
    "991:\n\t"                                                                 \
    ".asciz \"stapsdt\"\n"                                                     \
    "992:\n\t"                                                                 \
    ".balign 4\n"                                                              \
    "993:\n\t"                                                                 \
    ".8byte 990b\n\t"                                                          \
    ".8byte _.stapsdt.base\n\t"                                                \
    ".8byte %c[sema]\n\t"                                                      \
    ".asciz \"" #provider "\"\n\t"                                             \
    ".asciz \"" #name "\"\n\t"                                                 \
    ".asciz \"" argfmt "\"\n"                                                  \
    "994:\n\t"                                                                 \
    ".balign 4\n\t"                                                            \
    ".popsection\n\t"                                                          \
    ".ifndef _.stapsdt.base\n\t"                                               \
    ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n\t"  \
    ".weak _.stapsdt.base\n\t"                                                 \
    ".hidden _.stapsdt.base\n"                                                 \
    "_.stapsdt.base:\n\t"                                                      \
    ".space 1\n\t"                                                             \
    ".size _.stapsdt.base, 1\n\t"                                              \
    ".popsection\n\t"                                                          \
    ".endif\n"

/* The arguments are computed into temporaries before R8 and R9 are bound:
 * computing one (a call) could change those registers. */
#define _VTRACE_SDT_SITE(provider, name, argfmt, x0, x1, x2, x3, x4, x5)       \
    do {                                                                       \
        __label__ _vtrace_fire, _vtrace_done;                                  \
        static volatile unsigned short _vtrace_sema                            \
            __attribute__((section(".probes"), used));                         \
        __asm__ goto("cmpw $0, %0\n\t"                                         \
                     "jne %l[_vtrace_fire]"                                    \
                     :                                                         \
                     : "m"(_vtrace_sema)                                       \
                     : "cc"                                                    \
                     : _vtrace_fire);                                          \
        goto _vtrace_done;                                                     \
    _vtrace_fire: __attribute__((cold));                                       \
        {                                                                      \
            unsigned long _vtrace_t0 = (unsigned long)(x0);                    \
            unsigned long _vtrace_t1 = (unsigned long)(x1);                    \
            unsigned long _vtrace_t2 = (unsigned long)(x2);                    \
            unsigned long _vtrace_t3 = (unsigned long)(x3);                    \
            unsigned long _vtrace_t4 = (unsigned long)(x4);                    \
            unsigned long _vtrace_t5 = (unsigned long)(x5);                    \
            register unsigned long _vtrace_r8 __asm__("r8") = _vtrace_t4;      \
            register unsigned long _vtrace_r9 __asm__("r9") = _vtrace_t5;      \
            unsigned int _vtrace_eax = VTRACE_CMD_PROBE;                       \
            __asm__ volatile("990:\n\t"                                        \
                             "inl %%dx, %%eax\n\t"                             \
                             _VTRACE_SDT_NOTE(provider, name, argfmt)          \
                             : "+a"(_vtrace_eax)                               \
                             : "d"((unsigned short)VTRACE_PORT),               \
                               "b"(_vtrace_t0), "c"(_vtrace_t1),               \
                               "S"(_vtrace_t2), "D"(_vtrace_t3),               \
                               "r"(_vtrace_r8), "r"(_vtrace_r9),               \
                               [sema] "i"(&_vtrace_sema)                       \
                             : "memory");                                      \
        }                                                                      \
    _vtrace_done:;                                                             \
    } while (0)

#define _VTRACE_SDT_A1 "-8@%%rbx"
#define _VTRACE_SDT_A2 _VTRACE_SDT_A1 " -8@%%rcx"
#define _VTRACE_SDT_A3 _VTRACE_SDT_A2 " -8@%%rsi"
#define _VTRACE_SDT_A4 _VTRACE_SDT_A3 " -8@%%rdi"
#define _VTRACE_SDT_A5 _VTRACE_SDT_A4 " -8@%%r8"
#define _VTRACE_SDT_A6 _VTRACE_SDT_A5 " -8@%%r9"

#define _VTRACE_SDT_P0(p, n) _VTRACE_SDT_SITE(p, n, "", 0, 0, 0, 0, 0, 0)
#define _VTRACE_SDT_P1(p, n, a) _VTRACE_SDT_SITE(p, n, _VTRACE_SDT_A1, a, 0, 0, 0, 0, 0)
#define _VTRACE_SDT_P2(p, n, a, b) _VTRACE_SDT_SITE(p, n, _VTRACE_SDT_A2, a, b, 0, 0, 0, 0)
#define _VTRACE_SDT_P3(p, n, a, b, c) _VTRACE_SDT_SITE(p, n, _VTRACE_SDT_A3, a, b, c, 0, 0, 0)
#define _VTRACE_SDT_P4(p, n, a, b, c, d)                                       \
    _VTRACE_SDT_SITE(p, n, _VTRACE_SDT_A4, a, b, c, d, 0, 0)
#define _VTRACE_SDT_P5(p, n, a, b, c, d, e)                                    \
    _VTRACE_SDT_SITE(p, n, _VTRACE_SDT_A5, a, b, c, d, e, 0)
#define _VTRACE_SDT_P6(p, n, a, b, c, d, e, f)                                 \
    _VTRACE_SDT_SITE(p, n, _VTRACE_SDT_A6, a, b, c, d, e, f)

#define _VTRACE_SDT_COUNT(...) _VTRACE_SDT_COUNT_(0, ##__VA_ARGS__, 6, 5, 4, 3, 2, 1, 0)
#define _VTRACE_SDT_COUNT_(_0, _1, _2, _3, _4, _5, _6, n, ...) n
#define _VTRACE_SDT_CAT(a, b) _VTRACE_SDT_CAT_(a, b)
#define _VTRACE_SDT_CAT_(a, b) a##b

/* A probe site: provider and name are bare identifiers (sched, switch). */
#define VTRACE_PROBE(provider, name, ...)                                      \
    _VTRACE_SDT_CAT(_VTRACE_SDT_P, _VTRACE_SDT_COUNT(__VA_ARGS__))             \
    (provider, name, ##__VA_ARGS__)

#endif /* VTRACE_SDT_H */
