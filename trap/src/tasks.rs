//! Which Linux task the CPU runs, read from the kernel's own data where
//! tracing starts and where the kernel switches or renames tasks (see
//! [`TaskLayout`] for what locates them), and which files each process
//! maps, read where the trace first meets a process and where a system
//! call that changes its map returns. Between those places nothing is
//! read: the per-step cost is a few comparisons of the next pc.

use std::collections::HashMap;

use vtrace_storage::{Event, MapLayout, Mapping, TaskLayout};
use vtrace_vmm::CpuView;
use vtrace_x86::msr::KERNEL_GS_BASE;

use crate::engine::{Engine, RecordSink};
use crate::maple;

/// The lowest address of the kernel half of a 4-level address space.
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;
/// `TASK_COMM_LEN`.
const COMM_LEN: usize = 16;
/// `PID_MAX_LIMIT` on 64-bit kernels: anything above is not a pid.
const PID_MAX: u32 = 4 << 20;
/// VMAs read at most per process (the kernel's default `max_map_count`).
const MAX_VMAS: usize = 65_530;
/// File mappings recorded at most per process.
const MAX_MAPPINGS: usize = 1024;
/// Directories a file's path is followed up through at most.
const MAX_PATH_DEPTH: usize = 64;
/// `NAME_MAX`.
const NAME_MAX: usize = 255;
/// System calls that change which files a process maps: `mmap`, `munmap`,
/// `mremap` (an exec is caught where it renames the task).
const MAP_SYSCALLS: [u64; 3] = [9, 11, 25];

/// A task as the trace names it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Task {
    tid: u32,
    pid: u32,
    comm: String,
}

/// Follows the running task of a Linux guest, on each of its CPUs.
pub struct TaskWatch {
    layout: TaskLayout,
    /// What the CPU on stage runs.
    on: OnCpu,
    /// The CPU on stage, and the others' states (see [`TaskWatch::turn_to`]).
    cpu: usize,
    parked: Vec<OnCpu>,
    maps: Option<MapWatch>,
}

/// What one CPU runs, as the trace last named it.
#[derive(Clone, Debug, Default)]
struct OnCpu {
    /// The task the last event named.
    current: Option<Task>,
    /// Where its `task_struct` is.
    current_at: u64,
    /// The length of this CPU's run queue last recorded.
    runnable: Option<u32>,
    /// The running process's map is to be read where its system call
    /// returns.
    maps_pending: bool,
}

/// Follows the memory maps of a Linux guest's processes.
struct MapWatch {
    layout: MapLayout,
    /// The map last recorded per process, in this tracing window.
    recorded: HashMap<u32, Vec<Mapping>>,
}

impl TaskWatch {
    /// Watches tasks as `layout` says the kernel keeps them.
    pub fn new(layout: TaskLayout) -> TaskWatch {
        TaskWatch {
            maps: layout.maps.map(|layout| MapWatch {
                layout,
                recorded: HashMap::new(),
            }),
            layout,
            on: OnCpu::default(),
            cpu: 0,
            parked: Vec::new(),
        }
    }

    /// The VMM turned to CPU `cpu`: what it runs comes on stage.
    pub fn turn_to(&mut self, cpu: usize) {
        if cpu == self.cpu {
            return;
        }
        let needed = cpu.max(self.cpu) + 1;
        if self.parked.len() < needed {
            self.parked.resize_with(needed, OnCpu::default);
        }
        // As the tracer's engines trade places (see `tracer::cpus`).
        std::mem::swap(&mut self.on, &mut self.parked[self.cpu]);
        std::mem::swap(&mut self.on, &mut self.parked[cpu]);
        self.cpu = cpu;
    }

    /// A tracing window opens: it names every process's map again.
    pub fn new_window(&mut self) {
        if let Some(maps) = &mut self.maps {
            maps.recorded.clear();
        }
    }

