// vtrace's engine library: Bochs's CPU with what it expects of a PC
// (memory, ports, the PC system's clock, its parameters, its logging)
// given by the host through vtb_host, and the instrumentation hooks that
// count steps. Bochs's own devices, GUI and configuration are not built:
// the host brings its own devices, and the few parameters the CPU reads
// are set here.

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>

#include "bochs.h"
#include "cpu/cpu.h"
#include "cpu/apic.h"
#include "cpu/decoder/ia_opcodes.h"
#include "gui/paramtree.h"
#include "iodev/iodev.h"
#include "memory/memory-bochs.h"
#include "pc_system.h"

#include "vtrace_bochs.h"

namespace {

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

// ---- What the CPU links against: globals of the PC around it.

BOCHSAPI BX_CPU_C **bx_cpu_array = nullptr;
BOCHSAPI Bit8u bx_cpu_count = 0;
BOCHSAPI bx_debug_t bx_dbg;
BOCHSAPI Bit32u apic_id_mask = 0xff;
bool simulate_xapic = true;

// ---- Logging: Bochs's messages go to the host.

logfunctions::logfunctions() : name(nullptr), prefix(nullptr), logio(nullptr) {
    for (int i = 0; i < N_LOGLEV; i++) onoff[i] = 0;
}
logfunctions::~logfunctions() {}
void logfunctions::put(const char *n, const char *p) {
    name = const_cast<char *>(n);
    prefix = const_cast<char *>(p);
}
void logfunctions::ldebug(const char *fmt, ...) {
    (void)fmt;
}
void logfunctions::info(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say(1, fmt, ap);
    va_end(ap);
}
void logfunctions::error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say(2, fmt, ap);
    va_end(ap);
}
void logfunctions::panic(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say(3, fmt, ap);
    va_end(ap);
    for (unsigned i = 0; i < cpu_count; i++) end_run(i, VTB_PANIC);
}
void logfunctions::fatal1(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say(3, fmt, ap);
    va_end(ap);
    for (unsigned i = 0; i < cpu_count; i++) end_run(i, VTB_PANIC);
}

static logfunctions general_log;
BOCHSAPI logfunc_t *genlog = &general_log;
BOCHSAPI logfunctions *pluginlog = &general_log;
logfunctions *siminterface_log = &general_log;

// ---- The parameters the CPU reads (Bochs's configuration is not built).

namespace {

// The CPU models in cpudb.h's order: the value of the model parameter.
#define bx_define_cpudb(model) vtb_cpudb_##model,
enum {
#include "cpudb.h"
    vtb_cpudb_last
};
#undef bx_define_cpudb

class Parameters : public bx_simulator_interface_c {
  public:
    bx_list_c *root = nullptr;
    unsigned next_id = 1000;
    unsigned gen_param_id() override { return next_id++; }
    bx_list_c *get_bochs_root() override { return root; }
    bx_list_c *get_statistics_root() override { return nullptr; }
    bx_param_c *get_param(const char *name, bx_param_c *base) override {
        (void)base;
        return root ? root->get_by_name(name) : nullptr;
    }
    bx_param_num_c *get_param_num(const char *name, bx_param_c *base) override {
        return dynamic_cast<bx_param_num_c *>(find(name, base));
    }
    bx_param_string_c *get_param_string(const char *name, bx_param_c *base) override {
        return dynamic_cast<bx_param_string_c *>(find(name, base));
    }
    bx_param_bool_c *get_param_bool(const char *name, bx_param_c *base) override {
        return dynamic_cast<bx_param_bool_c *>(find(name, base));
    }
    bx_param_enum_c *get_param_enum(const char *name, bx_param_c *base) override {
        return dynamic_cast<bx_param_enum_c *>(find(name, base));
    }

  private:
    bx_param_c *find(const char *name, bx_param_c *base) {
        (void)base;
        for (bx_param_c *p : all)
            if (p && strcmp(p->get_name(), name) == 0) return p;
        say_missing(name);
        return nullptr;
    }
    static void say_missing(const char *name) {
        if (host.log) {
            char text[256];
            snprintf(text, sizeof text, "the CPU asked for parameter %s, which the engine lacks", name);
            host.log(host.ctx, 3, text);
        }
    }

  public:
    bx_param_c *all[24] = {};
};

Parameters parameters;
const char *models[vtb_cpudb_last + 1];

// A parameter registered under its full dotted name (the CPU asks by it).
template <typename P>
P *add(P *p) {
    for (auto &slot : parameters.all)
        if (!slot) {
            slot = p;
            break;
        }
    return p;
}

void make_parameters(unsigned cpus) {
    parameters.root = new bx_list_c(nullptr, "bochs", "");
    for (int i = 0; i < vtb_cpudb_last; i++) models[i] = "model";
    models[vtb_cpudb_last] = nullptr;
    bx_param_c *r = parameters.root;
    add(new bx_param_enum_c(r, BXPN_CPU_MODEL, "", "", models, vtb_cpudb_corei5_lynnfield_750, 0));
    add(new bx_param_num_c(r, BXPN_CPU_NPROCESSORS, "", "", 1, 255, cpus));
    add(new bx_param_num_c(r, BXPN_CPU_NCORES, "", "", 1, 255, 1));
    add(new bx_param_num_c(r, BXPN_CPU_NTHREADS, "", "", 1, 255, 1));
    add(new bx_param_num_c(r, BXPN_SMP_QUANTUM, "", "", 1, 1000000, 1));
    add(new bx_param_bool_c(r, BXPN_CPUID_LIMIT_WINNT, "", "", 0));
    add(new bx_param_bool_c(r, BXPN_MWAIT_IS_NOP, "", "", 0));
    add(new bx_param_bool_c(r, BXPN_RESET_ON_TRIPLE_FAULT, "", "", 0));
    add(new bx_param_bool_c(r, BXPN_PORT_E9_HACK, "", "", 0));
    add(new bx_param_bool_c(r, BXPN_PORT_E9_HACK_ALL_RINGS, "", "", 0));
    add(new bx_param_bool_c(r, BXPN_IODEBUG_ALL_RINGS, "", "", 0));
    add(new bx_param_bool_c(r, BXPN_IGNORE_BAD_MSRS, "", "", 1));
    add(new bx_param_string_c(r, BXPN_CPU_ADD_FEATURES, "", "", "", 256));
    add(new bx_param_string_c(r, BXPN_CPU_EXCLUDE_FEATURES, "", "", "", 256));
    add(new bx_param_string_c(r, BXPN_CONFIGURABLE_MSRS_PATH, "", "", "", 256));
    add(new bx_param_string_c(r, BXPN_BRAND_STRING, "", "", "", 49));
}

}  // namespace

BOCHSAPI bx_simulator_interface_c *SIM = &parameters;
bx_list_c *root_param = nullptr;

// ---- Memory: the host's RAM, MMIO beyond it.

BOCHSAPI BX_MEM_C bx_mem;

BX_MEMORY_STUB_C::BX_MEMORY_STUB_C() {}
BX_MEMORY_STUB_C::~BX_MEMORY_STUB_C() {}
BX_MEM_C::BX_MEM_C() {}
BX_MEM_C::~BX_MEM_C() {}

Bit64u BX_MEMORY_STUB_C::get_memory_len() { return host.ram_len; }

Bit8u *BX_MEM_C::getHostMemAddr(BX_CPU_C *cpu, bx_phy_address addr, unsigned rw) {
    (void)cpu;
    (void)rw;
    // The CPU asks for a page's start (and ORs offsets into what it gets:
    // the RAM is page-aligned); an MMIO page has none (the CPU then goes
    // through readPhysicalPage and writePhysicalPage).
    if (!in_ram(addr & ~bx_phy_address(0xfff), 0x1000)) return nullptr;
    return host.ram + addr;
}

static void mmio_read(unsigned cpu, bx_phy_address addr, unsigned len, Bit8u *data) {
    while (len > 0) {
        unsigned n = len < 8 ? len : 8;
        Bit64u value = host.mmio_read ? host.mmio_read(host.ctx, cpu, addr, n) : ~Bit64u(0);
        memcpy(data, &value, n);
        addr += n, data += n, len -= n;
    }
}

