//! The session builder: a VM, and where tracing is asked for its tracer,
//! trace disk, control socket and peeper, assembled in the order that
//! leaves nothing behind on a bad request.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use vtrace_gdb::LiveGdb;
use vtrace_storage::DiskWriter;
use vtrace_storage::{Compression, Recorder};
use vtrace_storage::{SampleVariable, LINUX_TASKS};
use vtrace_trap::{TraceOptions, TraceReport, Tracer};
use vtrace_vmm::{
    user_message, BootSource, ClockMode, ConsoleMode, ControlServer, CpuProfile, Image, Monitor,
    NoMonitor, RunOutcome, Vm, VmConfig,
};

use crate::peep::PeepSetup;
use crate::places::Places;
use crate::request::TraceRequest;
use crate::triggers::{
    capture_note, capture_sites, find_place, function_probes, function_sites, probe_name,
    static_probe_sites,
};
use crate::SessionError;

/// Assembles a [`Session`]: the machine first, then what to trace.
///
/// ```no_run
/// use vtrace_session::{SessionBuilder, TraceRequest};
/// let session = SessionBuilder::new(SessionBuilder::demo())
///     .trace(TraceRequest { from_start: true, ..TraceRequest::default() })
///     .build()?;
/// let outcome = session.run()?;
/// println!("{} steps", outcome.trace.map_or(0, |t| t.recorded_steps));
/// # Ok::<(), vtrace_session::SessionError>(())
/// ```
pub struct SessionBuilder {
    boot: BootSource,
    memory: u64,
    cpus: u8,
    cpu: CpuProfile,
    console: ConsoleMode,
    kvm_device: PathBuf,
    serial_out: Box<dyn Write + Send>,
    clock: Option<ClockMode>,
    control: Option<PathBuf>,
    progress: Option<Duration>,
    trace: Option<TraceRequest>,
    gdb: Option<(vtrace_gdb::Listen, bool)>,
    version: String,
}

impl std::fmt::Debug for SessionBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionBuilder").finish_non_exhaustive()
    }
}

