/*
 * Real-mode test guest that waits for ever (load at 0x7c00): interrupts
 * on, no timer programmed, HLT in a loop. Only console input could wake
 * it; the VMM must still answer vtrace ctl and signals.
 */
    .code16
    .text
    .globl _start
_start:
    sti
1:  hlt
    jmp 1b
