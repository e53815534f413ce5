//! `vtrace run`'s options.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use vtrace_vmm::ClockMode;

use vtrace_session::{parse_address, parse_location, CaptureRequest, Location};

use crate::units::{parse_capture, parse_size};

/// CPUID profile presented to the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CpuArg {
    /// One fixed CPU, the same on every host, so traces match across hosts:
    /// an AMD64 of QEMU's qemu64 signature, SSE2, no APIC, no XSAVE, no
    /// RDRAND (`vtrace doctor` says if this host lacks any of it).
    Baseline,
    /// Pass the host's KVM-supported set through (real VT-x/AMD-V hosts).
    Host,
}

/// What runs the guest's instructions while it is traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EngineArg {
    /// KVM single-steps the guest with the trap flag: an exit an
    /// instruction. Needs nothing but KVM.
    Step,
    /// Bochs's CPU runs the traced stretches in-process, on the guest's
    /// RAM and vtrace's devices, handed over from KVM where tracing starts
    /// and back where it stops: the same trace, without an exit an
    /// instruction. Needs the engine's library (scripts/engine.sh builds
    /// it; `vtrace doctor` says whether it is there). With `--cpus` the
    /// CPUs take turns on it in stepping's order.
    Bochs,
}

impl From<EngineArg> for vtrace_vmm::EngineKind {
    fn from(arg: EngineArg) -> Self {
        match arg {
            EngineArg::Step => vtrace_vmm::EngineKind::Step,
            EngineArg::Bochs => vtrace_vmm::EngineKind::Bochs,
        }
    }
}

fn parse_segment_size(text: &str) -> Result<u64, String> {
    let size = parse_size(text)?;
    if (64 << 10..=64 << 20).contains(&size) && size % 4096 == 0 {
        Ok(size)
    } else {
        Err(format!(
            "'{text}': a segment is 64K to 64M, a multiple of 4K"
        ))
    }
}

/// Exception vectors that stop tracing (one value, not a repeated flag).
#[derive(Clone, Debug)]
pub struct Autostop(pub Vec<u8>);