    /// Tracing starts: records the running task, found through the
    /// per-CPU base (GS base in the kernel, the kernel's GS base saved by
    /// SWAPGS in user mode), and what the first instruction does to it
    /// (tracing may start on a switch: `--start-at __switch_to`).
    pub fn begin(&mut self, engine: &mut Engine, cpu: &mut dyn CpuView, sink: &mut dyn RecordSink) {
        self.on = OnCpu {
            // In user mode the kernel's half may not be mapped (page-table
            // isolation): where the map cannot be read now, it is read
            // where the next system call returns.
            maps_pending: self.maps.is_some(),
            ..OnCpu::default()
        };
        self.name_running(engine, cpu, sink);
        if let Some(pc) = engine.next_pc() {
            self.before(pc, engine, cpu, sink);
        }
    }

    fn name_running(
        &mut self,
        engine: &mut Engine,
        cpu: &mut dyn CpuView,
        sink: &mut dyn RecordSink,
    ) {
        let Some(base) = per_cpu_base(cpu) else {
            return;
        };
        self.count_runnable(engine, cpu, base, sink);
        let Some(at) = self.running_at(engine, cpu, base) else {
            return;
        };
        if let Some(task) = self.task(engine, cpu, at) {
            self.switch(task, at, sink);
            self.map_new_process(engine, cpu, sink);
        }
    }

    /// Where the running task's `task_struct` is, read from the per-CPU
    /// area at `base`.
    fn running_at(&self, engine: &mut Engine, cpu: &mut dyn CpuView, base: u64) -> Option<u64> {
        read_u64(engine, cpu, base.checked_add(self.layout.current_task)?)
    }

    /// The instruction at `pc` is about to run.
    pub fn before(
        &mut self,
        pc: u64,
        engine: &mut Engine,
        cpu: &mut dyn CpuView,
        sink: &mut dyn RecordSink,
    ) {
        if pc == self.layout.switch_to {
            // __switch_to(prev, next): the kernel runs `next` from here,
            // in its address space already.
            let next = cpu.regs().rsi;
            let base = cpu.sregs().gs.base;
            if base >= KERNEL_HALF {
                self.count_runnable(engine, cpu, base, sink);
            }
            if let Some(task) = self.task(engine, cpu, next) {
                self.switch(task, next, sink);
                self.map_new_process(engine, cpu, sink);
            }
        } else if Some(pc) == self.layout.set_comm {
            // __set_task_comm(task, name, exec).
            let regs = cpu.regs();
            let Some(tid) = read_id(engine, cpu, regs.rdi, self.layout.pid) else {
                return;
            };
            let Some(comm) = read_text(engine, cpu, regs.rsi, COMM_LEN - 1) else {
                return;
            };
            if let Some(current) = self.on.current.as_mut().filter(|c| c.tid == tid) {
                current.comm.clone_from(&comm);
            }
            sink.event(&Event::TaskName { tid, comm });
            if self.maps.is_some() && regs.rdx & 0xff != 0 {
                // An exec: the new program is mapped by the time it returns.
                self.on.maps_pending = true;
            }
        } else if Some(pc) == self.layout.exit {
            self.exit(engine, cpu, sink);
        } else if let Some(maps) = &self.maps {
            if pc == maps.layout.syscall_entry {
                if MAP_SYSCALLS.contains(&cpu.regs().rax) {
                    self.on.maps_pending = true;
                }
            } else if self.on.maps_pending && pc == maps.layout.syscall_exit {
                self.on.maps_pending = false;
                self.map_current(engine, cpu, sink);
            }
        }
    }

    /// The name of the task running now, read afresh from the kernel's
    /// data (tracing may be off: nothing followed the switches).
    pub fn running_comm(&self, engine: &mut Engine, cpu: &mut dyn CpuView) -> Option<String> {
        // Untraced, the guest may have changed its page tables unseen.
        engine.forget_translations();
        let base = per_cpu_base(cpu)?;
        let at = self.running_at(engine, cpu, base)?;
        read_text(engine, cpu, at.checked_add(self.layout.comm)?, COMM_LEN - 1)
    }

