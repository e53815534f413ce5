// vtrace's engine library: Bochs's CPU with what it expects of a PC given
// by the host (pc.cc) and the hooks that count steps (hooks.cc), behind
// the C ABI of vtrace_bochs.h, here.

#include <cstdio>
#include <cstring>

#include "engine.h"

using namespace vtb;

namespace vtb {

vtb_host host;
unsigned cpu_count;
// The CPU a run is running (what ports and the interrupt acknowledge,
// which Bochs asks of no CPU in particular, are asked for).
unsigned running_cpu;

// Steps left in the current run, and why it ended.
Bit64u steps_left;
Bit64u steps_ran;
int stop_reason;

void say(int level, const char *fmt, va_list ap) {
    char text[1024];
    vsnprintf(text, sizeof text, fmt, ap);
    if (host.log) host.log(host.ctx, level, text);
}

// Ends the run after the current step: the CPU loop returns at its next
// check of asynchronous events.
void end_run(unsigned cpu, int why) {
    stop_reason = why;
    bx_pc_system.kill_bochs_request = 1;
    BX_CPU(cpu)->async_event |= 1;
}

bool in_ram(bx_phy_address addr, unsigned len) {
    return addr < host.ram_len && len <= host.ram_len - addr;
}

}  // namespace

// ---- The C ABI.

namespace {

void get_segment(bx_segment_reg_t *s, vtb_segment *out) {
    out->base = s->cache.u.segment.base;
    out->limit = s->cache.u.segment.limit_scaled;
    out->selector = s->selector.value;
    // get_descriptor_h()'s bits 8-15 and 20-23, composed here: it is a
    // call a segment, eight a step.
    const bx_descriptor_t &d = s->cache;
    bool long_bit = (d.segment || !d.valid) && d.u.segment.l;
    out->attributes = Bit16u((d.type & 0xf) | (d.segment << 4) | ((d.dpl & 3) << 5) |
                             (d.p << 7) | (d.u.segment.avl << 12) | (long_bit << 13) |
                             (d.u.segment.d_b << 14) | (d.u.segment.g << 15));
}

void get_fpu(BX_CPU_C *c, vtb_fpu *out) {
    const i387_t &x = c->the_i387;
    out->fcw = x.get_control_word();
    out->fsw = x.get_status_word();
    out->ftw = x.get_tag_word();
    out->fop = x.foo;
    out->fip = x.fip;
    out->fdp = x.fdp;
    out->fcs = x.fcs;
    out->fds = x.fds;
    out->mxcsr = c->mxcsr.mxcsr;
    for (unsigned i = 0; i < 8; i++) {
        // Bochs keeps the registers by number; FXSAVE by stack position.
        floatx80 r = x.st_space[(x.tos + i) & 7];
        memset(out->st[i], 0, 16);
        memcpy(out->st[i], &r.signif, 8);
        memcpy(out->st[i] + 8, &r.signExp, 2);
    }
    for (unsigned r = 0; r < 16; r++) memcpy(out->xmm[r], &c->vmm[r], 16);
}

void set_fpu(BX_CPU_C *c, const vtb_fpu *in) {
    i387_t &x = c->the_i387;
    x.cwd = in->fcw;
    x.tos = (in->fsw >> 11) & 7;
    x.swd = in->fsw & ~0x3800;
    x.twd = in->ftw;
    x.foo = in->fop;
    x.fip = in->fip;
    x.fdp = in->fdp;
    x.fcs = in->fcs;
    x.fds = in->fds;
    c->mxcsr.mxcsr = in->mxcsr;
    for (unsigned i = 0; i < 8; i++) {
        floatx80 r;
        memcpy(&r.signif, in->st[i], 8);
        memcpy(&r.signExp, in->st[i] + 8, 2);
        x.st_space[(x.tos + i) & 7] = r;
    }
    for (unsigned r = 0; r < 16; r++) memcpy(&c->vmm[r], in->xmm[r], 16);
}

void get_msrs(BX_CPU_C *c, vtb_msrs *out) {
    out->star = c->msr.star;
    out->lstar = c->msr.lstar;
    out->cstar = c->msr.cstar;
    out->fmask = c->msr.fmask;
    out->kernel_gs_base = c->msr.kernelgsbase;
    out->sysenter_cs = c->msr.sysenter_cs_msr;
    out->sysenter_esp = c->msr.sysenter_esp_msr;
    out->sysenter_eip = c->msr.sysenter_eip_msr;
    out->pat = c->msr.pat._u64;
    out->apic_base = c->msr.apicbase;
    out->tsc_aux = c->msr.tsc_aux;
}

void set_msrs(BX_CPU_C *c, const vtb_msrs *in) {
    c->msr.star = in->star;
    c->msr.lstar = in->lstar;
    c->msr.cstar = in->cstar;
    c->msr.fmask = Bit32u(in->fmask);
    c->msr.kernelgsbase = in->kernel_gs_base;
    c->msr.sysenter_cs_msr = Bit32u(in->sysenter_cs);
    c->msr.sysenter_esp_msr = in->sysenter_esp;
    c->msr.sysenter_eip_msr = in->sysenter_eip;
    c->msr.pat._u64 = in->pat;
    c->msr.apicbase = in->apic_base;
    c->msr.tsc_aux = Bit32u(in->tsc_aux);
}

void set_segment(BX_CPU_C *c, bx_segment_reg_t *s, const vtb_segment *in) {
    bool present = (in->attributes >> 7) & 1;
    c->set_segment_ar_data(s, present, in->selector, in->base, in->limit, in->attributes);
}

}  // namespace

