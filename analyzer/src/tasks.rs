//! Which Linux task ran each step, followed through the trace's task
//! events, and which tasks an analysis looks at (`--pid`, `--comm`).
//!
//! Every segment of a trace that names tasks opens with the task running
//! there ([`Event::Running`]), so per-segment work knows whose steps it
//! reads without the segments before it.

use std::fmt;

use vtrace_storage::{Event, MAX_CPUS};

/// `TASK_COMM_LEN`: the kernel keeps 15 bytes of a task's name and a NUL.
const COMM_LEN: usize = 16;

/// A task's name, inline so a task's identity is `Copy` and travels in the
/// level engine's items. Longer names (only a crafted trace has them) are
/// cut at a character boundary.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Comm {
    len: u8,
    bytes: [u8; COMM_LEN],
}

impl Comm {
    /// `name`, cut to 15 bytes at a character boundary.
    pub fn new(name: &str) -> Comm {
        let mut end = name.len().min(COMM_LEN);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        let mut bytes = [0; COMM_LEN];
        bytes[..end].copy_from_slice(&name.as_bytes()[..end]);
        Comm {
            len: end as u8,
            bytes,
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // Made from a `&str` cut at a character boundary.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task as the trace names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TaskId {
    /// The thread id (the kernel's `pid`).
    pub tid: u32,
    /// The process (thread group) id.
    pub pid: u32,
    /// Its name (`comm`).
    pub comm: Comm,
}

/// As ftrace names tasks, `comm-pid`, with the thread where it is not the
/// process's first: `comm-pid/tid`.
impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.comm, self.pid)?;
        if self.tid != self.pid {
            write!(f, "/{}", self.tid)?;
        }
        Ok(())
    }
}

/// The running task, as the events read so far name it: each CPU's (a
/// trace of several CPUs names the CPU of the records that follow with
/// [`Event::Cpu`]), the current CPU's answered.
#[derive(Clone, Debug, Default)]
pub struct TaskTracker {
    /// The CPU of the records now.
    cpu: usize,
    /// Each CPU's running task, by CPU.
    current: Vec<Option<TaskId>>,
}

impl TaskTracker {
    /// The running task of the current CPU; `None` before the records
    /// name one.
    pub fn current(&self) -> Option<&TaskId> {
        self.current.get(self.cpu).and_then(Option::as_ref)
    }

    /// Follows one event; true when it changed the running task or its
    /// name (a change of CPU changes the task where the other CPU runs
    /// another).
    pub fn follow(&mut self, event: &Event) -> bool {
        let before = self.current().copied();
        match event {
            Event::Cpu(cpu) => {
                self.cpu = usize::try_from(*cpu).unwrap_or(usize::MAX);
            }
            Event::Task { tid, pid, comm } | Event::Running { tid, pid, comm } => {
                let next = TaskId {
                    tid: *tid,
                    pid: *pid,
                    comm: Comm::new(comm),
                };
                // The decoder keeps CPU numbers below `MAX_CPUS`; a tracker
                // fed other events grows no further.
                if self.current.len() <= self.cpu && self.cpu < MAX_CPUS as usize {
                    self.current.resize(self.cpu + 1, None);
                }
                if let Some(slot) = self.current.get_mut(self.cpu) {
                    *slot = Some(next);
                }
            }
            Event::TaskName { tid, comm } => {
                // A task runs on one CPU at a time; the others' copies
                // of it are renamed too for when they run it again.
                for task in self.current.iter_mut().flatten() {
                    if task.tid == *tid {
                        task.comm = Comm::new(comm);
                    }
                }
            }
            _ => return false,
        }
        self.current().copied() != before
    }
}

/// Which tasks an analysis looks at: all of them when empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskFilter {
    /// Processes (thread groups) by id; any when empty.
    pub pids: Vec<u32>,
    /// Tasks by name; any when empty.
    pub comms: Vec<String>,
}

impl TaskFilter {
    /// True when it lets every step through.
    pub fn is_everything(&self) -> bool {
        self.pids.is_empty() && self.comms.is_empty()
    }

    /// Whether steps of `task` are looked at. Steps the trace names no
    /// task for are, only when the filter is empty.
    pub fn admits(&self, task: Option<&TaskId>) -> bool {
        if self.is_everything() {
            return true;
        }
        let Some(task) = task else {
            return false;
        };
        (self.pids.is_empty() || self.pids.contains(&task.pid))
            && (self.comms.is_empty() || self.comms.iter().any(|c| comm_matches(&task.comm, c)))
    }

    /// The filter in words (`pid 80, comm "sh"`), for headers and messages.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.pids.iter().map(|p| format!("pid {p}")).collect();
        parts.extend(self.comms.iter().map(|c| format!("comm {c:?}")));
        parts.join(", ")
    }
}

/// The running task followed through a segment's records, and whether a
/// filter selects it: what per-segment work needs to skip other tasks'
/// steps.
#[derive(Clone, Debug)]
pub struct Selection<'a> {
    filter: &'a TaskFilter,
    tracker: TaskTracker,
    selected: bool,
}

