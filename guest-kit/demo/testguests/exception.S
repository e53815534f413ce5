/*
 * PVH test guest that takes an exception it handles: it installs a #UD
 * handler, executes UD2, and the handler exits with status 7. A trace of
 * it shows the exception; tracing autostops on #UD by default.
 */
#include "vtrace.h"
#include "vtrace-pvh.h"
VTRACE_PVH_NOTE(start)

    .text
    .code32
    .globl start
start:
    /* IDT entry 6: a 32-bit interrupt gate to ud_handler. */
    movl $ud_handler, %eax
    movw %ax, idt + 6 * 8
    movw $0x08, idt + 6 * 8 + 2
    movw $0x8e00, idt + 6 * 8 + 4
    shrl $16, %eax
    movw %ax, idt + 6 * 8 + 6
    lidt idt_desc
    movl $0x1000, %esp
    ud2
ud_handler:
    movl $7, %ebx
    movl $VTRACE_CMD_EXIT, %eax
    movw $VTRACE_PORT, %dx
    inl %dx, %eax
    hlt

    .data
    .balign 8
idt:
    .fill 8, 8, 0
idt_desc:
    .word 8 * 8 - 1
    .long idt
