/* The C ABI of vtrace's engine library: Bochs's CPU, run in-process on the
 * host's guest RAM, reaching the host's devices through the callbacks
 * below. The Rust binding mirrors this file; change both together and
 * bump VTB_ABI. */
#ifndef VTRACE_BOCHS_H
#define VTRACE_BOCHS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI's version: a library of another answers vtb_abi() with it,
 * and the binding refuses it. */
#define VTB_ABI 3

/* What the engine asks of its host. Every callback gets `ctx` back. */
typedef struct vtb_host {
    void *ctx;
    /* Guest RAM from guest-physical 0: the host's own mapping, aligned
     * to 4 KiB (Bochs ORs a page offset into a page's host address). An
     * access past `ram_len` goes to mmio_read/mmio_write. */
    uint8_t *ram;
    uint64_t ram_len;
    uint64_t (*mmio_read)(void *ctx, unsigned cpu, uint64_t gpa, unsigned len);
    void (*mmio_write)(void *ctx, unsigned cpu, uint64_t gpa, unsigned len, uint64_t value);
    uint32_t (*port_in)(void *ctx, unsigned cpu, uint16_t port, unsigned len);
    void (*port_out)(void *ctx, unsigned cpu, uint16_t port, unsigned len, uint32_t value);
    /* After each step: an instruction, or one iteration of a REP string
     * instruction (one with a count of zero is one step), as the trap
     * flag steps them. Answers VTB_STEP_* flags, what the host wants
     * now. */
    uint32_t (*step)(void *ctx, unsigned cpu);
    /* The CPU takes the external interrupt the host's INTR line raised:
     * its vector (the host's interrupt controllers acknowledge it). */
    uint8_t (*acknowledge)(void *ctx, unsigned cpu);
    /* CPUID of `leaf` and `subleaf` ran: nonzero where the host answers
     * it (EAX, EBX, ECX, EDX in `out`), as its CPU profile says; zero
     * leaves Bochs's model's answer. Asked before the step is told. */
    int (*cpuid)(void *ctx, unsigned cpu, uint32_t leaf, uint32_t subleaf, uint32_t out[4]);
    /* RDTSC, RDTSCP or RDMSR of IA32_TSC ran: nonzero where the host
     * gives the time stamp counter (`*tsc`, by its step clock); zero
     * leaves Bochs's. Asked before the step is told. */
    int (*tsc)(void *ctx, unsigned cpu, uint64_t *tsc);
    /* The CPU begins to deliver an event (enum vtb_event) of `vector`
     * (an exception's error code, where it pushes one, in `error`). An
     * instruction that faults is no step: its exception is the event.
     * Answers VTB_STEP_END where the run is to end once the event is
     * delivered, before the handler's first instruction (honoured for
     * exceptions; an external or software interrupt's step follows). */
    uint32_t (*event)(void *ctx, unsigned cpu, int kind, unsigned vector, uint32_t error);
    /* A message of the CPU's: level 0 debug, 1 info, 2 error, 3 panic
     * (the run stops). */
    void (*log)(void *ctx, int level, const char *text);
} vtb_host;

/* What the step callback answers. */
enum vtb_step_flags {
    /* The run ends after this step (VTB_STOP). */
    VTB_STEP_END = 1,
    /* The CPU's INTR line is high: an external interrupt waits, taken
     * (through `acknowledge`) when the CPU's IF allows. Clear: low. */
    VTB_STEP_INTR = 2,
};

/* What the CPU delivers. */
enum vtb_event {
    VTB_EVENT_EXTERNAL = 0,  /* an external interrupt (acknowledged) or NMI */
    VTB_EVENT_EXCEPTION = 1, /* an exception an instruction raised */
    VTB_EVENT_SOFTWARE = 2,  /* INT n, INT3, INTO or INT1 ran: its step follows */
};

/* What blocks interrupts after the last instruction (VMX's
 * interruptibility state). */
enum vtb_interruptibility {
    VTB_BLOCKED_BY_STI = 1,
    VTB_BLOCKED_BY_MOV_SS = 2,
};

/* A segment register with its hidden part. */
typedef struct vtb_segment {
    uint64_t base;
    uint32_t limit;
    uint16_t selector;
    /* The descriptor's attribute bits 40-47 and 52-55, as VMX's access
     * rights (type, S, DPL, P in 0-7; AVL, L, D/B, G in 12-15). */
    uint16_t attributes;
} vtb_segment;

