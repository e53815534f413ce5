/*
 * PVH test guest that takes an exception KVM raises, not the CPU: it
 * installs a #GP handler and reads an MSR that does not exist; KVM, which
 * intercepts RDMSR, injects the #GP, and the handler exits with status 13.
 * The guest loads its IDT itself, so a trace from its first instruction
 * starts before it has one.
 */
#include "vtrace.h"
#include "vtrace-pvh.h"
VTRACE_PVH_NOTE(start)

    .text
    .code32
    .globl start
start:
    /* IDT entry 13: a 32-bit interrupt gate to gp_handler. */
    movl $gp_handler, %eax
    movw %ax, idt + 13 * 8
    movw $0x08, idt + 13 * 8 + 2
    movw $0x8e00, idt + 13 * 8 + 4
    shrl $16, %eax
    movw %ax, idt + 13 * 8 + 6
    lidt idt_desc
    movl $0x1000, %esp
    movl $0x87654321, %ecx
    rdmsr
    ud2

    .globl gp_handler
gp_handler:
    movl $13, %ebx
    movl $VTRACE_CMD_EXIT, %eax
    movw $VTRACE_PORT, %dx
    inl %dx, %eax
    hlt

    .data
    .balign 8
idt:
    .fill 14, 8, 0
idt_desc:
    .word 14 * 8 - 1
    .long idt
