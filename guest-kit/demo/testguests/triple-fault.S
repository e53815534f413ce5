/*
 * PVH test guest that triple-faults: with an empty IDT, the #UD from UD2
 * finds no handler, nor do the #GP and the double fault that follow, so the
 * CPU shuts down.
 */
#include "vtrace-pvh.h"
VTRACE_PVH_NOTE(start)

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
