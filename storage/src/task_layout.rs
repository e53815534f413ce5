//! The numbers that locate Linux's running task: found in a kernel image
//! by the analyzer's `linux_tasks`, used by the tracer to record task
//! events.

/// Where a Linux kernel keeps the running task, as numbers a tracer can use
/// without knowing anything of Linux.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskLayout {
    /// Offset of the running task's pointer from the CPU's per-CPU base
    /// (GS base in kernel mode).
    pub current_task: u64,
    /// Entry of `__switch_to(prev, next)`: RSI holds the next task.
    pub switch_to: u64,
    /// Entry of `__set_task_comm(task, name, exec)`, where it exists.
    pub set_comm: Option<u64>,
    /// Offset of `pid` (the thread id) in `task_struct`.
    pub pid: u64,
    /// Offset of `tgid` (the process id).
    pub tgid: u64,
    /// Offset of `comm` (16 bytes, NUL-terminated).
    pub comm: u64,
}
