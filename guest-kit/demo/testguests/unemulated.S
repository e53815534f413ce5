/*
 * PVH test guest that runs an instruction KVM's emulator lacks (POPCNT) at
 * CPL 0 in protected mode. On hosts where kernel code is emulated this ends
 * in an emulation failure; on hardware-virtualized hosts it runs, and the
 * guest exits with status 42 instead.
 */
#include "vtrace.h"
#include "vtrace-pvh.h"
VTRACE_PVH_NOTE(start)

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
