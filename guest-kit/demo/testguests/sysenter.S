/*
 * PVH test guest: SYSENTER at CPL 0 in protected mode, the MSRs pointing
 * it at the next label, which exits with status 2 (ESI counts the `inc`
 * before and after). The instruction KVM lets the CPU run on VT-x and
 * AMD-V and emulates elsewhere; a tracer steps it as one instruction that
 * jumps.
 */
#include "vtrace.h"
#include "vtrace-pvh.h"
VTRACE_PVH_NOTE(start)

    .text
    .code32
    .globl start
start:
    xorl %esi, %esi
    xorl %edx, %edx
    xorl %eax, %eax
    movw %cs, %ax
    movl $0x174, %ecx           /* IA32_SYSENTER_CS: this code segment */
    wrmsr
    incl %ecx                   /* IA32_SYSENTER_ESP */
    movl $0x1000, %eax
    wrmsr
    incl %ecx                   /* IA32_SYSENTER_EIP */
    movl $entered, %eax
    wrmsr
    incl %esi
    sysenter
    ud2

    .globl entered
entered:
    incl %esi
    movl %esi, %ebx
    movl $VTRACE_CMD_EXIT, %eax
    movw $VTRACE_PORT, %dx
    inl %dx, %eax
    hlt