    /// `do_exit(code)`: the running task exits. Its thread id is read
    /// again rather than taken from the last switch, which tracing may
    /// have started after.
    fn exit(&mut self, engine: &mut Engine, cpu: &mut dyn CpuView, sink: &mut dyn RecordSink) {
        let code = cpu.regs().rdi as u32;
        let tid = per_cpu_base(cpu)
            .and_then(|base| self.running_at(engine, cpu, base))
            .and_then(|at| read_id(engine, cpu, at, self.layout.pid));
        if let Some(tid) = tid {
            sink.event(&Event::TaskExit { tid, code });
        }
    }

    /// Records the length of the run queue of the CPU whose per-CPU area
    /// is at `base`, where it changed.
    fn count_runnable(
        &mut self,
        engine: &mut Engine,
        cpu: &mut dyn CpuView,
        base: u64,
        sink: &mut dyn RecordSink,
    ) {
        let Some(at) = self.layout.nr_running.and_then(|o| base.checked_add(o)) else {
            return;
        };
        let mut bytes = [0u8; 4];
        if !engine.read_kernel(cpu, at, &mut bytes) {
            return;
        }
        let count = u32::from_le_bytes(bytes);
        // More runnable tasks than there can be pids is not a count.
        if count > PID_MAX || self.on.runnable == Some(count) {
            return;
        }
        self.on.runnable = Some(count);
        sink.event(&Event::Runnable { count });
    }

    /// Records the running process's map where this window has not yet.
    fn map_new_process(
        &mut self,
        engine: &mut Engine,
        cpu: &mut dyn CpuView,
        sink: &mut dyn RecordSink,
    ) {
        let (Some(maps), Some(task)) = (&self.maps, &self.on.current) else {
            return;
        };
        if !maps.recorded.contains_key(&task.pid) {
            self.map_current(engine, cpu, sink);
        }
    }

    /// Reads the running process's map and records it where it changed.
    fn map_current(
        &mut self,
        engine: &mut Engine,
        cpu: &mut dyn CpuView,
        sink: &mut dyn RecordSink,
    ) {
        let (Some(maps), Some(task)) = (&mut self.maps, &self.on.current) else {
            return;
        };
        let Some(now) = read_maps(&maps.layout, engine, cpu, self.on.current_at) else {
            return;
        };
        let pid = task.pid;
        if maps.recorded.get(&pid) == Some(&now) {
            return;
        }
        // A kernel thread maps nothing: remembered, not recorded.
        if !now.is_empty() || maps.recorded.contains_key(&pid) {
            sink.event(&Event::Mappings {
                pid,
                maps: now.clone(),
            });
        }
        maps.recorded.insert(pid, now);
    }

    fn switch(&mut self, task: Task, at: u64, sink: &mut dyn RecordSink) {
        self.on.current_at = at;
        if self.on.current.as_ref() == Some(&task) {
            return;
        }
        sink.event(&Event::Task {
            tid: task.tid,
            pid: task.pid,
            comm: task.comm.clone(),
        });
        self.on.current = Some(task);
    }

    /// The task whose `task_struct` is at `at`, if it reads as one.
    fn task(&self, engine: &mut Engine, cpu: &mut dyn CpuView, at: u64) -> Option<Task> {
        if at < KERNEL_HALF {
            return None;
        }
        let tid = read_id(engine, cpu, at, self.layout.pid)?;
        let pid = read_id(engine, cpu, at, self.layout.tgid)?;
        let comm = read_text(engine, cpu, at.checked_add(self.layout.comm)?, COMM_LEN - 1)?;
        Some(Task { tid, pid, comm })
    }
}

