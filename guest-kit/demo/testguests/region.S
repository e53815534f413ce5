/*
 * Real-mode test guest for the combined hypercall form: a loop of five
 * passes calls TRACE_REGION(2, 2) at its top, so passes 2 and 3 are traced.
 * Each pass sets ESI to its number. Exits with status 0. Load at 0x7c00.
 */
#include "vtrace.h"

    .code16
    .text
    .globl _start
_start:
    xorl %esi, %esi
    movw $VTRACE_PORT, %dx
pass:
    movl $VTRACE_CMD_TRACE_REGION, %eax
    movl $2, %ebx
    movl $2, %ecx
    inl %dx, %eax
    incl %esi
    cmpl $5, %esi
    jne pass
    xorl %ebx, %ebx
    movl $VTRACE_CMD_EXIT, %eax
    inl %dx, %eax
