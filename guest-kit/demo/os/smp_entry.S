/*
 * SMP mode only: how an application processor gets from the STARTUP IPI
 * to C, and the entry stubs of the vectors the CPUs send each other.
 *
 * The STARTUP IPI starts an AP in real mode at CS = 0x1000 (vector 0x10),
 * IP 0, so smp.c copies ap_trampoline..ap_trampoline_end to 0x10000. The
 * copy runs position-dependent code for that address: a temporary GDT to
 * reach 32-bit protected mode, then the kernel's own page tables, EFER.LME
 * and GDT, and a far jump into ap_long in the kernel image proper.
 */
#define TRAMPOLINE 0x10000
#define AT(label) (TRAMPOLINE + (label) - ap_trampoline)

    .section .text
    .code16
    .globl ap_trampoline
ap_trampoline:
    cli
    cld
    movw %cs, %ax
    movw %ax, %ds
    lgdtl tramp_gdt_desc - ap_trampoline
    movl %cr0, %eax
    orl $0x1, %eax                /* PE */
    movl %eax, %cr0
    ljmpl $0x08, $AT(ap_pm32)

    .code32
ap_pm32:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    movl %cr4, %eax
    orl $0x20, %eax               /* PAE */
    movl %eax, %cr4
    movl $boot_pml4, %eax
    movl %eax, %cr3
    movl $0xC0000080, %ecx        /* EFER.LME */
    rdmsr
    orl $0x100, %eax
    wrmsr
    movl %cr0, %eax
    orl $0x80000001, %eax         /* PG | PE */
    movl %eax, %cr0
    lgdt AT(kernel_gdt_desc)
    ljmp $0x08, $ap_long

    .balign 8
tramp_gdt:
    .quad 0
    .quad 0x00CF9A000000FFFF      /* 0x08: flat 32-bit code */
    .quad 0x00CF92000000FFFF      /* 0x10: flat data */
tramp_gdt_end:
tramp_gdt_desc:
    .word tramp_gdt_end - tramp_gdt - 1
    .long AT(tramp_gdt)
kernel_gdt_desc:                  /* boot.S's GDT: null, code, data, TSS */
    .word 5 * 8 - 1
    .long boot_gdt
    .globl ap_trampoline_end
ap_trampoline_end:

    .code64
ap_long:
    movw $0x10, %ax
    movw %ax, %ds
    movw %ax, %es
    movw %ax, %ss
    xorw %ax, %ax
    movw %ax, %fs
    movw %ax, %gs
    movq ap_boot_stack(%rip), %rsp
    call ap_main
1:  cli
    hlt
    jmp 1b

/* The IPI vectors enter trap() like every other vector (entry.S). */
.macro ISR_IPI vec
    .globl isr\vec
isr\vec:
    pushq $0
    pushq $\vec
    jmp isr_common
.endm
ISR_IPI 240
ISR_IPI 241
ISR_IPI 255
