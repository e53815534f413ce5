/*
 * PVH test guest that runs an instruction KVM's emulator lacks (POPCNT) at
 * CPL 0 in protected mode. On hosts where kernel code is emulated this ends
 * in an emulation failure; on hardware-virtualized hosts it runs, and the
 * guest exits with status 42 instead.
 */
#include "vtrace.h"

    .section .note.Xen, "a", @note
    .balign 4
    .long 4, 4, 18
    .asciz "Xen"
    .balign 4
    .long start

    .text
    .code32
    .globl start
start:
    movl $0xff, %ecx
    popcntl %ecx, %eax
    movl $VTRACE_CMD_EXIT, %eax
    movl $42, %ebx
    movw $VTRACE_PORT, %dx
    inl %dx, %eax
    hlt
