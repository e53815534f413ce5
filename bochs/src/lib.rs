//! vtrace's second engine: Bochs's CPU run in-process, on the host's
//! guest RAM, reaching the host's devices through [`Host`].
//!
//! Bochs is LGPL-2.1 and vtrace Apache-2.0, so Bochs is never linked:
//! `scripts/engine.sh` builds it, with vtrace's own C ABI over it
//! (`bochs/cabi`), into `libvtrace_bochs.so`, and [`Library::load`] opens
//! that at run time. Without it vtrace steps under KVM as before;
//! [`Library::find`] says where it looked.
//!
//! The library keeps one machine at a time per process (Bochs's CPUs are
//! globals, made once: every machine of a process has as many CPUs as its
//! first).

mod ffi;
mod handover;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

pub use ffi::{Fpu, Msrs, Segment, State, BLOCKED_BY_MOV_SS, BLOCKED_BY_STI};
pub use handover::{general_registers_of, registers_of, state_of};

/// The most CPUs a machine has (Bochs's `BX_MAX_SMP_THREADS_SUPPORTED`:
/// the I/O APIC takes the last xAPIC ID).
pub const MAX_CPUS: u32 = 254;

/// The file name of the engine's library.
pub const LIBRARY: &str = "libvtrace_bochs.so";

/// Why the engine's library cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// No library where vtrace looks.
    #[error(
        "the engine's library is not built ({looked}); scripts/engine.sh builds it (Bochs's CPU, \
         a few minutes, once)"
    )]
    Missing {
        /// Where vtrace looked.
        looked: String,
    },
    /// The file is there but does not load.
    #[error("cannot load the engine's library {path}: {source}")]
    Load {
        /// The library.
        path: PathBuf,
        /// What the loader said.
        source: libloading::Error,
    },
    /// It speaks another version of the C ABI.
    #[error(
        "the engine's library {path} speaks ABI {found}, this vtrace {wanted}: rebuild it with \
         scripts/engine.sh"
    )]
    Abi {
        /// The library.
        path: PathBuf,
        /// Its ABI.
        found: c_int,
        /// This binding's.
        wanted: c_int,
    },
}

/// Why a machine cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// The library holds one machine at a time, and it is taken.
    #[error("this process has an engine machine already (the library holds one at a time)")]
    Taken,
    /// The library refused the CPU count (more than it can make, or not
    /// the count of the process's first machine).
    #[error("the engine cannot make a machine of {0} CPUs here")]
    Cpus(u32),
    /// Guest RAM must start on a 4 KiB boundary (Bochs ORs page offsets
    /// into a page's host address); a mapping always does.
    #[error("guest RAM at {0:#x} is not aligned to 4 KiB")]
    Unaligned(usize),
}

/// The engine's library, loaded.
pub struct Library {
    path: PathBuf,
    create: ffi::CreateFn,
    get_state: ffi::GetStateFn,
    set_state: ffi::SetStateFn,
    set_intr: ffi::SetIntrFn,
    insn_start: ffi::InsnStartFn,
    in_repeat: ffi::InRepeatFn,
    invalidate: ffi::InvalidateFn,
    run: ffi::RunFn,
    // Kept open as long as the functions above are used.
    _library: libloading::Library,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Where `scripts/engine.sh` puts its builds, as it computes it.
fn engine_home() -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("VTRACE_ENGINE_HOME") {
        return Some(PathBuf::from(home));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("vtrace").join("engine"))
}

impl Library {
    /// Where the engine's library is: `$VTRACE_ENGINE` where set, else the
    /// newest build `scripts/engine.sh` left in its cache.
    pub fn find() -> Result<PathBuf, LoadError> {
        if let Some(path) = std::env::var_os("VTRACE_ENGINE") {
            let path = PathBuf::from(path);
            return match path.is_file() {
                true => Ok(path),
                false => Err(LoadError::Missing {
                    looked: format!("VTRACE_ENGINE names {}", path.display()),
                }),
            };
        }
        let home = engine_home().ok_or_else(|| LoadError::Missing {
            looked: "no HOME, XDG_CACHE_HOME or VTRACE_ENGINE_HOME".into(),
        })?;
        let newest = std::fs::read_dir(&home)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("lib-"))
            .map(|e| e.path().join(LIBRARY))
            .filter(|p| p.is_file())
            .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok());
        newest.ok_or_else(|| LoadError::Missing {
            looked: format!("{}/lib-*/{LIBRARY}", home.display()),
        })
    }

    /// Loads the library at `path`.
    pub fn load(path: &Path) -> Result<Library, LoadError> {
        let load = |source| LoadError::Load {
            path: path.to_path_buf(),
            source,
        };
        // SAFETY: the library is vtrace's own engine (its initialisers only
        // set up Bochs's globals); the symbols below are looked up with the
        // types bochs/cabi/vtrace_bochs.h gives them, and its ABI version
        // is checked before any other is used.
        unsafe {
            let library = libloading::Library::new(path).map_err(load)?;
            let abi: ffi::AbiFn = *library.get(b"vtb_abi\0").map_err(load)?;
            let found = abi();
            if found != ffi::ABI {
                return Err(LoadError::Abi {
                    path: path.to_path_buf(),
                    found,
                    wanted: ffi::ABI,
                });
            }
            Ok(Library {
                path: path.to_path_buf(),
                create: *library.get(b"vtb_create\0").map_err(load)?,
                get_state: *library.get(b"vtb_get_state\0").map_err(load)?,
                set_state: *library.get(b"vtb_set_state\0").map_err(load)?,
                set_intr: *library.get(b"vtb_set_intr\0").map_err(load)?,
                insn_start: *library.get(b"vtb_insn_start\0").map_err(load)?,
                invalidate: *library.get(b"vtb_invalidate\0").map_err(load)?,
                in_repeat: *library.get(b"vtb_in_repeat\0").map_err(load)?,
                run: *library.get(b"vtb_run\0").map_err(load)?,
                _library: library,
            })
        }
    }

    /// Where it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// CPU `cpu`'s state now. Also from inside a [`Host`] callback, where
    /// it is the state in the middle of the instruction under way (RIP
    /// already past it). Meaningless before a [`Machine`] is made.
    pub fn state(&self, cpu: u32) -> State {
        let mut state = State::default();
        // SAFETY: `state` is a valid `vtb_state` to write; the library
        // reads its CPUs' globals.
        unsafe { (self.get_state)(cpu, &mut state, ffi::ALL) };
        state
    }

    /// The part of CPU `cpu`'s state that changes at every step, read
    /// into `state` (the rest of it stays): the general registers, RIP,
    /// RFLAGS, the segments, descriptor tables and control registers,
    /// EFER, IA32_APIC_BASE, the activity and the interrupt shadow. What
    /// a host reads after each step (the whole state is some 900 bytes,
    /// its x87 registers converted on the way).
    pub fn read_core(&self, cpu: u32, state: &mut State) {
        // SAFETY: `state` is a valid `vtb_state` to write.
        unsafe { (self.get_state)(cpu, state, ffi::CORE) };
    }

    /// [`Machine::invalidate`], also from inside a [`Host`] callback (a
    /// run goes on with what it decoded until the host ends it).
    pub fn invalidate(&self, gpa: u64, len: u64) {
        if len > 0 {
            // SAFETY: a plain call into the library's own bookkeeping.
            unsafe { (self.invalidate)(gpa, len) }
        }
    }

    /// Inside [`Host::step`]: whether the step is an iteration of a REP
    /// string instruction. [`Library::state`] then has RIP past the
    /// instruction even where more iterations follow; the run's end puts
    /// RIP back where the next one runs, as the trap flag shows it, so a
    /// host that reads such a step's state ends the run first.
    pub fn in_repeat(&self, cpu: u32) -> bool {
        // SAFETY: a plain read of the library's own bookkeeping.
        unsafe { (self.in_repeat)(cpu) != 0 }
    }

    /// Inside a [`Host`] callback: the address of the instruction under
    /// way on CPU `cpu` (its RIP; [`Library::state`] gives the RIP past
    /// it).
    pub fn instruction_start(&self, cpu: u32) -> u64 {
        // SAFETY: a plain read of the CPU's globals.
        unsafe { (self.insn_start)(cpu) }
    }
}

