//! Function windows (`vtrace run --trace-function`): tracing from a
//! routine's entry until it returns to its caller, its callees and the
//! interrupts taken meanwhile included, as uftrace's `-F` and the old
//! tracer's start and stop at function names did.
//!
//! A window opens where a breakpoint at the routine's first instruction
//! fires while tracing is off. It closes where execution reaches the
//! return address found on the stack at entry with the stack pointer above
//! the entry's, so a recursive call of the routine (lower on the same
//! stack) does not close it. While it is open, the CPU may leave the
//! routine's task: the scheduler runs others, and a task entry (which
//! never returns) leaves for good. Stepping goes on, so that the return is
//! seen, but a filtering sink keeps what runs elsewhere off the trace,
//! between a stop and a start that say why.
//!
//! The routine's task is told by the Linux task the trace names where
//! tasks are known, else by the address space (CR3) its steps run in.
//!
//! On a machine of several CPUs a window is the call on the CPU whose
//! breakpoint fired: every CPU is stepped while it is open (the step
//! clock's order stays the same), but only that CPU's records reach the
//! trace, and only its return closes it. One window is open at a time:
//! the routine's calls on other CPUs meanwhile are counted, not traced.

use vtrace_storage::{Event, FunctionEdge, Recorder, Step, TraceReason};

use crate::engine::RecordSink;

/// One `--trace-function` routine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionSite {
    /// Its name, for the trace's start and stop reasons.
    pub name: String,
    /// The linear address of its first instruction.
    pub entry: u64,
    /// Windows open only in tasks of this name (a user program's routine).
    pub task: Option<String>,
}

/// What the windows of one routine came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WindowCount {
    /// The routine's name.
    pub name: String,
    /// Windows opened: calls reached while tracing was off.
    pub calls: u64,
    /// Windows closed by the routine returning.
    pub returned: u64,
    /// Calls of the routine inside its own window (recursion).
    pub recursive: u64,
    /// Times the CPU left the routine's task inside a window.
    pub switched_out: u64,
    /// Calls of the routine on other CPUs while a window was open: not
    /// traced (one window at a time).
    pub elsewhere: u64,
    /// Windows closed by anything else: the run ended, a limit, the
    /// user (a routine that never returns, such as a task's entry).
    pub unfinished: u64,
}

/// The task a window belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// The address space of the window's first step, still to come.
    FirstSpace,
    /// The address space its steps run in.
    Space(u64),
    /// The Linux task of the window's first task event, still to come.
    FirstTask,
    /// The Linux task (tid) running at its entry.
    Task(u32),
}

/// An open window.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    site: usize,
    /// Where the routine returns to (`None`: the stack was unreadable at
    /// entry, and only the run's end or the user closes the window).
    ret: Option<u64>,
    /// The stack pointer at entry, the return address on top.
    sp: u64,
    owner: Owner,
    /// The Linux task running now, from the task events.
    running: Option<u32>,
    /// The CPU is in another task: nothing is recorded.
    away: bool,
    /// The CPU the routine was called on.
    cpu: u32,
}

/// The run's `--trace-function` routines and the window open, if any.
pub(crate) struct Windows {
    sites: Vec<FunctionSite>,
    counts: Vec<WindowCount>,
    open: Option<Window>,
    by_task: bool,
    /// The CPU whose exits come now.
    on_stage: u32,
}

impl Windows {
    /// `by_task`: the trace names Linux tasks (see the module
    /// documentation).
    pub(crate) fn new(sites: Vec<FunctionSite>, by_task: bool) -> Windows {
        let counts = sites
            .iter()
            .map(|s| WindowCount {
                name: s.name.clone(),
                ..WindowCount::default()
            })
            .collect();
        Windows {
            sites,
            counts,
            open: None,
            by_task,
            on_stage: 0,
        }
    }

    /// The exits that follow are CPU `cpu`'s.
    pub(crate) fn turn_to(&mut self, cpu: u32) {
        self.on_stage = cpu;
    }