extern "C" {

int vtb_abi(void) { return VTB_ABI; }

int vtb_create(const vtb_host *given, unsigned cpus) {
    if (cpus == 0 || cpus > BX_MAX_SMP_THREADS_SUPPORTED) return -1;
    // The TLB keeps a page's host address and ORs the offset into it.
    if ((reinterpret_cast<uintptr_t>(given->ram) & 0xfff) != 0) return -2;
    if (bx_cpu_array) {
        // Bochs's CPUs are made once a process: a machine after the first
        // has as many, over its own host, reset.
        if (cpus != cpu_count) return -1;
        host = *given;
        for (unsigned i = 0; i < cpus; i++) {
            BX_CPU(i)->reset(BX_RESET_HARDWARE);
            host_apic(BX_CPU(i));
        }
        flushICaches();
        return 0;
    }
    host = *given;
    cpu_count = cpus;
    bx_cpu_count = cpus;
    make_parameters(cpus);
    bx_cpu_array = new BX_CPU_C *[cpus]();
    make_hooks(cpus);
    // Every CPU made before any is reset: a reset flushes every CPU's
    // instruction cache.
    for (unsigned i = 0; i < cpus; i++) BX_CPU(i) = new BX_CPU_C(i);
    for (unsigned i = 0; i < cpus; i++) {
        BX_CPU(i)->initialize();
        BX_CPU(i)->sanity_checks();
    }
    for (unsigned i = 0; i < cpus; i++) {
        BX_CPU(i)->reset(BX_RESET_HARDWARE);
        host_apic(BX_CPU(i));
    }
    return 0;
}

void vtb_get_state(unsigned cpu, vtb_state *out, unsigned parts) {
    BX_CPU_C *c = BX_CPU(cpu);
    if (parts & VTB_CORE) {
        for (unsigned r = 0; r < 16; r++) out->gpr[r] = c->get_reg64(r);
        out->rip = c->get_instruction_pointer();
        out->rflags = c->read_eflags();
        for (unsigned s = 0; s < 6; s++) get_segment(&c->sregs[s], &out->seg[s]);
        get_segment(&c->ldtr, &out->seg[6]);
        get_segment(&c->tr, &out->seg[7]);
        out->gdt_base = c->gdtr.base;
        out->gdt_limit = c->gdtr.limit;
        out->idt_base = c->idtr.base;
        out->idt_limit = c->idtr.limit;
        out->cr0 = c->cr0.get32();
        out->cr2 = c->cr2;
        out->cr3 = c->cr3;
        out->cr4 = c->cr4.get32();
        out->efer = c->efer.get32();
        out->msrs.apic_base = c->msr.apicbase;
        out->activity = c->activity_state;
        out->interruptibility = 0;
        if (c->interrupts_inhibited(BX_INHIBIT_INTERRUPTS_BY_MOVSS))
            out->interruptibility = VTB_BLOCKED_BY_MOV_SS;
        else if (c->interrupts_inhibited(BX_INHIBIT_INTERRUPTS))
            out->interruptibility = VTB_BLOCKED_BY_STI;
    }
    if (parts & VTB_REST) {
        out->xcr0 = c->xcr0.get32();
        for (unsigned d = 0; d < 4; d++) out->dr[d] = c->dr[d];
        out->dr[4] = c->dr6.get32();
        out->dr[5] = c->dr7.get32();
        Bit64u apic_base = out->msrs.apic_base;
        get_msrs(c, &out->msrs);
        if (!(parts & VTB_CORE)) out->msrs.apic_base = apic_base;
        get_fpu(c, &out->fpu);
    }
}

void vtb_set_state(unsigned cpu, const vtb_state *in, unsigned parts) {
    BX_CPU_C *c = BX_CPU(cpu);
    if (parts & VTB_CORE) {
        for (unsigned r = 0; r < 16; r++) c->set_reg64(r, in->gpr[r]);
        c->gen_reg[BX_64BIT_REG_RIP].rrx = in->rip;
        c->prev_rip = in->rip;
        c->setEFlags(Bit32u(in->rflags));
        c->cr0.set32(Bit32u(in->cr0));
        c->cr2 = in->cr2;
        c->cr3 = in->cr3;
        c->cr4.set32(Bit32u(in->cr4));
        c->efer.set32(Bit32u(in->efer));
        for (unsigned s = 0; s < 6; s++) set_segment(c, &c->sregs[s], &in->seg[s]);
        set_segment(c, &c->ldtr, &in->seg[6]);
        set_segment(c, &c->tr, &in->seg[7]);
        c->gdtr.base = in->gdt_base;
        c->gdtr.limit = in->gdt_limit;
        c->idtr.base = in->idt_base;
        c->idtr.limit = in->idt_limit;
        c->msr.apicbase = in->msrs.apic_base;
        host_apic(c);
        if (in->activity <= VTB_WAITING_FOR_SIPI) c->activity_state = in->activity;
        // A shadow covers the boundary before the next instruction only:
        // interrupts_inhibited() holds while the count of instructions is
        // at most inhibit_icount, and the next one's is the count now.
        c->inhibit_mask = 0;
        c->inhibit_icount = 0;
        if (in->interruptibility & VTB_BLOCKED_BY_MOV_SS)
            c->inhibit_mask = BX_INHIBIT_INTERRUPTS_BY_MOVSS;
        else if (in->interruptibility & VTB_BLOCKED_BY_STI)
            c->inhibit_mask = BX_INHIBIT_INTERRUPTS;
        if (c->inhibit_mask) c->inhibit_icount = c->get_icount();
    }
    if (parts & VTB_REST) {
        c->xcr0.set32(Bit32u(in->xcr0));
        for (unsigned d = 0; d < 4; d++) c->dr[d] = in->dr[d];
        c->dr6.set32(Bit32u(in->dr[4]));
        c->dr7.set32(Bit32u(in->dr[5]));
        Bit64u apic_base = c->msr.apicbase;
        set_msrs(c, &in->msrs);
        // IA32_APIC_BASE is the core's.
        if (!(parts & VTB_CORE)) c->msr.apicbase = apic_base;
        host_apic(c);
        set_fpu(c, &in->fpu);
    }
    // What Bochs derives from those registers, derived again.
    c->TLB_flush();
    c->handleAlignmentCheck();
    c->handleCpuModeChange();
    c->handleSseModeChange();
    c->async_event |= 1;
}

void vtb_invalidate(uint64_t gpa, uint64_t len) {
    if (len == 0 || len > host.ram_len) {
        flushICaches();
        return;
    }
    for (uint64_t page = gpa & ~uint64_t(0xfff); page < gpa + len; page += 0x1000) {
        if (!in_ram(page, 1)) break;
        pageWriteStampTable.decWriteStamp(page);
    }
}

int vtb_in_repeat(unsigned cpu) { return in_repeat(cpu); }

uint64_t vtb_insn_start(unsigned cpu) { return BX_CPU(cpu)->prev_rip; }

void vtb_set_intr(unsigned cpu, int high) { set_intr(cpu, high != 0); }

int vtb_run(unsigned cpu, uint64_t steps, uint64_t *ran) {
    steps_ran = 0;
    *ran = 0;
    if (steps == 0) return VTB_STEPS;
    BX_CPU_C *c = BX_CPU(cpu);
    // A halted CPU would wait inside the CPU loop for an interrupt that
    // only the host can raise: the host waits instead.
    if (c->activity_state == BX_CPU_C::BX_ACTIVITY_STATE_SHUTDOWN) return VTB_SHUTDOWN;
    if (c->activity_state != BX_CPU_C::BX_ACTIVITY_STATE_ACTIVE &&
        !(c->is_pending(BX_EVENT_PENDING_INTR) && c->get_IF()))
        return VTB_HALT;
    running_cpu = cpu;
    steps_left = steps;
    stop_reason = VTB_STEPS;
    bx_pc_system.kill_bochs_request = 0;
    // Events that came since the last run (the INTR line, a new state) are
    // looked at before the first instruction.
    c->async_event |= 1;
    c->cpu_loop();
    bx_pc_system.kill_bochs_request = 0;
    *ran = steps_ran;
    if (c->activity_state == BX_CPU_C::BX_ACTIVITY_STATE_SHUTDOWN) return VTB_SHUTDOWN;
    return stop_reason;
}

}  // extern "C"
