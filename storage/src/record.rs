//! What a trace is made of.

/// General registers in x86 encoding order (RAX, RCX, RDX, RBX, RSP, RBP,
/// RSI, RDI, R8..R15), then RFLAGS. RIP is not here: it is the next step's
/// address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Regs {
    /// RAX to R15, in encoding order.
    pub gpr: [u64; 16],
    /// RFLAGS.
    pub rflags: u64,
}

/// Number of registers a step can change ([`Regs::gpr`] and RFLAGS).
pub const REG_COUNT: usize = 17;

/// The registers' names, in [`Regs`] order.
pub const REG_NAMES: [&str; REG_COUNT] = [
    "rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13",
    "r14", "r15", "rflags",
];

impl Regs {
    /// Register `i` in [`REG_NAMES`] order (16 is RFLAGS).
    pub fn get(&self, i: usize) -> u64 {
        if i < 16 {
            self.gpr[i]
        } else {
            self.rflags
        }
    }

    /// Sets register `i` in [`REG_NAMES`] order (16 is RFLAGS).
    pub fn set(&mut self, i: usize, v: u64) {
        if i < 16 {
            self.gpr[i] = v
        } else {
            self.rflags = v
        }
    }

    /// The index of the general register called `name` (`rdi`, `R8`), for
    /// [`Regs::get`].
    pub fn gpr_index(name: &str) -> Option<usize> {
        REG_NAMES[..16]
            .iter()
            .position(|r| r.eq_ignore_ascii_case(name))
    }
}

/// Processor mode a step ran in; it fixes how the bytes decode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CpuMode {
    /// Real mode (and virtual-8086 mode).
    #[default]
    Real = 0,
    /// Protected mode, 16-bit code segment.
    Protected16 = 1,
    /// Protected mode, 32-bit code segment.
    Protected32 = 2,
    /// Long mode, 64-bit code segment.
    Long64 = 3,
    /// Long mode, 32-bit compatibility code segment.
    Compat32 = 4,
}

impl CpuMode {
    /// The mode of code `v`, as the codec writes it.
    pub fn from_u8(v: u8) -> Option<CpuMode> {
        Some(match v {
            0 => CpuMode::Real,
            1 => CpuMode::Protected16,
            2 => CpuMode::Protected32,
            3 => CpuMode::Long64,
            4 => CpuMode::Compat32,
            _ => return None,
        })
    }

    /// Code size for a disassembler: 16, 32 or 64.
    pub fn bitness(self) -> u32 {
        match self {
            CpuMode::Real | CpuMode::Protected16 => 16,
            CpuMode::Protected32 | CpuMode::Compat32 => 32,
            CpuMode::Long64 => 64,
        }
    }
}

/// The bytes of one instruction (at most 15).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InsnBytes {
    len: u8,
    bytes: [u8; 15],
}

impl InsnBytes {
    /// `None` if `bytes` is empty or longer than an x86 instruction can be.
    pub fn new(bytes: &[u8]) -> Option<InsnBytes> {
        if bytes.is_empty() || bytes.len() > 15 {
            return None;
        }
        let mut b = [0u8; 15];
        b[..bytes.len()].copy_from_slice(bytes);
        Some(InsnBytes {
            len: u8::try_from(bytes.len()).ok()?,
            bytes: b,
        })
    }