    /// Whether a window is open: the trace holds its CPU's records only,
    /// and needs no word of the others'.
    pub(crate) fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// The routines' entries, for the breakpoints while tracing is off.
    pub(crate) fn entries(&self) -> impl Iterator<Item = u64> + '_ {
        self.sites.iter().map(|s| s.entry)
    }

    /// The routine whose entry is at `pc`.
    pub(crate) fn site_at(&self, pc: u64) -> Option<(usize, &FunctionSite)> {
        self.sites.iter().enumerate().find(|(_, s)| s.entry == pc)
    }

    /// Opens a window of routine `site`, entered on the CPU on stage with
    /// `sp` the stack pointer and `ret` the return address on it; returns
    /// the reason tracing starts.
    pub(crate) fn open(&mut self, site: usize, ret: Option<u64>, sp: u64) -> TraceReason {
        self.counts[site].calls += 1;
        self.open = Some(Window {
            site,
            ret,
            sp,
            owner: if self.by_task {
                Owner::FirstTask
            } else {
                Owner::FirstSpace
            },
            running: None,
            away: false,
            cpu: self.on_stage,
        });
        self.reason(site, FunctionEdge::Entry)
    }

    /// Looks at the instruction about to run, at `pc` with stack pointer
    /// `sp`, inside the open window: a recursive call is counted; the
    /// return to the caller closes the window, and the reason tracing
    /// stops is returned. Other CPUs' instructions are not the call's.
    pub(crate) fn before(&mut self, pc: u64, sp: u64) -> Option<TraceReason> {
        let w = self.open.as_ref()?;
        let site = w.site;
        if w.cpu != self.on_stage {
            if pc == self.sites[site].entry {
                self.counts[site].elsewhere += 1;
            }
            return None;
        }
        if w.away {
            return None;
        }
        if w.ret == Some(pc) && sp > w.sp {
            self.counts[site].returned += 1;
            self.open = None;
            return Some(self.reason(site, FunctionEdge::Return));
        }
        if pc == self.sites[site].entry {
            self.counts[site].recursive += 1;
        }
        None
    }

    /// Closes the open window, if any, for a reason other than its
    /// return. Returns whether the trace already shows it stopped (the CPU
    /// was in another task).
    pub(crate) fn abandon(&mut self) -> bool {
        let Some(w) = self.open.take() else {
            return false;
        };
        self.counts[w.site].unfinished += 1;
        w.away
    }

    pub(crate) fn counts(&self) -> Vec<WindowCount> {
        self.counts.clone()
    }

    fn reason(&self, site: usize, edge: FunctionEdge) -> TraceReason {
        TraceReason::Function {
            name: self.sites[site].name.clone(),
            edge,
        }
    }

    /// Where records go: through a [`WindowSink`] while a window is
    /// open, nowhere from the other CPUs meanwhile, else straight to
    /// `recorder`.
    pub(crate) fn route<'a>(&'a mut self, recorder: &'a mut Recorder) -> Route<'a> {
        match self.open.as_mut() {
            Some(window) if window.cpu != self.on_stage => Route::OtherCpu,
            Some(window) => Route::Window(WindowSink {
                recorder,
                count: &mut self.counts[window.site],
                window,
            }),
            None => Route::Plain(recorder),
        }
    }
}

/// The sink records go to, chosen per exit by [`Windows::route`].
pub(crate) enum Route<'a> {
    Plain(&'a mut Recorder),
    Window(WindowSink<'a>),
    /// A CPU other than the open window's: its records are not the call's.
    OtherCpu,
}

impl RecordSink for Route<'_> {
    fn step(&mut self, step: &Step) {
        match self {
            Route::Plain(r) => r.step(step),
            Route::Window(w) => w.step(step),
            Route::OtherCpu => {}
        }
    }

    fn event(&mut self, event: &Event) {
        match self {
            Route::Plain(r) => r.event(event),
            Route::Window(w) => w.event(event),
            Route::OtherCpu => {}
        }
    }
}

impl Window {
    /// Whether a step in address space `cr3` runs in the window's task,
    /// which the first one names.
    fn owns_step(&mut self, cr3: u64) -> bool {
        match self.owner {
            Owner::FirstSpace => {
                self.owner = Owner::Space(cr3);
                true
            }
            Owner::Space(space) => space == cr3,
            Owner::Task(tid) => self.running == Some(tid),
            Owner::FirstTask => true,
        }
    }