/// What the engine asks of the machine around its CPUs: its devices, and
/// what to do after each step. Where a host has nothing, the defaults are
/// an empty machine's: a read of a port or MMIO gives all ones, a write
/// goes nowhere, a step asks for nothing, an acknowledge finds the
/// spurious vector 0xff.
pub trait Host {
    /// A port read of `len` bytes (1, 2 or 4) by CPU `cpu`.
    fn port_in(&mut self, cpu: u32, port: u16, len: u32) -> u32 {
        let _ = (cpu, port, len);
        u32::MAX
    }
    /// A port write.
    fn port_out(&mut self, cpu: u32, port: u16, len: u32, value: u32) {
        let _ = (cpu, port, len, value);
    }
    /// A read of `len` bytes (1 to 8) at guest-physical `gpa`, past RAM.
    fn mmio_read(&mut self, cpu: u32, gpa: u64, len: u32) -> u64 {
        let _ = (cpu, gpa, len);
        u64::MAX
    }
    /// A write past RAM.
    fn mmio_write(&mut self, cpu: u32, gpa: u64, len: u32, value: u64) {
        let _ = (cpu, gpa, len, value);
    }
    /// After each step of CPU `cpu` (an instruction, or one iteration of
    /// a REP string instruction): what the host wants now.
    fn step(&mut self, cpu: u32) -> Wants {
        let _ = cpu;
        Wants::default()
    }
    /// CPU `cpu` takes the external interrupt its INTR line raised: the
    /// vector (the host's interrupt controllers acknowledge it).
    fn acknowledge(&mut self, cpu: u32) -> u8 {
        let _ = cpu;
        0xff
    }
    /// CPUID of `leaf` and `subleaf` ran on CPU `cpu`: the host's answer
    /// (EAX, EBX, ECX, EDX), as its CPU profile says, or `None` for Bochs's
    /// model's. Asked before the step is told.
    fn cpuid(&mut self, cpu: u32, leaf: u32, subleaf: u32) -> Option<[u32; 4]> {
        let _ = (cpu, leaf, subleaf);
        None
    }
    /// RDTSC, RDTSCP or RDMSR of IA32_TSC ran on CPU `cpu`: the time stamp
    /// counter by the host's step clock, or `None` for Bochs's. Asked
    /// before the step is told.
    fn tsc(&mut self, cpu: u32) -> Option<u64> {
        let _ = cpu;
        None
    }
    /// CPU `cpu` begins to deliver `event`. An instruction that faults is
    /// no step: its exception is the event. Where the answer asks to end
    /// the run, a run that delivers an exception ends once it is
    /// delivered, before the handler's first instruction ([`Stop::Asked`]);
    /// an interrupt's step follows it whatever the answer.
    fn event(&mut self, cpu: u32, event: Event) -> Wants {
        let _ = (cpu, event);
        Wants::default()
    }
    /// A message of the CPU's (level 0 debug, 1 info, 2 error, 3 panic).
    fn log(&mut self, level: i32, text: &str) {
        let _ = (level, text);
    }
}

/// What the CPU delivers ([`Host::event`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// An external interrupt (or NMI) of this vector.
    External(u8),
    /// INT n, INT3, INTO or INT1 of this vector ran: its step follows,
    /// at the handler.
    Software(u8),
    /// An exception an instruction raised, with the error code it pushes
    /// (0 where it pushes none).
    Exception {
        /// The vector.
        vector: u8,
        /// The error code.
        error: u32,
    },
}