static void mmio_write(unsigned cpu, bx_phy_address addr, unsigned len, const Bit8u *data) {
    while (len > 0) {
        unsigned n = len < 8 ? len : 8;
        Bit64u value = 0;
        memcpy(&value, data, n);
        if (host.mmio_write) host.mmio_write(host.ctx, cpu, addr, n, value);
        addr += n, data += n, len -= n;
    }
}

void BX_MEM_C::readPhysicalPage(BX_CPU_C *cpu, bx_phy_address addr, unsigned len, void *data) {
    if (in_ram(addr, len))
        memcpy(data, host.ram + addr, len);
    else
        mmio_read(cpu ? cpu->which_cpu() : 0, addr, len, static_cast<Bit8u *>(data));
}

void BX_MEM_C::writePhysicalPage(BX_CPU_C *cpu, bx_phy_address addr, unsigned len, void *data) {
    if (in_ram(addr, len))
        memcpy(host.ram + addr, data, len);
    else
        mmio_write(cpu ? cpu->which_cpu() : 0, addr, len, static_cast<Bit8u *>(data));
}

bool BX_MEM_C::dbg_fetch_mem(BX_CPU_C *cpu, bx_phy_address addr, unsigned len, Bit8u *buf) {
    (void)cpu;
    if (!in_ram(addr, len)) return false;
    memcpy(buf, host.ram + addr, len);
    return true;
}

// ---- Ports: the host's devices.

BOCHSAPI bx_devices_c bx_devices;

// The host's interrupt controllers, where the CPU acknowledges an
// external interrupt (its own local APIC is not the guest's).
namespace {
class HostInterrupts : public bx_pic_stub_c {
  public:
    Bit8u IAC() override;
};
HostInterrupts host_interrupts;
}  // namespace

bx_devices_c::bx_devices_c() {
    put("DEV", "DEV");
    pluginCmosDevice = &stubCmos;
    pluginDmaDevice = &stubDma;
    pluginHardDrive = &stubHardDrive;
    pluginPicDevice = &host_interrupts;
    pluginPitDevice = &stubPit;
    pluginSpeaker = &stubSpeaker;
    pluginVgaDevice = &stubVga;
#if BX_SUPPORT_APIC
    pluginIOAPIC = &stubIOAPIC;
#endif
    bulkIOHostAddr = nullptr;
    bulkIOQuantumsRequested = 0;
    bulkIOQuantumsTransferred = 0;
}
bx_devices_c::~bx_devices_c() {}

Bit32u bx_devices_c::inp(Bit16u addr, unsigned io_len) {
    return host.port_in ? host.port_in(host.ctx, running_cpu, addr, io_len) : 0xffffffff;
}

void bx_devices_c::outp(Bit16u addr, Bit32u value, unsigned io_len) {
    if (host.port_out) host.port_out(host.ctx, running_cpu, addr, io_len, value);
}

// No PCI device of Bochs's is built: the host has its own buses.
Bit32u bx_pci_device_c::pci_read_handler(Bit8u, unsigned) { return 0xffffffff; }

// Nor its GUI (the parameter tree asks whether there is one).
BOCHSAPI bx_gui_c *bx_gui = nullptr;

// ---- The PC system: its clock is the host's, so Bochs's timers never fire.

BOCHSAPI bx_pc_system_c bx_pc_system;

bx_pc_system_c::bx_pc_system_c() {
    put("SYS", "SYS");
    numTimers = 0;
    triggeredTimer = 0;
    currCountdown = currCountdownPeriod = 0x7fffffff;
    ticksTotal = 0;
    lastTimeUsec = usecSinceLast = 0;
    HRQ = false;
    enable_a20 = true;
    a20_mask = ~bx_phy_address(0);
    kill_bochs_request = false;
}

void bx_pc_system_c::countdownEvent() {
    ticksTotal += currCountdownPeriod;
    currCountdown = currCountdownPeriod;
}

int bx_pc_system_c::register_timer_ticks(void *, bx_timer_handler_t, Bit64u, bool, bool, const char *) {
    return numTimers++;
}
void bx_pc_system_c::activate_timer_ticks(unsigned, Bit64u, bool) {}
void bx_pc_system_c::deactivate_timer(unsigned) {}

