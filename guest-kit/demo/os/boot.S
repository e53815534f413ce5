/*
 * PVH entry: the VMM starts us in 32-bit protected mode, paging off, with
 * EBX pointing at the hvm_start_info structure. We build identity page
 * tables for the first 1 GiB (2 MiB pages), enter long mode and call kmain.
 */
#include "vtrace-pvh.h"

VTRACE_PVH_NOTE(pvh_start)

    .section .text.boot, "ax"
    .code32
    .globl pvh_start
pvh_start:
    cli
    cld
    movl %ebx, %esi               /* keep start_info for kmain */
    movl $__bss_start, %edi       /* zero .bss: page tables and stack live there */
    movl $__bss_end, %ecx
    subl %edi, %ecx
    xorl %eax, %eax
    rep stosb
    movl %esi, %edi               /* start_info becomes kmain's first argument */
    movl $boot_stack_top, %esp

    /* PML4[0] -> PDPT, PDPT[0] -> PD, PD: 512 x 2 MiB identity pages. */
    movl $boot_pdpt, %eax
    orl $0x3, %eax
    movl %eax, boot_pml4
    movl $boot_pd, %eax
    orl $0x3, %eax
    movl %eax, boot_pdpt
    xorl %ecx, %ecx
1:  movl %ecx, %eax
    shll $21, %eax
    orl $0x83, %eax               /* present, writable, 2 MiB */
    movl %eax, boot_pd(,%ecx,8)
    incl %ecx
    cmpl $512, %ecx
    jne 1b

    movl $boot_pml4, %eax
    movl %eax, %cr3
    movl %cr4, %eax
    orl $0x20, %eax               /* PAE */
    movl %eax, %cr4
    movl $0xC0000080, %ecx        /* EFER.LME */
    rdmsr
    orl $0x100, %eax
    wrmsr
    movl %cr0, %eax
    orl $0x80000001, %eax         /* PG | PE */
    movl %eax, %cr0

    lgdt boot_gdt_desc
    ljmp $0x08, $long_entry

    .code64
long_entry:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    xorw %ax, %ax
    movw %ax, %fs
    movw %ax, %gs
    movq $boot_stack_top, %rsp
    /* %rdi still holds the start_info address (zero-extended by the mov). */
    movl %edi, %edi
    call kmain
2:  hlt
    jmp 2b

    .section .data
    .balign 8
    .globl boot_gdt
boot_gdt:
    .quad 0
    .quad 0x00209A0000000000      /* 0x08: 64-bit code, DPL 0 */
    .quad 0x0000920000000000      /* 0x10: data */
    .quad 0, 0                    /* 0x18: TSS, filled by gdt_init */
boot_gdt_end:
boot_gdt_desc:
    .word boot_gdt_end - boot_gdt - 1
    .quad boot_gdt

    .section .bss
    .balign 4096
    .globl boot_pml4
boot_pml4:  .skip 4096
boot_pdpt:  .skip 4096
boot_pd:    .skip 4096
    .balign 16
boot_stack: .skip 16384
boot_stack_top:
