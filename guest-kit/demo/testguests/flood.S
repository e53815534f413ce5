/*
 * Real-mode test guest that floods the host (load at 0x7c00): 20,000 LOG
 * calls whose text holds terminal escapes, a NUL and a forged line of
 * vtrace's own; 100,000 MARK calls with distinct ids; 20,000 unknown
 * hypercalls. Then exits with status 0.
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
    movw $VTRACE_PORT, %dx

    movl $20000, %edi
1:  movl $VTRACE_CMD_LOG, %eax
    movl $msg - _start + 0x7c00, %ebx
    movl $msg_end - msg, %ecx
    inl %dx, %eax
    decl %edi
    jnz 1b

    movl $100000, %edi
2:  movl $VTRACE_CMD_MARK, %eax
    movl %edi, %ebx                 /* a new id each time */
    movl $1, %ecx
    inl %dx, %eax
    decl %edi
    jnz 2b

    movl $20000, %edi
3:  movl $0x777, %eax               /* not a vtrace command */
    inl %dx, %eax
    decl %edi
    jnz 3b

    xorl %ebx, %ebx
    movl $VTRACE_CMD_EXIT, %eax
    inl %dx, %eax
    hlt
msg:
    .ascii "\033[2J\033[31mred\0\nvtrace: guest exited with status 0"
msg_end:
