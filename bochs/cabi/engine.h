// What the rooms of vtrace's engine library share: Bochs's headers, the
// host's callbacks, the run under way.
#ifndef VTRACE_ENGINE_H
#define VTRACE_ENGINE_H

#include <cstdarg>

#include "bochs.h"
#include "cpu/cpu.h"
#include "cpu/apic.h"
#include "cpu/decoder/ia_opcodes.h"
#include "gui/paramtree.h"
#include "iodev/iodev.h"
#include "memory/memory-bochs.h"
#include "pc_system.h"

#include "vtrace_bochs.h"

namespace vtb {

// The host, as vtb_create was given it.
extern vtb_host host;
extern unsigned cpu_count;
// The CPU a run is running (what ports and the interrupt acknowledge,
// which Bochs asks of no CPU in particular, are asked for).
extern unsigned running_cpu;
// Steps left in the current run, steps it ran, and why it ended.
extern Bit64u steps_left;
extern Bit64u steps_ran;
extern int stop_reason;

// A message of Bochs's to the host.
void say(int level, const char *fmt, va_list ap);
// Ends the run after the current step: the CPU loop returns at its next
// check of asynchronous events.
void end_run(unsigned cpu, int why);
// Whether [addr, addr + len) is the host's RAM.
bool in_ram(bx_phy_address addr, unsigned len);

// The parameters the CPU reads, for a machine of `cpus` CPUs (pc.cc).
void make_parameters(unsigned cpus);

// Bochs's own local APIC switched off (hooks.cc).
void host_apic(BX_CPU_C *c);
// CPU `cpu`'s INTR line (hooks.cc).
void set_intr(unsigned cpu, bool high);
// Whether the step being told is a REP iteration (hooks.cc).
bool in_repeat(unsigned cpu);
// What the hooks keep per CPU, for `cpus` CPUs (hooks.cc).
void make_hooks(unsigned cpus);

}  // namespace vtb

#endif
