// What Bochs's CPU expects of a PC, given by the host: the globals around
// it, logging, the parameters it reads (Bochs's configuration is not
// built), memory over the host's RAM with MMIO beyond it, ports and the
// interrupt acknowledge to the host's devices, and a PC system whose
// timers never fire (the clock is the host's). Bochs's own devices and
// GUI are not built.

#include <cstdio>
#include <cstring>

#include "engine.h"

using namespace vtb;

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

}  // namespace

void vtb::make_parameters(unsigned cpus) {
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
    if (in_ram(addr, len)) {
        // Code decoded from these bytes is stale now (the CPU's fast
        // writes say so themselves; this is the slow path's, a TLB miss's
        // first write among them).
        pageWriteStampTable.decWriteStamp(addr, len);
        memcpy(host.ram + addr, data, len);
        return;
    }
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

Bit8u HostInterrupts::IAC() {
    unsigned cpu = running_cpu;
    // The line falls with the acknowledge; the next step's answer raises
    // it again where another interrupt waits.
    BX_CPU(cpu)->clear_INTR();
    return host.acknowledge ? host.acknowledge(host.ctx, cpu) : 0xff;
}