/* The x87 and SSE state, in FXSAVE's order of registers. */
typedef struct vtb_fpu {
    uint16_t fcw, fsw;
    /* The full tag word (two bits a register, as FSTENV stores it). */
    uint16_t ftw;
    uint16_t fop;
    uint64_t fip, fdp;
    uint16_t fcs, fds;
    uint32_t mxcsr;
    /* ST(0) to ST(7): the 64-bit significand, then sign and exponent. */
    uint8_t st[8][16];
    uint8_t xmm[16][16];
} vtb_fpu;

/* The MSRs a kernel uses. */
typedef struct vtb_msrs {
    uint64_t star, lstar, cstar, fmask, kernel_gs_base;
    uint64_t sysenter_cs, sysenter_esp, sysenter_eip;
    uint64_t pat, apic_base, tsc_aux;
} vtb_msrs;

/* A CPU's architectural state, as a hand-over moves it. */
typedef struct vtb_state {
    /* RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8-R15. */
    uint64_t gpr[16];
    uint64_t rip, rflags;
    /* ES, CS, SS, DS, FS, GS, then LDTR and TR. */
    vtb_segment seg[8];
    uint64_t gdt_base, idt_base;
    uint16_t gdt_limit, idt_limit;
    uint64_t cr0, cr2, cr3, cr4, efer;
    uint64_t xcr0;
    /* DR0-DR3, DR6, DR7. */
    uint64_t dr[6];
    vtb_msrs msrs;
    vtb_fpu fpu;
    /* An enum vtb_activity. */
    uint32_t activity;
    /* Enum vtb_interruptibility bits: the shadow of an STI, MOV SS or
     * POP SS that just ran. */
    uint32_t interruptibility;
} vtb_state;

/* Where a CPU stands. */
enum vtb_activity {
    VTB_ACTIVE = 0,           /* it runs */
    VTB_HALTED = 1,           /* it executed HLT and waits for an interrupt */
    VTB_SHUT_DOWN = 2,        /* a triple fault stopped it */
    VTB_WAITING_FOR_SIPI = 3, /* an application processor before STARTUP */
};

/* Why vtb_run returned. */
enum vtb_stop {
    VTB_STEPS = 0, /* it ran the steps asked for */
    VTB_HALT = 1,  /* the CPU executed HLT */
    VTB_STOP = 2,  /* the host's step callback asked it to end */
    VTB_PANIC = 3,    /* the CPU met what it cannot go on from (log said what) */
    VTB_SHUTDOWN = 4, /* a triple fault shut the CPU down */
};

int vtb_abi(void);
/* Makes `cpus` CPUs over `host` (copied), in their reset state. A process
 * makes its CPUs once: a later call gives them a new host (a machine
 * after the last one is done with) and resets them, and must ask for as
 * many. 0 on success; -1 for a CPU count it cannot make (or another than
 * the first call's), -2 for RAM not aligned to 4 KiB. */
int vtb_create(const vtb_host *host, unsigned cpus);
/* The parts of a vtb_state that vtb_get_state and vtb_set_state move
 * (OR'd): the core changes at every step and is what a host reads then;
 * the rest moves at hand-overs. */
enum vtb_parts {
    /* gpr, rip, rflags, seg, gdt/idt, cr0-cr4, efer, msrs.apic_base,
     * activity, interruptibility */
    VTB_CORE = 1,
    /* xcr0, dr, the other msrs, fpu */
    VTB_REST = 2,
    VTB_ALL = 3,
};
void vtb_get_state(unsigned cpu, vtb_state *out, unsigned parts);
void vtb_set_state(unsigned cpu, const vtb_state *in, unsigned parts);
/* Inside a host callback: where the instruction under way begins (its
 * RIP, as vtb_get_state gives the RIP past it). */
uint64_t vtb_insn_start(unsigned cpu);
/* Inside the step callback: nonzero where the step is an iteration of a
 * REP string instruction. Its state then has RIP past the instruction
 * even where more iterations follow; the run's end puts RIP back where
 * the next iteration runs, as the trap flag shows it. */
int vtb_in_repeat(unsigned cpu);
/* The host wrote guest RAM at [gpa, gpa + len) behind the CPUs' back (an
 * interrupt frame it pushed, a stretch another engine ran): what they
 * decoded from there is dropped. A `len` of 0: all of RAM. */
void vtb_invalidate(uint64_t gpa, uint64_t len);
/* Raises (nonzero) or lowers CPU `cpu`'s INTR line between runs. */
void vtb_set_intr(unsigned cpu, int high);
/* Runs CPU `cpu` for at most `steps` steps; `*ran` says how many ran.
 * Returns an enum vtb_stop. A CPU halted with its INTR line low, or
 * with IF clear, does not run: VTB_HALT at once. */
int vtb_run(unsigned cpu, uint64_t steps, uint64_t *ran);

#ifdef __cplusplus
}
#endif

#endif