impl SessionBuilder {
    /// A session that boots `boot` with `vtrace run`'s defaults: 256 MiB,
    /// the baseline CPU, output only, guest output to standard output, no
    /// tracing.
    pub fn new(boot: BootSource) -> SessionBuilder {
        SessionBuilder {
            boot,
            memory: 256 << 20,
            cpus: 1,
            cpu: CpuProfile::Baseline,
            console: ConsoleMode::OutputOnly,
            kvm_device: vtrace_vmm::KVM_DEVICE.into(),
            serial_out: Box::new(std::io::stdout()),
            clock: None,
            control: None,
            progress: None,
            trace: None,
            gdb: None,
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// The built-in demo OS, booted as `vtrace run` boots it by default.
    pub fn demo() -> BootSource {
        BootSource::Kernel {
            kernel: Image::embedded("built-in demo OS", vtrace_demo::DEMO_OS_ELF),
            initrd: None,
            cmdline: String::new(),
        }
    }

    /// The built-in demo OS in its SMP mode, for a machine of several CPUs
    /// (see [`cpus`](Self::cpus)).
    pub fn demo_smp() -> BootSource {
        BootSource::Kernel {
            kernel: Image::embedded("built-in demo OS (SMP)", vtrace_demo::DEMO_OS_SMP_ELF),
            initrd: None,
            cmdline: String::new(),
        }
    }

    /// Guest RAM in bytes.
    pub fn memory(mut self, bytes: u64) -> Self {
        self.memory = bytes;
        self
    }

    /// CPUs of the machine (1 to [`vtrace_vmm::MAX_CPUS`]); several run
    /// untraced so far.
    pub fn cpus(mut self, cpus: u8) -> Self {
        self.cpus = cpus;
        self
    }

    /// The CPUID profile.
    pub fn cpu(mut self, cpu: CpuProfile) -> Self {
        self.cpu = cpu;
        self
    }

    /// Whether the console reads the terminal.
    pub fn console(mut self, console: ConsoleMode) -> Self {
        self.console = console;
        self
    }

    /// The KVM device's path.
    pub fn kvm_device(mut self, path: PathBuf) -> Self {
        self.kvm_device = path;
        self
    }

    /// Where the guest's serial output goes.
    pub fn serial_out(mut self, out: Box<dyn Write + Send>) -> Self {
        self.serial_out = out;
        self
    }

    /// How virtual time follows host time; without it, a traced run counts
    /// time in steps (a trace then does not depend on the host's speed)
    /// and an untraced one follows the wall clock.
    pub fn clock(mut self, clock: Option<ClockMode>) -> Self {
        self.clock = clock;
        self
    }

    /// Where a traced run listens for `vtrace ctl`; without it, a path of
    /// the process's own ([`vtrace_vmm::control_socket::default_path`]).
    pub fn control_socket(mut self, path: Option<PathBuf>) -> Self {
        self.control = path;
        self
    }

    /// Print a status line every `every` of host time while stepping.
    pub fn progress(mut self, every: Duration) -> Self {
        self.progress = Some(every);
        self
    }

    /// Trace as `request` says.
    pub fn trace(mut self, request: TraceRequest) -> Self {
        self.trace = Some(request);
        self
    }

    /// Serve gdb at `listen` while the guest runs; `wait`: hold the guest
    /// at its first instruction until gdb attaches.
    pub fn gdb(mut self, listen: vtrace_gdb::Listen, wait: bool) -> Self {
        self.gdb = Some((listen, wait));
        self
    }

    /// The version the trace's metadata says wrote it.
    pub fn version(mut self, version: &str) -> Self {
        self.version = version.to_string();
        self
    }

    /// What a machine of several CPUs cannot do yet.
    fn check_cpus(&self) -> Result<(), SessionError> {
        if self.gdb.is_some() && self.cpus > 1 {
            return Err(SessionError::request(format!(
                "--gdb debugs a machine of one CPU for now, not {}: use --cpus 1",
                self.cpus
            )));
        }
        Ok(())
    }

    /// The socket `vtrace ctl` talks to, where the run traces.
    fn control_server(&self) -> Result<Option<ControlServer>, SessionError> {
        if self.trace.is_none() {
            return Ok(None);
        }
        let path = match self.control.clone() {
            Some(path) => path,
            None => vtrace_vmm::control_socket::default_path(std::process::id())?,
        };
        Ok(Some(ControlServer::bind(&path)?))
    }

    /// Makes the VM, and where tracing is asked the trace disk and the
    /// tracer. Every place, probe and variable is found before the disk is
    /// made: a misspelt routine leaves no file behind.
    pub fn build(self) -> Result<Session, SessionError> {
        let mut notes = Vec::new();
        let traced = self.trace.is_some();
        self.check_cpus()?;
        let clock = self.clock.unwrap_or(match traced {
            true => ClockMode::Steps(1),
            false => ClockMode::Wall,
        });
        let (tasks, kernel_probes, peep) = match &self.trace {
            Some(request) => (
                crate::metadata::linux_tasks(&self.boot, &mut notes),
                KernelProbes::find(&request.probes, &self.boot, &mut notes)?,
                request
                    .peep
                    .as_ref()
                    .map(|p| crate::peep::setup(p, &self.boot))
                    .transpose()?,
            ),
            None => (None, KernelProbes::default(), None),
        };
        let metadata_base = crate::metadata::for_boot("", &self.boot, &self.version);
        let metadata_base_kernel = metadata_base.clone();
        let control = self.control_server()?;
        let control_path = control.as_ref().map(|c| c.path().to_path_buf());
        let initrd = match &self.boot {
            BootSource::Kernel { initrd, .. } => initrd.as_ref().map(|i| i.path.clone()),
            BootSource::RealMode { .. } => None,
        };
        let panic_line = crate::panic_watch::PanicLine::default();
        let serial_out = crate::panic_watch::PanicWatch::new(self.serial_out, panic_line.clone());
        // Bound before the guest boots: a taken address fails at once.
        let gdb = match &self.gdb {
            Some((at, wait)) => Some(LiveGdb::start(at, *wait, gdb_symbols(&self.boot)?)?),
            None => None,
        };
        let mut vm = Vm::new(VmConfig {
            boot: self.boot,
            memory: self.memory,
            cpus: self.cpus,
            cpu: self.cpu,
            console: self.console,
            kvm_device: self.kvm_device,
            serial_out: Box::new(serial_out),
            clock,
            control,
        })?;
        if let Some(every) = self.progress {
            vm.report_progress(every);
        }
        if let Some(request) = &self.trace {
            vm.set_engine(request.engine)?;
        }
        if let Some(p) = &peep {
            // Before the disk is made: a bad address leaves no file behind.
            vm.peep(p.plan.clone())
                .map_err(|e| SessionError::request(format!("--sample: {e}")))?;
        }
        let (tracer, trace_disk) = match self.trace {
            Some(request) => {
                let metadata = vtrace_storage::TraceMetadata {
                    guest: vm.boot_description().to_string(),
                    clock: Some(clock.to_string()),
                    tasks: tasks.is_some().then(|| LINUX_TASKS.to_string()),
                    peep: peep.as_ref().map(|p| p.interval.clone()),
                    samples: peep
                        .as_ref()
                        .filter(|p| !p.variables.is_empty())
                        .map(|p| SampleVariable::list_text(&p.variables)),
                    sample_pc: peep.as_ref().is_some_and(|p| p.plan.pc),
                    cpus: (self.cpus > 1).then_some(u32::from(self.cpus)),
                    engine: (vm.engine() != vtrace_vmm::EngineKind::Step)
                        .then(|| vm.engine().name().to_string()),
                    ..metadata_base
                };
                let parts = TracerParts {
                    metadata,
                    initrd: initrd.as_deref(),
                    tasks,
                    kernel_probes,
                };
                let tracer = tracer(&request, parts, &mut notes)?;
                (Some(tracer), Some(request.disk))
            }
            None => (None, None),
        };
        Ok(Session {
            vm,
            kernel: metadata_base_kernel,
            tracer,
            gdb,
            peep,
            notes,
            control: control_path,
            trace_disk,
            panic_line,
        })
    }
}

/// What gdb loads the kernel's symbols from: its own ELF where it has
/// DWARF, else a file made from its kallsyms and ORC tables.
fn gdb_symbols(boot: &BootSource) -> Result<Option<vtrace_gdb::SymbolFile>, SessionError> {
    let BootSource::Kernel { kernel, .. } = boot else {
        return Ok(None);
    };
    Ok(match vtrace_image::bzimage::vmlinux_inside(&kernel.bytes) {
        Some(vmlinux) => vtrace_gdb::SymbolFile::for_kernel(&vmlinux, None)?,
        None => vtrace_gdb::SymbolFile::for_kernel(&kernel.bytes, kernel.path.as_deref())?,
    })
}

/// What the tracer is made of besides the request.
struct TracerParts<'a> {
    metadata: vtrace_storage::TraceMetadata,
    initrd: Option<&'a Path>,
    tasks: Option<vtrace_storage::TaskLayout>,
    kernel_probes: KernelProbes,
}

/// What the probes asked for need of the kernel's image, found before the
/// run.
#[derive(Default)]
struct KernelProbes {
    /// Static probes' sites.
    sites: Vec<vtrace_trap::StaticSite>,
    /// The kernel's types, where a typed `fn:` probe needs them.
    types: Option<crate::triggers::ProbeTypes>,
    /// The `tp:` probes' sites.
    tracepoints: Vec<vtrace_trap::FunctionProbe>,
}

impl KernelProbes {
    fn find(
        probes: &[String],
        boot: &BootSource,
        notes: &mut Vec<String>,
    ) -> Result<Self, SessionError> {
        Ok(KernelProbes {
            sites: static_probe_sites(probes, boot, notes)?,
            types: crate::triggers::probe_types(probes, boot),
            tracepoints: crate::tracepoint_probes::tracepoint_probes(probes, boot, notes)?,
        })
    }
}

/// Finds the request's places, then creates the trace disk and the
/// tracer.
fn tracer(
    request: &TraceRequest,
    parts: TracerParts<'_>,
    notes: &mut Vec<String>,
) -> Result<Tracer, SessionError> {
    let TracerParts {
        metadata,
        initrd,
        tasks,
        kernel_probes:
            KernelProbes {
                sites: probe_sites,
                types: probe_types,
                tracepoints: tracepoint_probes,
            },
    } = parts;
    let mut places = Places::new(&metadata, initrd, tasks.is_some());
    let start_at = find_place(&mut places, &request.start_at, "--start-at", notes)?;
    let stop_at = find_place(&mut places, &request.stop_at, "--stop-at", notes)?;
    let captures = capture_sites(&request.captures, &mut places, notes)?;
    let functions = function_sites(&request.functions, &mut places, start_at.is_some(), notes)?;
    let taken = usize::from(start_at.is_some()) + functions.len();
    let mut function_probes = function_probes(
        &request.probes,
        &mut places,
        probe_types.as_ref(),
        taken,
        notes,
    )?;
    // Breakpoints while tracing is off go to the start place first, then
    // the routines' entries, the fn: probes, the tracepoints' sites where
    // all fit, then the captures.
    let taken = taken + function_probes.iter().filter(|p| p.untraced).count();
    let mut tracepoint_probes = tracepoint_probes;
    let room = vtrace_x86::dr::BREAKPOINTS.saturating_sub(taken);
    let taken =
        taken + crate::tracepoint_probes::place_breakpoints(&mut tracepoint_probes, room, notes);
    function_probes.extend(tracepoint_probes);
    notes.extend(capture_note(&captures, taken));
    let disk = DiskWriter::create_over(
        &request.disk,
        request.disk_size,
        request.segment_size,
        request.wrap,
        &metadata.to_text(),
        request.replace,
    )?;
    let options = TraceOptions {
        from_start: request.from_start,
        max_steps: request.max_steps,
        record_values: request.record_values,
        autostop: request.autostop.clone(),
        start_at: start_at.as_ref().map(|p| p.address),
        start_label: request.start_at.as_ref().map(ToString::to_string),
        stop_at: stop_at.as_ref().map(|p| p.address),
        start_in: start_at.and_then(|p| p.task),
        stop_in: stop_at.and_then(|p| p.task),
        exit_after_trace: request.exit_after_trace,
        pairing: !request.serial_steps,
        obey_guest: request.obey_guest,
        trap_flag_host: vtrace_vmm::steps_with_trap_flag(),
        linux_tasks: tasks,
        captures,
        functions,
        probe_sites,
        function_probes,
        probes_enabled: request.probes.iter().map(|p| probe_name(p)).collect(),
    };
    // Two CPUs step at once where several are traced (see `--serial-steps`).
    let stepping = match options.pairing && metadata.cpus.is_some() {
        true => 2,
        false => 1,
    };
    let recorder = Recorder::start_with(disk, Compression::beside_threads(stepping));
    Ok(Tracer::new(recorder, options).on_announce(user_message))
}

/// A VM ready to boot, with its tracer where one was asked for.
pub struct Session {
    vm: Vm,
    /// What the trace would say of the kernel: where a crash report's
    /// RIP is named from.
    kernel: vtrace_storage::TraceMetadata,
    tracer: Option<Tracer>,
    /// gdb's server, where the run serves it.
    gdb: Option<LiveGdb>,
    peep: Option<PeepSetup>,
    notes: Vec<String>,
    control: Option<PathBuf>,
    trace_disk: Option<PathBuf>,
    panic_line: crate::panic_watch::PanicLine,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").finish_non_exhaustive()
    }
}