fn parse_autostop(text: &str) -> Result<Autostop, String> {
    vtrace_trap::parse_autostop(text).map(Autostop)
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Kernel to boot: a Linux bzImage, a 64-bit vmlinux ELF, or a PVH ELF.
    /// Without it (and without --real-mode) the built-in demo OS boots.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "real_mode",
        help_heading = "Guest"
    )]
    pub kernel: Option<PathBuf>,

    /// Initial ramdisk for the kernel.
    #[arg(long, value_name = "FILE", requires = "kernel", help_heading = "Guest")]
    pub initrd: Option<PathBuf>,

    /// Added to the kernel command line (after the default one, or after
    /// --cmdline's)
    #[arg(
        long,
        value_name = "STRING",
        conflicts_with = "real_mode",
        help_heading = "Guest",
        long_help = append_help()
    )]
    pub append: Option<String>,

    /// The whole kernel command line, in place of the default (which keeps
    /// Linux on what vtrace emulates and the baseline CPU offers: see
    /// --append's help for it)
    #[arg(
        long,
        value_name = "STRING",
        conflicts_with = "real_mode",
        help_heading = "Guest"
    )]
    pub cmdline: Option<String>,

    /// Boot a raw 16-bit image in real mode instead of a kernel.
    #[arg(long, value_name = "FILE", help_heading = "Guest")]
    pub real_mode: Option<PathBuf>,

    /// Where to load the --real-mode image (hex with 0x, or decimal).
    #[arg(long, value_name = "ADDR", default_value = "0x7c00", value_parser = parse_address, requires = "real_mode", help_heading = "Guest")]
    pub load_addr: u64,

    /// Guest RAM, e.g. 256M, 4G (reserved lazily: only touched pages cost).
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_size, help_heading = "Guest")]
    pub memory: u64,

    /// CPUID profile.
    #[arg(long, value_enum, default_value_t = CpuArg::Baseline, help_heading = "Guest")]
    pub cpu: CpuArg,

    /// CPUs of the guest. Above 1 the machine gets a local APIC per CPU
    /// and an I/O APIC, an ACPI MADT listing them, CPU 0 starts the others
    /// with INIT and STARTUP IPIs, the built-in demo OS runs its SMP mode
    /// (on up to 16 CPUs), and Linux's default command line keeps the
    /// local APICs and the I/O APIC (no `nolapic noapic`). Untraced, each
    /// CPU runs on a host thread of its own; while tracing (or with a
    /// breakpoint armed) they take turns, an instruction a turn (two at
    /// once where they may: see --serial-steps). A real-mode image runs
    /// on one CPU only.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=i64::from(vtrace_vmm::MAX_CPUS)), help_heading = "Guest")]
    pub cpus: u8,

    /// Do not read stdin or change the terminal; the guest's output is
    /// still shown. For scripts.
    #[arg(long, help_heading = "Console")]
    pub no_input: bool,

    /// Print nothing of vtrace's own (boot line, summary); only the guest.
    #[arg(short, long, help_heading = "Console")]
    pub quiet: bool,

    /// With --no-input (and without --quiet): a status line on stderr
    /// every INTERVAL (the steps recorded, the disk's fill, virtual time,
    /// exits per second; what Ctrl-A s shows; untraced also what tracing
    /// waits for and where the guest is, at its next exit); 0s for none.
    #[arg(long, value_name = "INTERVAL", default_value = "10s", value_parser = crate::units::parse_interval, help_heading = "Console")]
    pub progress: std::time::Duration,

    /// How the guest's clock (PIT, RTC) follows host time: `wall`,
    /// `prescale:N` (host time divided by N), or `steps[:NS]` (while tracing,
    /// each instruction advances time NS nanoseconds, default 1: traces are
    /// deterministic). Default: `steps:1` with --trace, else `wall`.
    #[arg(long, value_name = "MODE", value_parser = ClockMode::parse, help_heading = "Clock")]
    pub clock: Option<ClockMode>,

    /// Trace from the first instruction (also: Ctrl-A t, hypercalls).
    #[arg(long, help_heading = "Tracing")]
    pub trace: bool,

    /// Trace disk to write (a file, or a block device; default vtrace.vtd
    /// wherever a run traces, captures, probes or peeps). Given alone,
    /// tracing waits for Ctrl-A t or a hypercall. An earlier trace there
    /// is replaced; any other file is not, without --force.
    #[arg(long, value_name = "PATH", help_heading = "Trace disk")]
    pub disk: Option<PathBuf>,

    /// Replace the file at --disk even if it is not a trace.
    #[arg(long, help_heading = "Trace disk")]
    pub force: bool,

    /// Room reserved for the trace disk while tracing (a block device
    /// keeps its own size). A trace that ends cleanly is cut back to what
    /// it holds.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_size, help_heading = "Trace disk")]
    pub disk_size: u64,

    /// Size at which the trace is cut into segments, each compressed and
    /// checked on its own (64K to 64M, a multiple of 4K).
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = parse_segment_size, help_heading = "Trace disk")]
    pub segment_size: u64,

    /// When the disk is full, overwrite the oldest segments (keep the end)
    /// instead of stopping (keep the beginning).
    #[arg(long, help_heading = "Trace disk")]
    pub wrap: bool,

    /// What runs the guest while it is traced.
    #[arg(long, value_enum, default_value_t = EngineArg::Step, help_heading = "Tracing")]
    pub engine: EngineArg,

    /// Stop tracing once the trace holds this many steps (in all its
    /// windows); tracing does not start again after.
    #[arg(long, value_name = "N", help_heading = "Tracing")]
    pub max_steps: Option<u64>,

    /// Start tracing when execution reaches this place (a hardware
    /// breakpoint): a linear address (0x100000), a routine of the
    /// kernel's symbols, found as `vtrace analyze` finds them
    /// (start_kernel, schedule+0x10), or PROGRAM:ROUTINE, a routine of a
    /// user program linked at a fixed address (vtprog:main), found by name
    /// or path in the --initrd, else as a file on this host; it fires
    /// only in tasks running that program, where the kernel's tasks can be
    /// read.
    #[arg(long, value_name = "WHERE", value_parser = parse_location, help_heading = "Triggers")]
    pub start_at: Option<Location>,

    /// Record the memory values each step loads and stores where its
    /// registers do not give them (arithmetic on memory, compares, atomics
    /// such as lock xadd and cmpxchg, movs): read from guest memory through
    /// its page tables, loads before the instruction runs and stores after
    /// it. The export's read_values and write_values and the listing's
    /// --values then show them. Costs time at every such step and trace
    /// room.
    #[arg(long, help_heading = "Tracing")]
    pub record_values: bool,

    /// End the run when tracing stops (by --max-steps, --stop-at, the
    /// guest, the hotkey or vtrace ctl) instead of letting the guest run
    /// on; exit status 0.
    #[arg(long, help_heading = "Tracing")]
    pub exit_after_trace: bool,

    /// With --cpus above 1, step one CPU at a time while tracing. By
    /// default, where the next steps of two CPUs write no memory (nor set
    /// a page's accessed bit) and read only RAM, the two run at once on
    /// two host threads: neither can see the other, so the trace is the
    /// same as one step after the other, only sooner. That needs a host
    /// core per guest CPU, and pauses by itself where the host's cores are
    /// busy. This switch turns it off, to compare or to measure.
    #[arg(long, help_heading = "Tracing")]
    pub serial_steps: bool,

    /// Count the guest's own requests to start and stop tracing (its
    /// TRACE_START, TRACE_STOP and TRACE_REGION hypercalls) instead of
    /// obeying them: for probes or peeping without the stretches a guest
    /// asks to trace (the demo OS traces part of one task itself).
    #[arg(long, help_heading = "Tracing")]
    pub ignore_guest_tracing: bool,

    /// Stop tracing when execution reaches this place (as --start-at).
    #[arg(long, value_name = "WHERE", value_parser = parse_location, help_heading = "Triggers")]
    pub stop_at: Option<Location>,

    /// Copy guest memory into the trace each time execution reaches a
    /// place: `WHERE:REGISTER:LENGTH[:NAME]` takes LENGTH bytes (up to 4096)
    /// at the address REGISTER (rax ... r15) holds, before the instruction
    /// at WHERE runs (a place as --start-at takes it), e.g. kprintf:rdi:64.
    /// Bytes on pages that are not present are skipped, and the trace says
    /// so. Repeatable, up to 30. Taken at every step while tracing; while
    /// not, through the CPU's breakpoints, as many places as they have room
    /// for, where the host lets breakpoints reach vtrace. Needs a trace
    /// disk (--disk, default vtrace.vtd); `vtrace analyze captures` lists
    /// them.
    #[arg(long = "capture", value_name = "CAPTURE", value_parser = parse_capture, help_heading = "Probes, captures and peeping")]
    pub captures: Vec<CaptureRequest>,

    /// Trace each call of a routine, from its first instruction until it
    /// returns to its caller, its callees and the interrupts taken
    /// meanwhile included, and run untraced elsewhere (a place as
    /// --start-at takes it, e.g. page_fault). Where the CPU leaves the
    /// routine's task inside a call (the scheduler runs another), the
    /// vCPU is still stepped, to see the return, but nothing is recorded
    /// until the task runs again; a routine that never returns (a task's
    /// entry) keeps its window open to the end. Repeatable, as many as the
    /// CPU's 4 breakpoints hold (one fewer with --start-at); the summary
    /// says what each routine's windows came to. With several CPUs, a
    /// window holds the steps of the CPU that made the call, one window
    /// at a time (the summary counts the calls other CPUs made meanwhile).
    #[arg(
        long = "trace-function",
        value_name = "ROUTINE",
        value_parser = parse_location,
        conflicts_with = "trace", help_heading = "Triggers")]
    pub trace_functions: Vec<Location>,

    /// Enable probes: static probes compiled into the kernel by pattern
    /// (sched:switch, 'sched:*'; `vtrace probes list` lists them), whose
    /// semaphores are set at boot; or fn:ROUTINE, which fires on entry to
    /// a routine of the kernel's symbols with its six argument registers
    /// (a place as --start-at takes it; while tracing is off through the
    /// CPU's breakpoints, which hold 4 with --trace-function and
    /// --start-at); or a typed fn: probe, 'fn:ROUTINE(dfd,
    /// filename:string, how->flags)', whose values are read by the
    /// parameters' names and types in the kernel's BTF (arg1 to arg6
    /// without it; types string, u8..u64, s8..s64, x); or fnret:ROUTINE,
    /// which fires where each call returns with its return value and
    /// steps since the entry (while tracing is off, through breakpoints at
    /// the entry and the return address, with the host's ns instead,
    /// where debug registers are left); or tp:SYSTEM:NAME, the kernel's
    /// own tracepoint ('tp:sched:*', 'tp:syscalls:sys_enter_openat';
    /// `vtrace probes list --kernel FILE` lists them), which fires where a
    /// site's NOP (a system call's routine) runs (while tracing, and
    /// through breakpoints while not where its sites fit),
    /// with its event's fields read from its arguments
    /// ('tp:sched:sched_switch(prev->comm, next->pid)' names its own),
    /// the guest's tracepoint left off. Fires are counted (`vtrace ctl status`, the run's
    /// summary) and recorded in the trace disk (--disk, default
    /// vtrace.vtd) with their arguments, traced or not; `vtrace analyze
    /// probes` counts them. Repeatable.
    #[arg(
        long = "probe",
        value_name = "PATTERN|fn:ROUTINE[(ARGS)]|fnret:ROUTINE|tp:SYSTEM:NAME[(ARGS)]",
        help_heading = "Probes, captures and peeping"
    )]
    pub probes: Vec<String>,

    /// Peep: sample the --sample variables every INTERVAL of host time
    /// (10us up; units ns, us, ms, s) from a host thread that reads guest
    /// RAM while the guest runs on, with no VM exit. Each sample carries
    /// the guest's virtual time and the host's, and goes into the trace
    /// disk (--disk, default vtrace.vtd) whether tracing is on or not;
    /// `vtrace analyze samples` prints the series. A last sample is taken
    /// when the guest stops.
    #[arg(long, value_name = "INTERVAL", value_parser = crate::units::parse_interval, help_heading = "Probes, captures and peeping")]
    pub peep: Option<std::time::Duration>,

    /// A variable to sample with --peep: a symbol of the kernel (its
    /// symbol table, or kallsyms for a Linux bzImage) or a hexadecimal
    /// address (a link address of the kernel image, else guest-physical),
    /// then :TYPE, one of u8, u16, u32, u64 (the default) or i64. Up to 16;
    /// repeatable.
    #[arg(
        long = "sample",
        value_name = "SYMBOL[:TYPE]",
        requires = "peep",
        help_heading = "Probes, captures and peeping"
    )]
    pub samples: Vec<String>,

    /// With --peep: every sample also takes the running pc, for a profile
    /// by routine (`vtrace analyze samples`). This one is not free: the
    /// vCPU is stopped for it, one VM exit per sample.
    #[arg(long, requires = "peep", help_heading = "Probes, captures and peeping")]
    pub sample_pc: bool,

    /// Serve gdb (the GDB remote protocol) at ADDR while the guest runs: a
    /// port (on 127.0.0.1), HOST:PORT, or a Unix socket's path (one with
    /// a /). In gdb: `target remote ADDR`. gdb stops, steps and continues
    /// the guest, with hardware breakpoints (the debug registers the
    /// tracer leaves free), and reads registers and memory through the
    /// guest's page tables. A step gdb takes while tracing is a step of
    /// the trace.
    #[arg(long, value_name = "ADDR", help_heading = "Debugger")]
    pub gdb: Option<String>,

    /// With --gdb: hold the guest at its first instruction until gdb
    /// attaches.
    #[arg(long, requires = "gdb", help_heading = "Debugger")]
    pub gdb_wait: bool,

    /// Control socket for `vtrace ctl` (made when a trace disk is used;
    /// default vtrace-PID.sock in $XDG_RUNTIME_DIR, or else in a 0700
    /// directory of the user's own, /tmp/vtrace-UID).
    #[arg(long, value_name = "PATH", help_heading = "Control")]
    pub control: Option<PathBuf>,

    /// Stop tracing when the guest takes one of these exceptions: a comma
    /// list of names (de, nmi, bp, of, br, ud, df, ts, np, ss, gp, pf, ...)
    /// or vectors; `none`; or `default` (de,nmi,bp,of,br,ud,df,ts,np,ss,gp).
    #[arg(long, value_name = "LIST", default_value = "default", value_parser = parse_autostop, help_heading = "Tracing")]
    pub autostop: Autostop,

    /// KVM device to use.
    #[arg(long, value_name = "PATH", default_value = vtrace_vmm::KVM_DEVICE, help_heading = "Guest")]
    pub kvm_device: PathBuf,
}

/// `--append`'s long help: the default command lines, as they are.
fn append_help() -> String {
    use vtrace_vmm::{default_linux_cmdline, CpuProfile};
    format!(
        "Added to the kernel command line, after the default one (or after --cmdline's). \
         The default for a Linux kernel with --cpu baseline:\n  {}\nwith --cpu host:\n  {}\n\
         The switches after noapic keep Linux off what the baseline CPU hides (on some hosts \
         the CPU's own bits reach an untraced guest). With --cpus above 1 `nolapic noapic` is \
         left out: each CPU has a local APIC, and there is an I/O APIC. The built-in demo OS \
         has no default.",
        default_linux_cmdline(CpuProfile::Baseline, 1),
        default_linux_cmdline(CpuProfile::Host, 1)
    )
}
