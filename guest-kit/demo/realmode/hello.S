/*
 * A tiny real-mode guest: prints a line on COM1, computes the sum 1..100
 * (5050) and exits through the hypercall port with status 5050 & 0xff = 186.
 * Loaded with `vtrace run --real-mode FILE --load-addr 0x7c00`.
 */
#include "vtrace.h"

    .code16
    .text
    .globl _start
_start:
    cli
    xorw %ax, %ax
    movw %ax, %ds
    movw %ax, %ss
    movw $0x7000, %sp
    movw $msg - _start + 0x7c00, %si
1:  lodsb
    testb %al, %al
    jz 2f
    movw $0x3f8, %dx
    outb %al, %dx
    jmp 1b
2:  xorl %eax, %eax
    movl $100, %ecx
3:  addl %ecx, %eax
    loop 3b
    movl %eax, %ebx               /* EXIT status */
    movl $VTRACE_CMD_EXIT, %eax
    movw $VTRACE_PORT, %dx
    inl %dx, %eax
    hlt
msg:
    .asciz "hello from real mode\r\n"