/// What the host wants after a step ([`Host::step`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wants {
    /// The run ends after this step ([`Stop::Asked`]).
    pub end_run: bool,
    /// The CPU's INTR line is high: an external interrupt waits, taken
    /// (through [`Host::acknowledge`]) where the CPU's IF allows; false
    /// lowers it.
    pub interrupt: bool,
}

/// Where a CPU stands ([`State::activity`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Activity {
    /// It runs.
    Active = 0,
    /// It executed HLT and waits for an interrupt.
    Halted = 1,
    /// A triple fault stopped it.
    ShutDown = 2,
    /// An application processor before its STARTUP.
    WaitingForStartup = 3,
}

impl State {
    /// Where the CPU stands.
    pub fn activity(&self) -> Option<Activity> {
        [
            Activity::Active,
            Activity::Halted,
            Activity::ShutDown,
            Activity::WaitingForStartup,
        ]
        .into_iter()
        .find(|a| *a as u32 == self.activity)
    }
}

/// Why [`Machine::run`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// It ran the steps asked for.
    Steps,
    /// The CPU executed HLT, or is halted with no interrupt to take.
    Halt,
    /// [`Host::step`] asked it to end.
    Asked,
    /// The CPU met what it cannot go on from; [`Host::log`] was told what.
    Panic,
    /// A triple fault shut the CPU down (it stays so).
    Shutdown,
}

static TAKEN: AtomicBool = AtomicBool::new(false);

/// Where the library's callbacks find the host of the run under way: the
/// one [`Machine::run`] was given, for as long as that call lasts.
#[derive(Default)]
struct Slot {
    host: Option<*mut (dyn Host + 'static)>,
}

/// The engine's CPUs over a guest's RAM. The host that serves their
/// devices is given to each [`Machine::run`], so it may borrow what the
/// caller owns for as long as the run lasts.
pub struct Machine<'a> {
    library: &'a Library,
    // Boxed: the library keeps a pointer to it.
    slot: Box<Slot>,
    /// The RAM the CPUs run on (the library has its address).
    ram: *mut u8,
    ram_len: usize,
    _ram: std::marker::PhantomData<&'a mut [u8]>,
}

impl Drop for Machine<'_> {
    fn drop(&mut self) {
        // The library's CPUs stay; the next machine gives them its host.
        TAKEN.store(false, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Machine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Machine")
            .field("library", &self.library)
            .finish_non_exhaustive()
    }
}

/// Calls `f` with the host of the run under way, or gives `default` where
/// there is none (a callback outside a run: the library makes none).
fn with_host<T>(ctx: *mut c_void, default: T, f: impl FnOnce(&mut dyn Host) -> T) -> T {
    // SAFETY: `ctx` is the `Box<Slot>` a `Machine` owns and gave the
    // library; the library calls back only from within `Machine::run`,
    // which holds the machine mutably and set the slot to the host it
    // borrows mutably for the call, clearing it before it returns.
    let slot = unsafe { &mut *ctx.cast::<Slot>() };
    match slot.host {
        // SAFETY: see above: the host outlives the call that set it.
        Some(host) => f(unsafe { &mut *host }),
        None => default,
    }
}