    /// Whether task `tid`, which runs from now on, is the window's (the
    /// first one named is).
    fn owns_task(&mut self, tid: u32) -> Option<bool> {
        self.running = Some(tid);
        match self.owner {
            Owner::FirstTask => {
                self.owner = Owner::Task(tid);
                Some(true)
            }
            Owner::Task(owner) => Some(owner == tid),
            Owner::FirstSpace | Owner::Space(_) => None,
        }
    }
}

/// The sink for records while a window is open: those of the routine's
/// task go to the recorder, the others nowhere, with a stop where the CPU
/// leaves the task and a start where it comes back.
pub(crate) struct WindowSink<'a> {
    recorder: &'a mut Recorder,
    window: &'a mut Window,
    /// The routine's counts (and name, for the reasons).
    count: &'a mut WindowCount,
}

impl WindowSink<'_> {
    /// The CPU is in the window's task (`true`) or not: records the
    /// change, if it is one.
    fn arrive(&mut self, owned: bool) {
        let w = &mut *self.window;
        let was_owned = !w.away;
        if owned == was_owned {
            return;
        }
        w.away = !owned;
        let name = self.count.name.clone();
        let event = if owned {
            Event::TraceStart(TraceReason::Function {
                name,
                edge: FunctionEdge::SwitchedIn,
            })
        } else {
            self.count.switched_out += 1;
            Event::TraceStop(TraceReason::Function {
                name,
                edge: FunctionEdge::SwitchedOut,
            })
        };
        self.recorder.event(&event);
    }
}