impl<'a> Selection<'a> {
    /// A selection by `filter`, before any task is named.
    pub fn new(filter: &'a TaskFilter) -> Self {
        Selection {
            filter,
            tracker: TaskTracker::default(),
            selected: filter.admits(None),
        }
    }

    /// Follows one event; true when it changed the running task or its
    /// name.
    pub fn follow(&mut self, event: &Event) -> bool {
        let changed = self.tracker.follow(event);
        if changed {
            self.selected = self.filter.admits(self.tracker.current());
        }
        changed
    }

    /// Whether the running task's steps are looked at.
    pub fn selected(&self) -> bool {
        self.selected
    }

    /// The running task; `None` before the records name one.
    pub fn current(&self) -> Option<&TaskId> {
        self.tracker.current()
    }
}

/// A name the user typed matches the kernel's, which keeps only the first
/// 15 bytes of a longer one.
fn comm_matches(comm: &Comm, typed: &str) -> bool {
    let comm = comm.as_str();
    comm == typed || (comm.len() == COMM_LEN - 1 && typed.starts_with(comm))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(tid: u32, pid: u32, comm: &str) -> Event {
        Event::Task {
            tid,
            pid,
            comm: comm.into(),
        }
    }

    #[test]
    fn names_are_cut_to_the_kernels_length_at_a_character() {
        assert_eq!(Comm::new("sh").as_str(), "sh");
        assert_eq!(
            Comm::new("a-very-long-name-indeed").as_str(),
            "a-very-long-name"
        );
        // 15 ASCII bytes then a two-byte character: cut before it.
        assert_eq!(Comm::new("aaaaaaaaaaaaaaaé").as_str(), "aaaaaaaaaaaaaaa");
    }

    #[test]
    fn the_tracker_keeps_each_cpus_task() {
        let mut t = TaskTracker::default();
        t.follow(&task(1, 1, "a"));
        assert!(t.follow(&Event::Cpu(1)), "CPU 1 runs nothing named yet");
        assert!(t.current().is_none());
        assert!(t.follow(&task(2, 2, "b")));
        assert!(t.follow(&Event::Cpu(0)));
        assert_eq!(t.current().map(|c| c.tid), Some(1));
        assert!(!t.follow(&Event::Cpu(0)), "no change");
        // A rename reaches the task on whichever CPU it runs.
        assert!(!t.follow(&Event::TaskName {
            tid: 2,
            comm: "c".into()
        }));
        assert!(t.follow(&Event::Cpu(1)));
        assert_eq!(t.current().map(|c| c.comm.as_str()), Some("c"));
        // A CPU number past any trace's keeps no task.
        t.follow(&Event::Cpu(u32::MAX));
        assert!(!t.follow(&task(3, 3, "d")) && t.current().is_none());
    }

    #[test]
    fn the_tracker_follows_switches_and_renames_of_the_running_task() {
        let mut t = TaskTracker::default();
        assert!(t.current().is_none());
        assert!(t.follow(&task(5, 5, "sh")));
        assert!(!t.follow(&Event::Running {
            tid: 5,
            pid: 5,
            comm: "sh".into()
        }));
        // Another task renamed: not the running one.
        assert!(!t.follow(&Event::TaskName {
            tid: 6,
            comm: "x".into()
        }));
        assert!(t.follow(&Event::TaskName {
            tid: 5,
            comm: "vtprog".into()
        }));
        assert_eq!(
            t.current().map(|c| (c.pid, c.comm.as_str())),
            Some((5, "vtprog"))
        );
        assert!(!t.follow(&Event::Halt));
    }

    #[test]
    fn the_filter_selects_by_process_and_name() {
        let sh = TaskId {
            tid: 7,
            pid: 5,
            comm: Comm::new("sh"),
        };
        let long = TaskId {
            tid: 9,
            pid: 9,
            // As the kernel keeps "systemd-journald".
            comm: Comm::new("systemd-journal"),
        };
        let all = TaskFilter::default();
        assert!(all.admits(None) && all.admits(Some(&sh)));
        let by_pid = TaskFilter {
            pids: vec![5],
            ..Default::default()
        };
        assert!(by_pid.admits(Some(&sh)) && !by_pid.admits(Some(&long)));
        assert!(!by_pid.admits(None), "unnamed steps are nobody's");
        let by_name = TaskFilter {
            comms: vec!["systemd-journald".into()],
            ..Default::default()
        };
        assert!(by_name.admits(Some(&long)) && !by_name.admits(Some(&sh)));
        let prefix = TaskFilter {
            comms: vec!["systemd".into()],
            ..Default::default()
        };
        assert!(!prefix.admits(Some(&long)), "a name matches whole");
        let both = TaskFilter {
            pids: vec![5],
            comms: vec!["bash".into()],
        };
        assert!(!both.admits(Some(&sh)));
        assert_eq!(both.describe(), "pid 5, comm \"bash\"");
    }
}
