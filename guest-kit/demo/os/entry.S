/*
 * Interrupt and exception entry. Every vector pushes a uniform frame
 * (vector, error code, then the CPU's iret frame) and enters isr_common,
 * which saves the general registers and calls trap(frame). trap returns
 * the frame to resume, which is how the scheduler switches tasks.
 */
    .text
    .code64

.macro ISR_NOERR vec
    .globl isr\vec
isr\vec:
    pushq $0
    pushq $\vec
    jmp isr_common
.endm

.macro ISR_ERR vec
    .globl isr\vec
isr\vec:
    pushq $\vec
    jmp isr_common
.endm

ISR_NOERR 0
ISR_NOERR 1
ISR_NOERR 2
ISR_NOERR 3
ISR_NOERR 4
ISR_NOERR 5
ISR_NOERR 6
ISR_NOERR 7
ISR_ERR   8
ISR_NOERR 9
ISR_ERR   10
ISR_ERR   11
ISR_ERR   12
ISR_ERR   13
ISR_ERR   14
ISR_NOERR 15
ISR_NOERR 16
ISR_ERR   17
ISR_NOERR 18
ISR_NOERR 19
ISR_NOERR 20
ISR_ERR   21
.irp v, 22,23,24,25,26,27,28,29,30,31
ISR_NOERR \v
.endr
.irp v, 32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47
ISR_NOERR \v
.endr

    .globl isr_common
isr_common:
    pushq %rax
    pushq %rbx
    pushq %rcx
    pushq %rdx
    pushq %rsi
    pushq %rdi
    pushq %rbp
    pushq %r8
    pushq %r9
    pushq %r10
    pushq %r11
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, %rdi
    call trap
    movq %rax, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %r11
    popq %r10
    popq %r9
    popq %r8
    popq %rbp
    popq %rdi
    popq %rsi
    popq %rdx
    popq %rcx
    popq %rbx
    popq %rax
    addq $16, %rsp                /* vector and error code */
    iretq

/*
 * yield_trap: called like a function, enters the kernel as if an interrupt
 * had arrived at the return address. INT n cannot be used in long mode on
 * every host vtrace runs on, so a task gives up the CPU this way.
 */
    .globl yield_trap
yield_trap:
    pushfq
    cli
    popq %r11                     /* flags, with the caller's IF */
    popq %rax                     /* return address */
    movq %rsp, %rcx               /* stack pointer after return */
    pushq $0x10
    pushq %rcx
    pushq %r11
    pushq $0x08
    pushq %rax
    pushq $0
    pushq $0x80                   /* VEC_YIELD */
    jmp isr_common

    .section .rodata
    .balign 8
    .globl isr_table
isr_table:
.irp v, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47
    .quad isr\v
.endr