    /// The first `len` bytes of a 15-byte fetch buffer; `None` if `len`
    /// is 0 or over 15. The tracer's way, once a step: a fixed-size copy
    /// and a mask where [`InsnBytes::new`]'s copy of a slice is a memcpy
    /// call.
    pub fn from_prefix(buf: &[u8; 15], len: usize) -> Option<InsnBytes> {
        if len == 0 || len > 15 {
            return None;
        }
        let mut wide = [0u8; 16];
        wide[..15].copy_from_slice(buf);
        // len <= 15, so the shift stays below 128.
        let kept = u128::from_le_bytes(wide) & ((1u128 << (8 * len)) - 1);
        let mut bytes = [0u8; 15];
        bytes.copy_from_slice(&kept.to_le_bytes()[..15]);
        Some(InsnBytes {
            len: u8::try_from(len).ok()?,
            bytes,
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The bytes, then zeros up to 15: a fixed-size copy of these and a
    /// truncation to [`InsnBytes::len`] is cheaper than the memcpy call a
    /// copy of [`InsnBytes::as_slice`] makes.
    pub fn padded(&self) -> &[u8; 15] {
        &self.bytes
    }

    /// Its length as the one byte the trace stores it in (1 to 15).
    pub fn len_byte(&self) -> u8 {
        self.len
    }

    /// How many bytes.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl AsRef<[u8]> for InsnBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

/// One executed instruction and the state it left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Step {
    /// Linear address of the instruction.
    pub pc: u64,
    /// Its bytes, as fetched.
    pub bytes: InsnBytes,
    /// Address space it ran in.
    pub cr3: u64,
    /// The mode they decode in.
    pub mode: CpuMode,
    /// Privilege level (CS.DPL), 0 to 3.
    pub cpl: u8,
    /// Registers after it executed.
    pub regs: Regs,
}

/// How an interrupt or exception came to be recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum InterruptSource {
    /// The VMM injected it (it knows the vector and the step).
    Injected = 0,
    /// Inferred from a jump to an IDT handler.
    InferredFromIdt = 1,
    /// KVM reported it (an exception the guest raised).
    ReportedByKvm = 2,
    /// The VMM delivered it itself (software interrupt, emulator gap).
    DeliveredByVmm = 3,
}

/// Why tracing started or stopped.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TraceReason {
    /// `--trace` on the command line, or the session's start.
    CommandLine,
    /// A console hotkey (`Ctrl-A t`).
    Hotkey,
    /// `vtrace ctl start` or `stop`.
    Control,
    /// A guest's tracing hypercall.
    Hypercall {
        /// The pass the guest gave.
        pass: u64,
    },
    /// Execution reached `--start-at` or `--stop-at` (this address).
    Address(u64),
    /// `--max-steps` steps were recorded.
    MaxSteps,
    /// The guest took an `--autostop` exception (this vector).
    Exception(u8),
    /// The guest ended the run.
    GuestExit,
    /// The trace disk was full (and not wrapping).
    DiskFull,
    /// Anything else, said in words.
    Other(String),
    /// The user ended the run with `Ctrl-A x`.
    UserQuit,
    /// A signal (SIGINT, SIGTERM, SIGHUP: its number) ended the run.
    Signal(u8),
    /// A window of `--trace-function`: the routine `name` was entered,
    /// returned, or its task was switched out or in.
    Function {
        /// The routine.
        name: String,
        /// What happened to its window.
        edge: FunctionEdge,
    },
}

/// Where a `--trace-function` window starts or stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FunctionEdge {
    /// Execution reached the routine's first instruction.
    Entry = 0,
    /// The routine returned to its caller.
    Return = 1,
    /// The CPU left the routine's task (or address space) inside the
    /// window: what it runs meanwhile is not recorded.
    SwitchedOut = 2,
    /// The routine's task runs again inside the window.
    SwitchedIn = 3,
}

impl FunctionEdge {
    /// The edge of code `v`, as the codec writes it.
    pub fn from_u8(v: u8) -> Option<FunctionEdge> {
        Some(match v {
            0 => FunctionEdge::Entry,
            1 => FunctionEdge::Return,
            2 => FunctionEdge::SwitchedOut,
            3 => FunctionEdge::SwitchedIn,
            _ => return None,
        })
    }

    /// As [`TraceReason::token`] writes it.
    pub fn token(self) -> &'static str {
        match self {
            FunctionEdge::Entry => "entry",
            FunctionEdge::Return => "return",
            FunctionEdge::SwitchedOut => "switched_out",
            FunctionEdge::SwitchedIn => "switched_in",
        }
    }
}

/// The conventional name of a stop signal's number.
fn signal_name(signal: u8) -> String {
    match signal {
        1 => "SIGHUP".into(),
        2 => "SIGINT".into(),
        15 => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

impl TraceReason {
    /// A stable machine-readable form: `guest_exit`, `max_steps`,
    /// `disk_full`, `command_line`, `hotkey`, `control`, `hypercall:N`,
    /// `address:0x...`, `exception:N`, `other:TEXT`, `user_quit`,
    /// `signal:SIGINT`, `function:EDGE:NAME` (EDGE one of `entry`,
    /// `return`, `switched_out`, `switched_in`).
    pub fn token(&self) -> String {
        match self {
            TraceReason::CommandLine => "command_line".into(),
            TraceReason::Hotkey => "hotkey".into(),
            TraceReason::Control => "control".into(),
            TraceReason::Hypercall { pass } => format!("hypercall:{pass}"),
            TraceReason::Address(a) => format!("address:{a:#x}"),
            TraceReason::MaxSteps => "max_steps".into(),
            TraceReason::Exception(v) => format!("exception:{v}"),
            TraceReason::GuestExit => "guest_exit".into(),
            TraceReason::DiskFull => "disk_full".into(),
            TraceReason::Other(t) => format!("other:{t}"),
            TraceReason::UserQuit => "user_quit".into(),
            TraceReason::Signal(n) => format!("signal:{}", signal_name(*n)),
            TraceReason::Function { name, edge } => format!("function:{}:{name}", edge.token()),
        }
    }
}

impl std::fmt::Display for TraceReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TraceReason::CommandLine => write!(f, "the command line (--trace)"),
            TraceReason::Hotkey => write!(f, "the Ctrl-A t hotkey"),
            TraceReason::Control => write!(f, "vtrace ctl"),
            TraceReason::Hypercall { pass } => write!(f, "a guest hypercall (pass {pass})"),
            TraceReason::Address(a) => write!(f, "reaching address {a:#x}"),
            TraceReason::MaxSteps => write!(f, "--max-steps"),
            TraceReason::Exception(v) => write!(f, "guest exception {v}"),
            TraceReason::GuestExit => write!(f, "the end of the run"),
            TraceReason::DiskFull => write!(f, "a full trace disk"),
            TraceReason::Other(t) => write!(f, "{t}"),
            TraceReason::UserQuit => write!(f, "Ctrl-A x"),
            TraceReason::Signal(n) => write!(f, "{}", signal_name(*n)),
            TraceReason::Function { name, edge } => match edge {
                FunctionEdge::Entry => write!(f, "a call of {name} (--trace-function)"),
                FunctionEdge::Return => write!(f, "{name} returning"),
                FunctionEdge::SwitchedOut => write!(f, "{name}'s task being switched out"),
                FunctionEdge::SwitchedIn => write!(f, "{name}'s task running again"),
            },
        }
    }
}

/// The id of a mark made from the host (`Ctrl-A m`, `vtrace ctl mark`
/// without an id); its value counts the run's host marks.
pub const HOST_MARK: u64 = u64::MAX;

/// Most arguments a probe carries (a static probe's hypercall passes six
/// registers; a `fn:` probe the six argument registers of the x86-64 ABI).
pub const MAX_PROBE_ARGS: usize = 6;

/// Most typed values one [`Event::ProbeValues`] holds.
pub const MAX_PROBE_FIELDS: usize = 8;

/// Most bytes of text a typed probe value holds.
pub const MAX_PROBE_TEXT: usize = 256;

/// One typed value a probe fetched (`fn:filp_open(filename:string)`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProbeField {
    /// The fetch as the probe named it (`filename`, `how->flags`).
    pub name: String,
    /// What it found.
    pub value: ProbeValue,
}

/// What a typed probe fetch found.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ProbeValue {
    /// An integer of `size` bytes (1, 2, 4 or 8).
    Int {
        /// Its bits, zero-extended.
        value: u64,
        /// Its width in bytes.
        size: u8,
        /// Whether its type is signed.
        signed: bool,
    },
    /// An address (a pointer the fetch did not follow).
    Pointer(u64),
    /// Text from guest memory: up to its NUL, at most
    /// [`MAX_PROBE_TEXT`] bytes.
    Text {
        /// The bytes, without the NUL.
        bytes: Vec<u8>,
        /// Whether the NUL was found (not cut at the limit or at a page
        /// that was not present).
        complete: bool,
    },
    /// Memory the fetch needed was not present at this address (a page
    /// not mapped, a bad pointer): nothing is invented.
    Unavailable {
        /// The address it could not read.
        addr: u64,
    },
}

/// CPU numbers in a trace are below this.
pub const MAX_CPUS: u32 = 256;

