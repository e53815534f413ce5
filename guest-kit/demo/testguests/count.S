/*
 * Real-mode test guest with a known instruction sequence, for checking a
 * trace step by step: sums 3 + 2 + 1 with LOOP, then exits with status 6.
 * Load at 0x7c00.
 */
#include "vtrace.h"

    .code16
    .text
    .globl _start
_start:
    xorl %eax, %eax
    movl $3, %ecx
1:  addl %ecx, %eax
    loop 1b
    movl %eax, %ebx
    movl $VTRACE_CMD_EXIT, %eax
    movw $VTRACE_PORT, %dx
    inl %dx, %eax
