/*
 * Real-mode test guest: each serialising or ordering instruction a
 * tracer must step over, each followed by an instruction that leaves a
 * mark of its own in a register, then exits with status 0. Load at
 * 0x7c00. Its trace is known instruction by instruction: every fence is
 * one step and the `inc` after it another.
 */
#include "vtrace.h"

    .code16
    .text
    .globl _start
_start:
    xorl %esi, %esi
    lfence
    incl %esi
    mfence
    incl %esi
    sfence
    incl %esi
    xorl %eax, %eax
    cpuid
    incl %esi
    wbinvd
    incl %esi
    invlpg (%si)
    incl %esi
    movl %cr0, %eax
    movl %eax, %cr0
    incl %esi
    movl %cr3, %eax
    movl %eax, %cr3
    incl %esi
    lfence
    lfence
    incl %esi
    xorl %ebx, %ebx
    movl $VTRACE_CMD_EXIT, %eax
    movw $VTRACE_PORT, %dx
    inl %dx, %eax
