/*
 * PVH test guest that floods MMIO: one REP STOSB of 500,000 bytes to an
 * address in the hole below 4 GiB that no device claims; exits 0. Every
 * iteration exits to the VMM, and one instruction of that many steps
 * must not make a tracer hold them all.
 */
#include "vtrace.h"
#include "vtrace-pvh.h"
VTRACE_PVH_NOTE(start)

    .text
    .code32
    .globl start
start:
    movl $0xfed00000, %edi
    movl $500000, %ecx
    movb $0x5a, %al
    rep stosb
    xorl %ebx, %ebx
    movl $VTRACE_CMD_EXIT, %eax
    movw $VTRACE_PORT, %dx
    inl %dx, %eax
    hlt