extern "C" fn mmio_read(ctx: *mut c_void, cpu: c_uint, gpa: u64, len: c_uint) -> u64 {
    with_host(ctx, u64::MAX, |h| h.mmio_read(cpu, gpa, len))
}
extern "C" fn mmio_write(ctx: *mut c_void, cpu: c_uint, gpa: u64, len: c_uint, v: u64) {
    with_host(ctx, (), |h| h.mmio_write(cpu, gpa, len, v))
}
extern "C" fn port_in(ctx: *mut c_void, cpu: c_uint, port: u16, len: c_uint) -> u32 {
    with_host(ctx, u32::MAX, |h| h.port_in(cpu, port, len))
}
extern "C" fn port_out(ctx: *mut c_void, cpu: c_uint, port: u16, len: c_uint, v: u32) {
    with_host(ctx, (), |h| h.port_out(cpu, port, len, v))
}
fn flags(wants: Wants) -> u32 {
    let end = if wants.end_run { ffi::STEP_END } else { 0 };
    let intr = if wants.interrupt { ffi::STEP_INTR } else { 0 };
    end | intr
}
extern "C" fn step(ctx: *mut c_void, cpu: c_uint) -> u32 {
    with_host(ctx, 0, |h| flags(h.step(cpu)))
}
extern "C" fn acknowledge(ctx: *mut c_void, cpu: c_uint) -> u8 {
    with_host(ctx, 0xff, |h| h.acknowledge(cpu))
}
extern "C" fn cpuid(ctx: *mut c_void, cpu: c_uint, leaf: u32, sub: u32, out: *mut u32) -> c_int {
    let Some(answer) = with_host(ctx, None, |h| h.cpuid(cpu, leaf, sub)) else {
        return 0;
    };
    // SAFETY: the library passes room for four registers.
    unsafe { std::ptr::copy_nonoverlapping(answer.as_ptr(), out, 4) };
    1
}
extern "C" fn tsc(ctx: *mut c_void, cpu: c_uint, out: *mut u64) -> c_int {
    let Some(value) = with_host(ctx, None, |h| h.tsc(cpu)) else {
        return 0;
    };
    // SAFETY: the library passes a place for the value.
    unsafe { out.write(value) };
    1
}
extern "C" fn event(ctx: *mut c_void, cpu: c_uint, kind: c_int, vector: c_uint, e: u32) -> u32 {
    // Vectors are 8 bits; Bochs passes them in an unsigned.
    let vector = (vector & 0xff) as u8;
    let event = match kind {
        ffi::EVENT_EXTERNAL => Event::External(vector),
        ffi::EVENT_SOFTWARE => Event::Software(vector),
        _ => Event::Exception { vector, error: e },
    };
    with_host(ctx, 0, |h| flags(h.event(cpu, event)))
}
extern "C" fn log(ctx: *mut c_void, level: c_int, text: *const c_char) {
    if text.is_null() {
        return;
    }
    // SAFETY: the library passes a NUL-terminated text that lives for the
    // call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    with_host(ctx, (), |h| h.log(level, &text))
}

impl<'a> Machine<'a> {
    /// `cpus` CPUs over `ram` (guest-physical 0 up, aligned to 4 KiB), in
    /// Bochs's reset state. One at a time in a process, each of as many
    /// CPUs as the first.
    pub fn new(library: &'a Library, ram: &'a mut [u8], cpus: u32) -> Result<Self, MachineError> {
        if !(ram.as_ptr() as usize).is_multiple_of(4096) {
            return Err(MachineError::Unaligned(ram.as_ptr() as usize));
        }
        if TAKEN.swap(true, Ordering::SeqCst) {
            return Err(MachineError::Taken);
        }
        let mut slot = Box::<Slot>::default();
        let table = ffi::Host {
            ctx: (&mut *slot as *mut Slot).cast(),
            ram: ram.as_mut_ptr(),
            ram_len: ram.len() as u64,
            mmio_read,
            mmio_write,
            port_in,
            port_out,
            step,
            acknowledge,
            cpuid,
            tsc,
            event,
            log,
        };
        // SAFETY: the table is copied by the library; its pointers (the
        // boxed slot, the RAM) live as long as the machine, which borrows
        // the RAM for its lifetime.
        if unsafe { (library.create)(&table, cpus) } != 0 {
            TAKEN.store(false, Ordering::SeqCst);
            return Err(MachineError::Cpus(cpus));
        }
        Ok(Machine {
            library,
            slot,
            ram: ram.as_mut_ptr(),
            ram_len: ram.len(),
            _ram: std::marker::PhantomData,
        })
    }

