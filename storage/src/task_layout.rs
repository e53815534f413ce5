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
    /// Entry of `do_exit(code)`, where it exists: the running task exits
    /// with the wait status in RDI.
    pub exit: Option<u64>,
    /// Offset of `pid` (the thread id) in `task_struct`.
    pub pid: u64,
    /// Offset of `tgid` (the process id).
    pub tgid: u64,
    /// Offset of `comm` (16 bytes, NUL-terminated).
    pub comm: u64,
    /// Where processes keep their memory maps, where the kernel's are
    /// readable (see [`MapLayout`]).
    pub maps: Option<MapLayout>,
    /// Offset from the per-CPU base of the CPU's run-queue length
    /// (`runqueues.nr_running`, 32 bits), where the kernel's BTF has it.
    pub nr_running: Option<u64>,
}

/// Where a Linux kernel keeps a process's memory map, and where a tracer
/// learns that it changed: the numbers a tracer needs to record the files
/// a process maps, without knowing anything of Linux.
///
/// The map is read from the process's maple tree of VMAs (kernels 6.1 and
/// later), whose node format is fixed by the kernel, not by its
/// configuration; only the offsets below vary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapLayout {
    /// Offset of `mm` (the process's `mm_struct`, 0 in kernel threads) in
    /// `task_struct`.
    pub mm: u64,
    /// Offset of the maple tree's root pointer (`mm_mt.ma_root`) in
    /// `mm_struct`.
    pub tree_root: u64,
    /// Offsets of `vm_start`, `vm_end`, `vm_pgoff` and `vm_file` in
    /// `vm_area_struct`.
    pub vm_start: u64,
    /// See [`MapLayout::vm_start`].
    pub vm_end: u64,
    /// See [`MapLayout::vm_start`].
    pub vm_pgoff: u64,
    /// See [`MapLayout::vm_start`].
    pub vm_file: u64,
    /// Offset of the file's dentry (`f_path.dentry`) in `struct file`.
    pub file_dentry: u64,
    /// Offset of `d_parent` in `struct dentry`.
    pub d_parent: u64,
    /// Offset of the name's pointer (`d_name.name`) in `struct dentry`.
    pub d_name: u64,
    /// Entry of the 64-bit system call (`entry_SYSCALL_64`): RAX holds the
    /// call's number there.
    pub syscall_entry: u64,
    /// Entry of `syscall_exit_to_user_mode`: a call's work is done, the
    /// process's map is whole again and the kernel's page tables are
    /// still loaded.
    pub syscall_exit: u64,
}
