/*
 * PVH test guest that triple-faults: with an empty IDT, the #UD from UD2
 * finds no handler, nor do the #GP and the double fault that follow, so the
 * CPU shuts down.
 */
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
    lidt empty_idt
    ud2
    .balign 8
empty_idt:
    .word 0
    .long 0