    /// CPU `cpu`'s state.
    pub fn state(&self, cpu: u32) -> State {
        self.library.state(cpu)
    }

    /// Gives CPU `cpu` the state `state`.
    pub fn set_state(&mut self, cpu: u32, state: &State) {
        // SAFETY: `state` is a valid `vtb_state` to read.
        unsafe { (self.library.set_state)(cpu, state, ffi::ALL) }
    }

    /// Gives CPU `cpu` the core of `state` ([`Library::read_core`]'s
    /// part); the rest of its state stays.
    pub fn set_core(&mut self, cpu: u32, state: &State) {
        // SAFETY: `state` is a valid `vtb_state` to read.
        unsafe { (self.library.set_state)(cpu, state, ffi::CORE) }
    }

    /// [`Library::read_core`] of CPU `cpu`.
    pub fn read_core(&self, cpu: u32, state: &mut State) {
        self.library.read_core(cpu, state);
    }

    /// The host wrote guest RAM at `[gpa, gpa + len)` itself (an interrupt
    /// frame, a stretch another engine ran): the CPUs drop what they
    /// decoded from there. Their own writes need no telling.
    pub fn invalidate(&mut self, gpa: u64, len: u64) {
        self.library.invalidate(gpa, len);
    }

    /// Writes `data` into guest RAM at `gpa` as the host (a device, a
    /// loader), which the CPUs then see as they would a store of another
    /// bus master; false where it is not all RAM.
    pub fn write_ram(&mut self, gpa: u64, data: &[u8]) -> bool {
        let Some(end) = usize::try_from(gpa)
            .ok()
            .and_then(|at| at.checked_add(data.len()).map(|end| (at, end)))
            .filter(|&(_, end)| end <= self.ram_len)
        else {
            return false;
        };
        // SAFETY: [at, end) lies in the RAM this machine borrows mutably
        // for its life; no run is under way (this takes the machine
        // mutably).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ram.add(end.0), data.len());
        }
        self.invalidate(gpa, data.len() as u64);
        true
    }

    /// The host may have written anywhere in guest RAM: the CPUs drop all
    /// they decoded.
    pub fn invalidate_all(&mut self) {
        // SAFETY: as above.
        unsafe { (self.library.invalidate)(0, 0) }
    }

    /// Raises or lowers CPU `cpu`'s INTR line between runs (a halted CPU
    /// runs again once it is high).
    pub fn set_interrupt_line(&mut self, cpu: u32, high: bool) {
        // SAFETY: a plain call; the library checks nothing else is running.
        unsafe { (self.library.set_intr)(cpu, c_int::from(high)) }
    }

    /// Runs CPU `cpu` for at most `steps` steps, its devices served by
    /// `host`: why it stopped, and the steps it ran.
    pub fn run(&mut self, host: &mut dyn Host, cpu: u32, steps: u64) -> (Stop, u64) {
        let mut ran = 0;
        let host: *mut (dyn Host + '_) = host;
        // SAFETY: only the lifetime is erased: the slot holds the host for
        // this call alone and is cleared before the borrow ends.
        let host =
            unsafe { std::mem::transmute::<*mut (dyn Host + '_), *mut (dyn Host + 'static)>(host) };
        self.slot.host = Some(host);
        // SAFETY: the callbacks reach the host through the slot, set just
        // now; `ran` is a valid place to write.
        let why = unsafe { (self.library.run)(cpu, steps, &mut ran) };
        self.slot.host = None;
        let stop = match why {
            0 => Stop::Steps,
            1 => Stop::Halt,
            2 => Stop::Asked,
            4 => Stop::Shutdown,
            _ => Stop::Panic,
        };
        (stop, ran)
    }
}