impl RecordSink for WindowSink<'_> {
    fn step(&mut self, step: &Step) {
        let owned = self.window.owns_step(step.cr3);
        self.arrive(owned);
        if owned {
            self.recorder.step(step);
        }
    }

    fn event(&mut self, event: &Event) {
        if let Event::Task { tid, .. } = event {
            if let Some(owned) = self.window.owns_task(*tid) {
                self.arrive(owned);
            }
        }
        if !self.window.away {
            self.recorder.event(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtrace_storage::DiskWriter;
    use vtrace_storage::{Record, TraceReader};

    fn site(name: &str, entry: u64) -> FunctionSite {
        FunctionSite {
            name: name.into(),
            entry,
            task: None,
        }
    }

    /// A recorder writing a trace `w.vtd` in `dir`, and its path.
    fn recorder_in(dir: &std::path::Path) -> (std::path::PathBuf, Recorder) {
        let path = dir.join("w.vtd");
        let disk = DiskWriter::create(&path, 1 << 20, 64 << 10, false, "").unwrap();
        (path, Recorder::start(disk))
    }

    /// Every record of the trace at `path`.
    fn recorded(path: &std::path::Path) -> Vec<Record> {
        let reader = TraceReader::open(path).unwrap();
        (0..reader.segments().len())
            .flat_map(|i| reader.decode(i).unwrap())
            .collect()
    }

    fn step(pc: u64, cr3: u64) -> Step {
        Step {
            pc,
            bytes: vtrace_storage::InsnBytes::new(&[0x90]).unwrap(),
            cr3,
            ..Step::default()
        }
    }

    #[test]
    fn a_recursive_call_does_not_close_the_window_its_return_does() {
        let mut w = Windows::new(vec![site("fact", 0x1000)], false);
        w.open(0, Some(0x2005), 0x8000);
        // fact calls itself: entry again, lower on the stack.
        assert_eq!(w.before(0x1000, 0x7fe0), None);
        // The inner call returns into fact, not to the caller.
        assert_eq!(w.before(0x1010, 0x7fe8), None);
        // A return to the caller's address from deeper down (the inner
        // call's frame, were fact called from there too) does not close it.
        assert_eq!(w.before(0x2005, 0x7ff8), None);
        let closed = w.before(0x2005, 0x8008);
        assert_eq!(
            closed,
            Some(TraceReason::Function {
                name: "fact".into(),
                edge: FunctionEdge::Return
            })
        );
        let c = &w.counts()[0];
        assert_eq!(
            (c.calls, c.returned, c.recursive, c.unfinished),
            (1, 1, 1, 0)
        );
        assert_eq!(w.before(0x2005, 0x8008), None, "closed once");
    }

    #[test]
    fn other_address_spaces_are_kept_off_the_trace_between_a_stop_and_a_start() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut recorder) = recorder_in(dir.path());
        let mut windows = Windows::new(vec![site("task", 0x1000)], false);
        windows.open(0, None, 0x8000);
        {
            let mut sink = windows.route(&mut recorder);
            sink.step(&step(0x1000, 0xa000));
            sink.step(&step(0x1001, 0xa000));
            // The scheduler runs another task.
            sink.step(&step(0x3000, 0xb000));
            sink.event(&Event::Halt);
            sink.step(&step(0x3001, 0xb000));
            // Back.
            sink.step(&step(0x1002, 0xa000));
        }
        assert!(!windows.abandon(), "in its task at the end");
        assert_eq!(windows.counts()[0].switched_out, 1);
        assert_eq!(windows.counts()[0].unfinished, 1);
        recorder.finish().unwrap();
        let records: Vec<String> = recorded(&path)
            .into_iter()
            .map(|r| match r {
                Record::Step(s) => format!("{:#x}", s.pc),
                Record::Event(Event::TraceStart(r)) => format!("start {}", r.token()),
                Record::Event(Event::TraceStop(r)) => format!("stop {}", r.token()),
                Record::Event(e) => format!("{e:?}"),
            })
            .collect();
        assert_eq!(
            records,
            [
                "0x1000",
                "0x1001",
                "stop function:switched_out:task",
                "start function:switched_in:task",
                "0x1002"
            ]
        );
    }

    #[test]
    fn a_window_records_and_closes_on_its_own_cpu_only() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut recorder) = recorder_in(dir.path());
        let mut windows = Windows::new(vec![site("take_work", 0x1000)], false);
        windows.turn_to(1);
        windows.open(0, Some(0x2005), 0x8000);
        assert!(windows.is_open());
        windows.route(&mut recorder).step(&step(0x1000, 0xa000));
        windows.turn_to(0);
        // CPU 0 calls it too: counted, not traced.
        assert_eq!(windows.before(0x1000, 0x9000), None);
        assert_eq!(windows.counts()[0].elsewhere, 1);
        // CPU 0 returns to the same caller, from its own stack at the
        // same address: not the call's return.
        assert_eq!(windows.before(0x2005, 0x8008), None);
        {
            let mut sink = windows.route(&mut recorder);
            sink.step(&step(0x2005, 0xb000));
            sink.event(&Event::Halt);
        }
        windows.turn_to(1);
        windows.route(&mut recorder).step(&step(0x1001, 0xa000));
        assert_eq!(
            windows.before(0x2005, 0x8008).map(|r| r.token()).as_deref(),
            Some("function:return:take_work")
        );
        assert!(!windows.is_open());
        assert_eq!(windows.counts()[0].switched_out, 0, "CPU 0 is not a task");
        assert_eq!(windows.counts()[0].elsewhere, 1, "counted once");
        recorder.finish().unwrap();
        let records: Vec<String> = recorded(&path)
            .into_iter()
            .map(|r| match r {
                Record::Step(s) => format!("{:#x}", s.pc),
                Record::Event(e) => format!("{e:?}"),
            })
            .collect();
        assert_eq!(records, ["0x1000", "0x1001"]);
    }

    #[test]
    fn a_linux_window_follows_its_task_by_the_task_events() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut recorder) = recorder_in(dir.path());
        let mut windows = Windows::new(vec![site("do_sys_open", 0x1000)], true);
        windows.open(0, Some(0x2000), 0x8000);
        let task = |tid| Event::Task {
            tid,
            pid: tid,
            comm: "t".into(),
        };
        {
            let mut sink = windows.route(&mut recorder);
            sink.event(&task(7));
            sink.step(&step(0x1000, 0xa000));
            // Another task in the same address space (a kernel thread).
            sink.event(&task(9));
            sink.step(&step(0x5000, 0xa000));
            sink.event(&task(7));
            sink.step(&step(0x1001, 0xc000));
        }
        assert_eq!(
            windows.before(0x2000, 0x8008).map(|r| r.token()).as_deref(),
            Some("function:return:do_sys_open")
        );
        recorder.finish().unwrap();
        let steps: Vec<u64> = recorded(&path)
            .into_iter()
            .filter_map(|r| match r {
                Record::Step(s) => Some(s.pc),
                _ => None,
            })
            .collect();
        assert_eq!(steps, [0x1000, 0x1001]);
    }
}
