/*
 * PVH test guest that stores to MMIO (an address in the hole below 4 GiB
 * that no device claims): 100 single-byte MOV stores, each followed by an
 * `inc eax` that counts it, then a REP STOSB of 100 bytes; exits 0. Every
 * store exits to the VMM, and a tracer steps each as one instruction.
 */
#include "vtrace.h"
#include "vtrace-pvh.h"
VTRACE_PVH_NOTE(start)

    .text
    .code32
    .globl start
start:
    xorl %eax, %eax
    movl $0xfed00000, %edi
    movl $100, %ecx
1:  movb %al, (%edi)
    incl %eax
    loop 1b
    movl $100, %ecx
    rep stosb
    xorl %ebx, %ebx
    movl $VTRACE_CMD_EXIT, %eax
    movw $VTRACE_PORT, %dx
    inl %dx, %eax
    hlt
