// The instrumentation hooks: a step is an instruction or a REP string
// instruction's iteration, told to the host; what the host answers for
// CPUID and the time stamp counter; Bochs's local APIC kept off.

#include "engine.h"

using namespace vtb;

namespace {

// A WRMSR to IA32_APIC_BASE is under way: once it has run, Bochs's own
// local APIC is switched off again.
bool apic_base_written;

// The instruction under way, per CPU: what the host answers for it (CPUID
// of this leaf and subleaf, or the time stamp counter), and whether it is
// a REP string instruction that ran an iteration.
struct Underway {
    enum { NOTHING, CPUID, TSC } asks;
    Bit32u leaf, subleaf;
    bool repeated;
    // An exception or external interrupt is being delivered: the
    // interrupt() it calls is not a software interrupt.
    bool delivering;
};
Underway *underway;

void set_eax_edx(BX_CPU_C *c, Bit64u value) {
    c->set_reg64(BX_64BIT_REG_RAX, Bit32u(value));
    c->set_reg64(BX_64BIT_REG_RDX, value >> 32);
}

// An instruction that ran gives the host's answer where it has one.
void answer(unsigned cpu) {
    Underway question = underway[cpu];
    underway[cpu].asks = Underway::NOTHING;
    BX_CPU_C *c = BX_CPU(cpu);
    if (question.asks == Underway::TSC) {
        Bit64u tsc;
        if (host.tsc && host.tsc(host.ctx, cpu, &tsc)) set_eax_edx(c, tsc);
        return;
    }
    Bit32u out[4];
    if (!host.cpuid || !host.cpuid(host.ctx, cpu, question.leaf, question.subleaf, out)) return;
    static const unsigned regs[4] = {BX_64BIT_REG_RAX, BX_64BIT_REG_RBX, BX_64BIT_REG_RCX,
                                     BX_64BIT_REG_RDX};
    for (unsigned r = 0; r < 4; r++) c->set_reg64(regs[r], out[r]);
}

void stepped(unsigned cpu) {
    steps_ran++;
    if (underway[cpu].asks != Underway::NOTHING) answer(cpu);
    if (apic_base_written) {
        apic_base_written = false;
        host_apic(BX_CPU(cpu));
    }
    Bit32u wants = host.step ? host.step(host.ctx, cpu) : 0;
    set_intr(cpu, wants & VTB_STEP_INTR);
    if (wants & VTB_STEP_END) end_run(cpu, VTB_STOP);
    if (--steps_left == 0 && stop_reason == VTB_STEPS) end_run(cpu, VTB_STEPS);
}
}  // namespace

// Bochs's own local APIC stays globally disabled, whatever IA32_APIC_BASE
// holds (the guest reads back what it wrote): the local APIC page is then
// MMIO like any other, and the host's local APIC answers it.
void vtb::host_apic(BX_CPU_C *c) {
    c->lapic->set_base(c->msr.apicbase & ~bx_phy_address(0xc00));
}

void vtb::set_intr(unsigned cpu, bool high) {
    if (high)
        BX_CPU(cpu)->raise_INTR();
    else
        BX_CPU(cpu)->clear_INTR();
}

bool vtb::in_repeat(unsigned cpu) { return underway[cpu].repeated; }

void vtb::make_hooks(unsigned cpus) {
    underway = new Underway[cpus]();
}

