/*
 * Real-mode test guest that takes the debug registers for itself before
 * the instruction a tracer breaks on: clears DR7, points DR0 elsewhere and
 * enables it, then sums 3 + 2 + 1 as count.S does and exits with status 6.
 * A VMM breakpoint (`--start-at`) on the loop must still fire: while the
 * VMM debugs the guest, KVM keeps the guest's DR writes to the guest.
 * Load at 0x7c00.
 */
#include "vtrace.h"

    .code16
    .text
    .globl _start
_start:
    xorl %eax, %eax
    movl %eax, %dr7
    movl $0x7c00, %eax
    movl %eax, %dr0
    movl $1, %eax
    movl %eax, %dr7
    xorl %eax, %eax
    movl $3, %ecx
1:  addl %ecx, %eax
    loop 1b
    movl %eax, %ebx
    movl $VTRACE_CMD_EXIT, %eax
    movw $VTRACE_PORT, %dx
    inl %dx, %eax