/// How a session ended.
#[derive(Debug)]
pub struct SessionOutcome {
    /// What became of the guest.
    pub run: RunOutcome,
    /// What the tracer recorded, where the session traced.
    pub trace: Option<TraceReport>,
    /// The guest kernel's panic line ("Kernel panic - not syncing: ..."),
    /// where its console printed one: the run ended after a panic, however
    /// the machine then stopped.
    pub kernel_panic: Option<String>,
}

impl Session {
    /// What the user should know of the request before the guest boots
    /// (where a user program's routine fires, what cannot be followed),
    /// each a line of its own.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// How the guest is loaded, for the user.
    pub fn boot_description(&self) -> &str {
        self.vm.boot_description()
    }

    /// Where `vtrace ctl` reaches the run, when it traces.
    pub fn control_socket(&self) -> Option<&Path> {
        self.control.as_deref()
    }

    /// Where gdb connects, when the run serves it.
    pub fn gdb_address(&self) -> Option<&str> {
        self.gdb.as_ref().map(|g| g.address())
    }

    /// The symbol file gdb is offered as it connects, and what it holds.
    pub fn gdb_symbols(&self) -> Option<(&Path, &str)> {
        let file = self.gdb.as_ref()?.symbols()?;
        Some((file.path(), file.what.as_str()))
    }