void bx_instr_init_env(void) {}
void bx_instr_exit_env(void) {}
void bx_instr_initialize(unsigned) {}
void bx_instr_exit(unsigned) {}
void bx_instr_reset(unsigned, unsigned) {}
void bx_instr_hlt(unsigned cpu) { end_run(cpu, VTB_HALT); }
void bx_instr_mwait(unsigned, bx_phy_address, unsigned, Bit32u) {}
void bx_instr_debug_promt() {}
void bx_instr_debug_cmd(const char *) {}
void bx_instr_cnear_branch_taken(unsigned, bx_address, bx_address) {}
void bx_instr_cnear_branch_not_taken(unsigned, bx_address) {}
void bx_instr_ucnear_branch(unsigned, unsigned, bx_address, bx_address) {}
void bx_instr_far_branch(unsigned, unsigned, Bit16u, bx_address, Bit16u, bx_address) {}
void bx_instr_opcode(unsigned, bxInstruction_c *, const Bit8u *, unsigned, bool, bool) {}
// Every delivery calls interrupt(); one that no exception or external
// interrupt began is an instruction's (INT n, INT3, INTO, INT1).
void bx_instr_interrupt(unsigned cpu, unsigned vector) {
    if (underway[cpu].delivering) {
        underway[cpu].delivering = false;
        return;
    }
    if (host.event) host.event(host.ctx, cpu, VTB_EVENT_SOFTWARE, vector, 0);
}
// The run may end once the exception is delivered: exception() jumps back
// to the CPU loop, which looks at the request before the handler runs.
void bx_instr_exception(unsigned cpu, unsigned vector, unsigned error) {
    underway[cpu].delivering = true;
    if (!host.event) return;
    if (host.event(host.ctx, cpu, VTB_EVENT_EXCEPTION, vector, error) & VTB_STEP_END)
        end_run(cpu, VTB_STOP);
}
void bx_instr_hwinterrupt(unsigned cpu, unsigned vector, Bit16u, bx_address) {
    underway[cpu].delivering = true;
    if (host.event) host.event(host.ctx, cpu, VTB_EVENT_EXTERNAL, vector, 0);
}
void bx_instr_tlb_cntrl(unsigned, unsigned, bx_phy_address) {}
void bx_instr_cache_cntrl(unsigned, unsigned) {}
void bx_instr_prefetch_hint(unsigned, unsigned, unsigned, bx_address) {}
void bx_instr_clflush(unsigned, bx_address, bx_phy_address) {}
void bx_instr_before_execution(unsigned cpu, bxInstruction_c *i) {
    BX_CPU_C *c = BX_CPU(cpu);
    Underway &u = underway[cpu];
    u.repeated = false;
    switch (i->getIaOpcode()) {
    case BX_IA_CPUID:
        u.asks = Underway::CPUID;
        u.leaf = Bit32u(c->get_reg64(BX_64BIT_REG_RAX));
        u.subleaf = Bit32u(c->get_reg64(BX_64BIT_REG_RCX));
        break;
    case BX_IA_RDTSC:
    case BX_IA_RDTSCP:
        u.asks = Underway::TSC;
        break;
    case BX_IA_RDMSR:
        if (Bit32u(c->get_reg64(BX_64BIT_REG_RCX)) == 0x10) u.asks = Underway::TSC;
        break;
    default:
        break;
    }
}
// A REP string instruction is a step per iteration, as the trap flag
// steps it: its end is no step of its own, unless it ran none.
void bx_instr_after_execution(unsigned cpu, bxInstruction_c *) {
    if (!underway[cpu].repeated) stepped(cpu);
}
void bx_instr_repeat_iteration(unsigned cpu, bxInstruction_c *) {
    underway[cpu].repeated = true;
    stepped(cpu);
}
void bx_instr_inp(Bit16u, unsigned) {}
void bx_instr_inp2(Bit16u, unsigned, unsigned) {}
void bx_instr_outp(Bit16u, unsigned, unsigned) {}
void bx_instr_lin_access(unsigned, bx_address, bx_address, unsigned, unsigned, unsigned) {}
void bx_instr_phy_access(unsigned, bx_address, unsigned, unsigned, unsigned) {}
void bx_instr_wrmsr(unsigned, unsigned msr, Bit64u) {
    if (msr == 0x1b) apic_base_written = true;
}
void bx_instr_vmexit(unsigned, Bit32u, Bit64u) {}