/// Most accesses one [`Event::MemoryValues`] holds (an instruction has at
/// most two memory operands, each read and written).
pub const MAX_MEMORY_VALUES: usize = 8;

/// One memory access of a step and the value it loaded or stored, as
/// `vtrace run --record-values` read it from guest memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemoryValue {
    /// The linear address the CPU used (FS and GS bases included).
    pub addr: u64,
    /// Bytes accessed, 1 to 8.
    pub size: u8,
    /// A store (else a load).
    pub write: bool,
    /// The value, little-endian in its `size` bytes; `None` where the
    /// memory could not be read (a page not present, a device's).
    pub value: Option<u64>,
}

/// Most values one [`Event::Sample`] holds.
pub const MAX_SAMPLE_VALUES: usize = 16;

/// Something that happened between two steps.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// An interrupt or exception delivered before the next step.
    Interrupt {
        /// Its vector.
        vector: u8,
        /// The error code it pushed, if any.
        error_code: Option<u32>,
        /// How it was found.
        source: InterruptSource,
    },
    /// A port access the VMM served.
    Io {
        /// The port.
        port: u16,
        /// Bytes accessed (1, 2 or 4).
        size: u8,
        /// An OUT (else an IN).
        write: bool,
        /// The value written or read.
        value: u32,
    },
    /// A memory-mapped I/O access the VMM served.
    Mmio {
        /// The guest-physical address.
        addr: u64,
        /// Bytes accessed (1 to 8).
        size: u8,
        /// A write (else a read).
        write: bool,
        /// The value written or read.
        value: u64,
    },
    /// A vtrace hypercall.
    Hypercall {
        /// Its command (`vtrace_guest::cmd`).
        command: u32,
        /// RBX, RCX, RSI and RDI.
        args: [u64; 4],
        /// What it returned in EAX.
        result: i32,
    },
    /// A MARK hypercall's id and value, or a mark from the host
    /// ([`HOST_MARK`]).
    Mark {
        /// The mark's id.
        id: u64,
        /// Its value.
        value: u64,
    },
    /// A LOG hypercall's text.
    Log(String),
    /// Bytes read from guest memory at a linear address by a capture
    /// (`vtrace run --capture`), before the step that follows it.
    Capture {
        /// The capture's name.
        name: String,
        /// The linear address the bytes were read from.
        addr: u64,
        /// How many bytes were asked for.
        length: u32,
        /// What was read: all `length` bytes, or fewer where a page was
        /// not present (none at all when the first one was not).
        bytes: Vec<u8>,
    },
    /// A probe fired (`vtrace run --probe`): a static probe's site ran
    /// its hypercall, or execution reached a `fn:` probe's routine.
    Probe {
        /// `provider:name` (`sched:switch`, `fn:schedule`).
        name: String,
        /// The site: the static probe's hypercall, or the routine's entry.
        pc: u64,
        /// The probe's arguments, at most [`MAX_PROBE_ARGS`].
        args: Vec<u64>,
    },
    /// The typed values of the [`Event::Probe`] just before it
    /// (`--probe 'fn:ROUTINE(arg, name:string, p->field)'`), at most
    /// [`MAX_PROBE_FIELDS`].
    ProbeValues(Vec<ProbeField>),
    /// The memory values of the step right after it that its registers
    /// do not give (`vtrace run --record-values`): each of its accesses of
    /// at most 8 bytes, in the order of the instruction's memory operands
    /// (iced-x86's), at most [`MAX_MEMORY_VALUES`]. Loads are read before
    /// the instruction runs, stores after it.
    MemoryValues(Vec<MemoryValue>),
    /// A sample of guest variables taken by the peeper (`vtrace run
    /// --peep`) while the guest ran on. Its place among the steps is
    /// where the vCPU next exited, not where it was taken: its times say
    /// when. The variables' names and types are in the trace's metadata
    /// (`samples`), in the order of `values`.
    Sample {
        /// Guest virtual nanoseconds when it was taken.
        virtual_ns: u64,
        /// Host nanoseconds since the run started.
        host_ns: u64,
        /// At most [`MAX_SAMPLE_VALUES`].
        values: Vec<u64>,
        /// The running pc and CR3 (`--sample-pc`).
        pc: Option<(u64, u64)>,
    },
    /// A control register changed (0, 3, 4) or EFER (reg 0xEF).
    ControlRegister {
        /// 0, 3 or 4 for CRn; 0xEF for EFER.
        reg: u8,
        /// Its new value.
        value: u64,
    },
    /// The next pc could not be explained by the previous instruction or an
    /// event: `from` is where execution was expected, `to` where it went.
    Gap {
        /// The pc execution was expected at.
        from: u64,
        /// The pc it went to.
        to: u64,
    },
    /// The guest halted (HLT) until an interrupt.
    Halt,
    /// Tracing started.
    TraceStart(TraceReason),
    /// Tracing stopped.
    TraceStop(TraceReason),
    /// The CPU runs Linux task `tid` (a thread; `pid` is its process, the
    /// thread group) named `comm` from the next step on: recorded where
    /// tracing starts and where the kernel switches tasks.
    Task {
        /// The thread.
        tid: u32,
        /// Its process.
        pid: u32,
        /// Its name.
        comm: String,
    },
    /// Linux task `tid` took the name `comm` (an exec, a prctl, a kernel
    /// thread named by its creator).
    TaskName {
        /// The thread.
        tid: u32,
        /// Its new name.
        comm: String,
    },
    /// The file-backed memory map of Linux process `pid`, whole, as the
    /// kernel held it (its VMAs, as `/proc/PID/maps` lists them): recorded
    /// when the trace first meets the process and after an exec or an
    /// `mmap`, `munmap` or `mremap`, where it changed.
    Mappings {
        /// The process.
        pid: u32,
        /// Its file-backed mappings.
        maps: Vec<Mapping>,
    },
    /// The task running where a segment begins: the last [`Event::Task`]
    /// with any rename since, repeated by the recorder at the start of
    /// every segment after the first task event, so a segment names its
    /// steps on its own (parallel analysis, a wrapped trace's oldest
    /// segment). Not a switch.
    Running {
        /// The thread.
        tid: u32,
        /// Its process.
        pid: u32,
        /// Its name.
        comm: String,
    },
    /// The steps and events that follow ran on this CPU (below
    /// [`MAX_CPUS`]), until the next such event. A trace without one is
    /// CPU 0's; the recorder repeats the current CPU at the start of every
    /// segment where it is not 0, so a segment decodes on its own. Not a
    /// switch where it repeats the CPU already current.
    Cpu(u32),
    /// Tasks runnable on the CPU's run queue (the running one included),
    /// read where the kernel switches tasks, recorded when it changed.
    Runnable {
        /// How many.
        count: u32,
    },
    /// Linux task `tid` exits (it entered `do_exit`) with the kernel's
    /// exit code: a wait status, `(status << 8) | signal`, the signal
    /// with 0x80 where it dumped core.
    TaskExit {
        /// The thread.
        tid: u32,
        /// Its exit code, as a wait status.
        code: u32,
    },
}

/// One file mapped into a process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Mapping {
    /// First address of the mapping.
    pub start: u64,
    /// The address after its last byte.
    pub end: u64,
    /// Where `start` is in the file, in bytes.
    pub offset: u64,
    /// The file's path, from the root of its file system.
    pub path: String,
}

/// A step or an event.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Record {
    /// An executed instruction.
    Step(Step),
    /// Something between two steps.
    Event(Event),
}

/// A record borrowed from a [`crate::SegmentDecoder`]: reading a trace this
/// way moves no step (about 180 bytes) per record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordRef<'a> {
    /// An executed instruction.
    Step(&'a Step),
    /// Something between two steps.
    Event(&'a Event),
}

impl Record {
    /// The record, borrowed.
    pub fn borrowed(&self) -> RecordRef<'_> {
        match self {
            Record::Step(s) => RecordRef::Step(s),
            Record::Event(e) => RecordRef::Event(e),
        }
    }
}

impl RecordRef<'_> {
    /// The record, owned (an event is cloned).
    pub fn to_record(self) -> Record {
        match self {
            RecordRef::Step(s) => Record::Step(*s),
            RecordRef::Event(e) => Record::Event(e.clone()),
        }
    }
}