    /// The trace disk, when the run traces.
    pub fn trace_disk(&self) -> Option<&Path> {
        self.trace_disk.as_deref()
    }

    /// What the run peeps at, when it does.
    pub fn peeping(&self) -> Option<&PeepSetup> {
        self.peep.as_ref()
    }

    /// Boots the guest and runs it to its end. The trace is finished (its
    /// disk flushed and closed) whatever became of the guest; an error of
    /// the run is returned after that.
    pub fn run(mut self) -> Result<SessionOutcome, SessionError> {
        let mut none = NoMonitor;
        let monitor: &mut dyn Monitor = match self.tracer.as_mut() {
            Some(t) => t,
            None => &mut none,
        };
        let mut outcome = match self.gdb.as_mut().and_then(|g| g.monitor(monitor)) {
            Some(mut held) => {
                let outcome = self.vm.run(&mut held);
                if let Ok(o) = &outcome {
                    held.ended(o.exit);
                }
                outcome
            }
            None => match self.tracer.as_mut() {
                Some(t) => self.vm.run(t),
                None => self.vm.run(&mut NoMonitor),
            },
        };
        if let Some(gdb) = self.gdb.take() {
            gdb.finish();
        }
        if let Some(report) = outcome.as_mut().err().and_then(|e| e.crash_report_mut()) {
            report.rip_named =
                crate::places::routine_at(&self.kernel, report.regs.rip, report.sregs.cr3);
        }
        let trace = self.tracer.map(Tracer::finish).transpose()?;
        let kernel_panic = self
            .panic_line
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        Ok(SessionOutcome {
            run: outcome?,
            trace,
            kernel_panic,
        })
    }
}