void bx_pc_system_c::invlpg(bx_address addr) {
    for (unsigned i = 0; i < cpu_count; i++) BX_CPU(i)->TLB_invlpg(addr);
}

int bx_pc_system_c::Reset(unsigned type) {
    for (unsigned i = 0; i < cpu_count; i++) BX_CPU(i)->reset(type);
    return 0;
}

// ---- Instrumentation: a step is an instruction or a REP iteration.

namespace {

// A WRMSR to IA32_APIC_BASE is under way: once it has run, Bochs's own
// local APIC is switched off again.
bool apic_base_written;

// Bochs's own local APIC stays globally disabled, whatever IA32_APIC_BASE
// holds (the guest reads back what it wrote): the local APIC page is then
// MMIO like any other, and the host's local APIC answers it.
void host_apic(BX_CPU_C *c) {
    c->lapic->set_base(c->msr.apicbase & ~bx_phy_address(0xc00));
}

void set_intr(unsigned cpu, bool high) {
    if (high)
        BX_CPU(cpu)->raise_INTR();
    else
        BX_CPU(cpu)->clear_INTR();
}

// What the host answers for the instruction under way, per CPU: CPUID
// (of this leaf and subleaf) or the time stamp counter.
struct Asked {
    enum { NOTHING, CPUID, TSC } what;
    Bit32u leaf, subleaf;
};
Asked *asked;

// Iterations the REP string instruction under way has run, per CPU.
Bit64u *iterations;

void set_eax_edx(BX_CPU_C *c, Bit64u value) {
    c->set_reg64(BX_64BIT_REG_RAX, Bit32u(value));
    c->set_reg64(BX_64BIT_REG_RDX, value >> 32);
}

// An instruction that ran gives the host's answer where it has one.
void answer(unsigned cpu) {
    Asked question = asked[cpu];
    asked[cpu].what = Asked::NOTHING;
    BX_CPU_C *c = BX_CPU(cpu);
    if (question.what == Asked::TSC) {
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
    if (asked[cpu].what != Asked::NOTHING) answer(cpu);
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
void bx_instr_interrupt(unsigned, unsigned) {}
void bx_instr_exception(unsigned cpu, unsigned vector, unsigned error) {
    if (host.event) host.event(host.ctx, cpu, VTB_EVENT_EXCEPTION, vector, error);
}
void bx_instr_hwinterrupt(unsigned cpu, unsigned vector, Bit16u, bx_address) {
    if (host.event) host.event(host.ctx, cpu, VTB_EVENT_EXTERNAL, vector, 0);
}
void bx_instr_tlb_cntrl(unsigned, unsigned, bx_phy_address) {}
void bx_instr_cache_cntrl(unsigned, unsigned) {}
void bx_instr_prefetch_hint(unsigned, unsigned, unsigned, bx_address) {}
void bx_instr_clflush(unsigned, bx_address, bx_phy_address) {}
void bx_instr_before_execution(unsigned cpu, bxInstruction_c *i) {
    BX_CPU_C *c = BX_CPU(cpu);
    iterations[cpu] = 0;
    switch (i->getIaOpcode()) {
    case BX_IA_CPUID:
        asked[cpu] = {Asked::CPUID, Bit32u(c->get_reg64(BX_64BIT_REG_RAX)),
                      Bit32u(c->get_reg64(BX_64BIT_REG_RCX))};
        break;
    case BX_IA_RDTSC:
    case BX_IA_RDTSCP:
        asked[cpu] = {Asked::TSC, 0, 0};
        break;
    case BX_IA_RDMSR:
        if (Bit32u(c->get_reg64(BX_64BIT_REG_RCX)) == 0x10) asked[cpu] = {Asked::TSC, 0, 0};
        break;
    default:
        break;
    }
}
// A REP string instruction is a step per iteration, as the trap flag
// steps it: its end is no step of its own, unless it ran none.
void bx_instr_after_execution(unsigned cpu, bxInstruction_c *) {
    if (iterations[cpu] == 0) stepped(cpu);
}
void bx_instr_repeat_iteration(unsigned cpu, bxInstruction_c *) {
    iterations[cpu]++;
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

Bit8u HostInterrupts::IAC() {
    unsigned cpu = running_cpu;
    // The line falls with the acknowledge; the next step's answer raises
    // it again where another interrupt waits.
    BX_CPU(cpu)->clear_INTR();
    return host.acknowledge ? host.acknowledge(host.ctx, cpu) : 0xff;
}

// ---- The C ABI.

namespace {

void get_segment(BX_CPU_C *c, bx_segment_reg_t *s, vtb_segment *out) {
    out->base = s->cache.u.segment.base;
    out->limit = s->cache.u.segment.limit_scaled;
    out->selector = s->selector.value;
    out->attributes = (c->get_descriptor_h(&s->cache) >> 8) & 0xf0ff;
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
    if (bx_cpu_array || cpus == 0 || cpus > BX_MAX_SMP_THREADS_SUPPORTED) return -1;
    // The TLB keeps a page's host address and ORs the offset into it.
    if ((reinterpret_cast<uintptr_t>(given->ram) & 0xfff) != 0) return -2;
    host = *given;
    cpu_count = cpus;
    bx_cpu_count = cpus;
    make_parameters(cpus);
    bx_cpu_array = new BX_CPU_C *[cpus]();
    asked = new Asked[cpus]();
    iterations = new Bit64u[cpus]();
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

void vtb_get_state(unsigned cpu, vtb_state *out) {
    BX_CPU_C *c = BX_CPU(cpu);
    for (unsigned r = 0; r < 16; r++) out->gpr[r] = c->get_reg64(r);
    out->rip = c->get_instruction_pointer();
    out->rflags = c->read_eflags();
    for (unsigned s = 0; s < 6; s++) get_segment(c, &c->sregs[s], &out->seg[s]);
    get_segment(c, &c->ldtr, &out->seg[6]);
    get_segment(c, &c->tr, &out->seg[7]);
    out->gdt_base = c->gdtr.base;
    out->gdt_limit = c->gdtr.limit;
    out->idt_base = c->idtr.base;
    out->idt_limit = c->idtr.limit;
    out->cr0 = c->cr0.get32();
    out->cr2 = c->cr2;
    out->cr3 = c->cr3;
    out->cr4 = c->cr4.get32();
    out->efer = c->efer.get32();
    out->xcr0 = c->xcr0.get32();
    for (unsigned d = 0; d < 4; d++) out->dr[d] = c->dr[d];
    out->dr[4] = c->dr6.get32();
    out->dr[5] = c->dr7.get32();
    get_msrs(c, &out->msrs);
    get_fpu(c, &out->fpu);
    out->activity = c->activity_state;
}

void vtb_set_state(unsigned cpu, const vtb_state *in) {
    BX_CPU_C *c = BX_CPU(cpu);
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
    c->xcr0.set32(Bit32u(in->xcr0));
    for (unsigned d = 0; d < 4; d++) c->dr[d] = in->dr[d];
    c->dr6.set32(Bit32u(in->dr[4]));
    c->dr7.set32(Bit32u(in->dr[5]));
    set_msrs(c, &in->msrs);
    host_apic(c);
    set_fpu(c, &in->fpu);
    if (in->activity <= VTB_WAITING_FOR_SIPI) c->activity_state = in->activity;
    // What Bochs derives from those registers, derived again.
    c->TLB_flush();
    c->handleAlignmentCheck();
    c->handleCpuModeChange();
    c->handleSseModeChange();
    c->async_event |= 1;
}

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
    BX_CPU(cpu)->async_event |= 1;
    BX_CPU(cpu)->cpu_loop();
    bx_pc_system.kill_bochs_request = 0;
    // Events that came meanwhile are looked at again on the next run.
    BX_CPU(cpu)->async_event |= 1;
    *ran = steps_ran;
    if (c->activity_state == BX_CPU_C::BX_ACTIVITY_STATE_SHUTDOWN) return VTB_SHUTDOWN;
    return stop_reason;
}

}  // extern "C"