/// The CPU's per-CPU base: GS base in the kernel, the kernel's GS base
/// saved by SWAPGS in user mode.
fn per_cpu_base(cpu: &mut dyn CpuView) -> Option<u64> {
    let gs = cpu.sregs().gs.base;
    if gs >= KERNEL_HALF {
        Some(gs)
    } else {
        cpu.read_msr(KERNEL_GS_BASE).filter(|b| *b >= KERNEL_HALF)
    }
}

/// The files mapped by the process of the task at `task`, in address
/// order; empty for a kernel thread. `None` where the map cannot be read.
fn read_maps(
    layout: &MapLayout,
    engine: &mut Engine,
    cpu: &mut dyn CpuView,
    task: u64,
) -> Option<Vec<Mapping>> {
    let mm = read_u64(engine, cpu, task.checked_add(layout.mm)?)?;
    if mm == 0 {
        return Some(Vec::new());
    }
    if mm < KERNEL_HALF {
        return None;
    }
    let root = read_u64(engine, cpu, mm.checked_add(layout.tree_root)?)?;
    let vmas = {
        let mut read = |at: u64, buf: &mut [u8]| engine.read_kernel(cpu, at, buf);
        maple::entries(root, &mut read, MAX_VMAS)?
    };
    let mut maps = Vec::new();
    for vma in vmas {
        if vma < KERNEL_HALF || vma & 7 != 0 {
            continue;
        }
        let field = |engine: &mut Engine, cpu: &mut dyn CpuView, offset: u64| {
            read_u64(engine, cpu, vma.checked_add(offset)?)
        };
        let Some(file) = field(engine, cpu, layout.vm_file).filter(|f| *f >= KERNEL_HALF) else {
            continue;
        };
        let (Some(start), Some(end), Some(pgoff)) = (
            field(engine, cpu, layout.vm_start),
            field(engine, cpu, layout.vm_end),
            field(engine, cpu, layout.vm_pgoff),
        ) else {
            continue;
        };
        if start >= end || end > KERNEL_HALF {
            continue;
        }
        let Some(path) = file_path(layout, engine, cpu, file) else {
            continue;
        };
        maps.push(Mapping {
            start,
            end,
            offset: pgoff.saturating_mul(4096),
            path,
        });
        if maps.len() >= MAX_MAPPINGS {
            break;
        }
    }
    Some(maps)
}

/// The path of the file at `file`, from the root of its file system.
fn file_path(
    layout: &MapLayout,
    engine: &mut Engine,
    cpu: &mut dyn CpuView,
    file: u64,
) -> Option<String> {
    let mut dentry = read_u64(engine, cpu, file.checked_add(layout.file_dentry)?)?;
    let mut names = Vec::new();
    for _ in 0..MAX_PATH_DEPTH {
        let parent = read_u64(engine, cpu, dentry.checked_add(layout.d_parent)?)?;
        if parent == dentry {
            break;
        }
        let name = read_u64(engine, cpu, dentry.checked_add(layout.d_name)?)?;
        names.push(read_text(engine, cpu, name, NAME_MAX)?);
        dentry = parent;
    }
    names.reverse();
    Some(format!("/{}", names.join("/")))
}

/// A pid-sized id at `offset` in the task at `task`.
fn read_id(engine: &mut Engine, cpu: &mut dyn CpuView, task: u64, offset: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    engine
        .read_kernel(cpu, task.checked_add(offset)?, &mut b)
        .then(|| u32::from_le_bytes(b))
        .filter(|id| *id <= PID_MAX)
}

fn read_u64(engine: &mut Engine, cpu: &mut dyn CpuView, at: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    engine
        .read_kernel(cpu, at, &mut b)
        .then(|| u64::from_le_bytes(b))
}

