/*
 * vtrace.h: the vtrace hypercall ABI for C guests.
 *
 * The constants mirror guest-kit/src/lib.rs (crate vtrace-guest), which is
 * the single source of truth; a host test fails if the two disagree.
 *
 * A hypercall is one 32-bit IN from VTRACE_PORT: EAX holds the command on
 * entry and the result on return, RBX/RCX/RSI/RDI hold arguments 0..3
 * (R8/R9 arguments 4 and 5 of VTRACE_CMD_PROBE, see vtrace-sdt.h).
 * Pointers are guest-virtual. Must run at CPL 0 (port I/O).
 */
#ifndef VTRACE_H
#define VTRACE_H

#define VTRACE_PORT            0x5654
#define VTRACE_ABI_VERSION     1
#define VTRACE_VERSION_MAGIC   0x56540000
#define VTRACE_LOG_MAX_LEN     4096

#define VTRACE_CMD_VERSION     0x00
#define VTRACE_CMD_EXIT        0x01
#define VTRACE_CMD_LOG         0x02
#define VTRACE_CMD_MARK        0x03
#define VTRACE_CMD_TRACE_START 0x10
#define VTRACE_CMD_TRACE_STOP  0x11
#define VTRACE_CMD_TRACE_REGION 0x12
#define VTRACE_CMD_PROBE       0x20

#define VTRACE_OK              0
#define VTRACE_UNKNOWN_COMMAND (-1)
#define VTRACE_BAD_ADDRESS     (-2)
#define VTRACE_BAD_LENGTH      (-3)
#define VTRACE_UNAVAILABLE     (-4)

#ifndef __ASSEMBLER__

static inline int vtrace_hypercall(unsigned int cmd, unsigned long a0,
                                   unsigned long a1, unsigned long a2,
                                   unsigned long a3)
{
    unsigned int ret;
    __asm__ volatile("inl %w1, %0"
                     : "=a"(ret)
                     : "Nd"((unsigned short)VTRACE_PORT), "0"(cmd), "b"(a0),
                       "c"(a1), "S"(a2), "D"(a3)
                     : "memory");
    return (int)ret;
}

static inline int vtrace_version(void)
{
    return vtrace_hypercall(VTRACE_CMD_VERSION, 0, 0, 0, 0);
}

static inline void vtrace_exit(unsigned int status)
{
    vtrace_hypercall(VTRACE_CMD_EXIT, status, 0, 0, 0);
}

static inline int vtrace_log(const char *text, unsigned long len)
{
    return vtrace_hypercall(VTRACE_CMD_LOG, (unsigned long)text, len, 0, 0);
}

static inline int vtrace_mark(unsigned long id, unsigned long value)
{
    return vtrace_hypercall(VTRACE_CMD_MARK, id, value, 0, 0);
}

static inline int vtrace_trace_start(unsigned long pass)
{
    return vtrace_hypercall(VTRACE_CMD_TRACE_START, pass, 0, 0, 0);
}

static inline int vtrace_trace_stop(unsigned long pass)
{
    return vtrace_hypercall(VTRACE_CMD_TRACE_STOP, pass, 0, 0, 0);
}

/* Start on the start_pass-th call, stop on the (start_pass + passes)-th:
 * one call at the top of a loop traces `passes` iterations. */
static inline int vtrace_trace_region(unsigned long start_pass, unsigned long passes)
{
    return vtrace_hypercall(VTRACE_CMD_TRACE_REGION, start_pass, passes, 0, 0);
}

#endif /* __ASSEMBLER__ */
#endif /* VTRACE_H */