/// Text the kernel keeps NUL-terminated: up to `max` bytes before a NUL,
/// read a page at a time (nothing need be mapped after the NUL).
fn read_text(engine: &mut Engine, cpu: &mut dyn CpuView, at: u64, max: usize) -> Option<String> {
    let mut text = Vec::new();
    let mut addr = at;
    while text.len() < max {
        let in_page = (4096 - (addr & 0xfff) as usize).min(max - text.len());
        let mut b = [0u8; NAME_MAX];
        let chunk = &mut b[..in_page.min(NAME_MAX)];
        if !engine.read_kernel(cpu, addr, chunk) {
            if text.is_empty() && addr == at {
                return None;
            }
            break;
        }
        if let Some(end) = chunk.iter().position(|&c| c == 0) {
            text.extend_from_slice(&chunk[..end]);
            break;
        }
        text.extend_from_slice(chunk);
        addr = addr.checked_add(chunk.len() as u64)?;
    }
    Some(String::from_utf8_lossy(&text).into_owned())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::test_machine::{machine, FlatCpu};
    use vtrace_storage::Record;

    /// The kernel half's first address, mapped (below) to physical 0.
    const KERNEL: u64 = KERNEL_HALF;
    const PER_CPU: u64 = 0x5_0000;
    const TASK: u64 = 0x6_0000;
    pub const DO_EXIT: u64 = 0x7000;

    /// A task layout of made-up offsets.
    pub fn layout() -> TaskLayout {
        TaskLayout {
            current_task: 0x100,
            switch_to: 0x7100,
            set_comm: None,
            exit: Some(DO_EXIT),
            pid: 0x10,
            tgid: 0x14,
            comm: 0x20,
            maps: None,
            nr_running: None,
        }
    }

    /// `machine(code)` with the kernel half mapped and task `tid` (of
    /// process `tid`) named `comm` running, as `layout()` places it.
    pub fn running(code: &[u8], tid: u32, comm: &str) -> FlatCpu {
        let mut cpu = machine(code);
        cpu.put_u64(0x1000 + 256 * 8, 0x2000 | 3);
        cpu.sregs.gs.base = KERNEL + PER_CPU;
        cpu.put_u64(PER_CPU + 0x100, KERNEL + TASK);
        name_task(&cpu, tid, comm);
        cpu
    }

    /// Renames the running task.
    pub fn name_task(cpu: &FlatCpu, tid: u32, comm: &str) {
        cpu.put(TASK + 0x10, &tid.to_le_bytes());
        cpu.put(TASK + 0x14, &tid.to_le_bytes());
        let mut name = [0u8; COMM_LEN];
        name[..comm.len()].copy_from_slice(comm.as_bytes());
        cpu.put(TASK + 0x20, &name);
    }

    #[test]
    fn the_running_task_is_read_afresh() {
        let mut cpu = running(&[0x90], 42, "sh");
        let mut engine = Engine::new();
        let watch = TaskWatch::new(layout());
        assert_eq!(
            watch.running_comm(&mut engine, &mut cpu).as_deref(),
            Some("sh")
        );
        name_task(&cpu, 42, "vtprog");
        assert_eq!(
            watch.running_comm(&mut engine, &mut cpu).as_deref(),
            Some("vtprog")
        );
        // In user mode the per-CPU base is the one SWAPGS saved; this
        // machine has none.
        cpu.sregs.gs.base = 0x7000_0000;
        assert_eq!(watch.running_comm(&mut engine, &mut cpu), None);
    }

    #[test]
    fn do_exit_records_the_running_tasks_exit_code() {
        let mut cpu = running(&[0x90], 42, "vtprog");
        let mut engine = Engine::new();
        let mut watch = TaskWatch::new(layout());
        let mut out: Vec<Record> = Vec::new();
        cpu.regs.rdi = 3 << 8;
        watch.before(DO_EXIT, &mut engine, &mut cpu, &mut out);
        assert_eq!(
            out,
            vec![Record::Event(Event::TaskExit {
                tid: 42,
                code: 3 << 8
            })]
        );
    }
}
