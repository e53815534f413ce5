//! Which Linux task the CPU runs, read from the kernel's own data where
//! tracing starts and where the kernel switches or renames tasks (see
//! [`TaskLayout`] for what locates them). Between those places nothing is
//! read: the per-step cost is two comparisons of the next pc.

use vtrace_storage::{Event, TaskLayout};
use vtrace_vmm::x86::msr::KERNEL_GS_BASE;
use vtrace_vmm::CpuView;

use crate::engine::{Engine, RecordSink};

/// The lowest address of the kernel half of a 4-level address space.
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;
/// `TASK_COMM_LEN`.
const COMM_LEN: usize = 16;
/// `PID_MAX_LIMIT` on 64-bit kernels: anything above is not a pid.
const PID_MAX: u32 = 4 << 20;

/// A task as the trace names it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Task {
    tid: u32,
    pid: u32,
    comm: String,
}

/// Follows the running task of a Linux guest.
pub struct TaskWatch {
    layout: TaskLayout,
    /// The task the last event named.
    current: Option<Task>,
}

impl TaskWatch {
    pub fn new(layout: TaskLayout) -> TaskWatch {
        TaskWatch {
            layout,
            current: None,
        }
    }

    /// Tracing starts: records the running task, found through the
    /// per-CPU base (GS base in the kernel, the kernel's GS base saved by
    /// SWAPGS in user mode), and what the first instruction does to it
    /// (tracing may start on a switch: `--start-at __switch_to`).
    pub fn begin(&mut self, engine: &mut Engine, cpu: &mut dyn CpuView, sink: &mut dyn RecordSink) {
        self.current = None;
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
        let gs = cpu.sregs().gs.base;
        let base = if gs >= KERNEL_HALF {
            Some(gs)
        } else {
            cpu.read_msr(KERNEL_GS_BASE).filter(|b| *b >= KERNEL_HALF)
        };
        let Some(slot) = base.and_then(|b| b.checked_add(self.layout.current_task)) else {
            return;
        };
        if let Some(task) = read_u64(engine, cpu, slot).and_then(|t| self.task(engine, cpu, t)) {
            self.switch(task, sink);
        }
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
            // __switch_to(prev, next): the kernel runs `next` from here.
            let next = cpu.regs().rsi;
            if let Some(task) = self.task(engine, cpu, next) {
                self.switch(task, sink);
            }
        } else if Some(pc) == self.layout.set_comm {
            // __set_task_comm(task, name, exec).
            let regs = cpu.regs();
            let Some(tid) = read_id(engine, cpu, regs.rdi, self.layout.pid) else {
                return;
            };
            let Some(comm) = read_comm(engine, cpu, regs.rsi) else {
                return;
            };
            if let Some(current) = self.current.as_mut().filter(|c| c.tid == tid) {
                current.comm.clone_from(&comm);
            }
            sink.event(&Event::TaskName { tid, comm });
        }
    }

    fn switch(&mut self, task: Task, sink: &mut dyn RecordSink) {
        if self.current.as_ref() == Some(&task) {
            return;
        }
        sink.event(&Event::Task {
            tid: task.tid,
            pid: task.pid,
            comm: task.comm.clone(),
        });
        self.current = Some(task);
    }

    /// The task whose `task_struct` is at `at`, if it reads as one.
    fn task(&self, engine: &mut Engine, cpu: &mut dyn CpuView, at: u64) -> Option<Task> {
        if at < KERNEL_HALF {
            return None;
        }
        let tid = read_id(engine, cpu, at, self.layout.pid)?;
        let pid = read_id(engine, cpu, at, self.layout.tgid)?;
        let comm = read_comm(engine, cpu, at.checked_add(self.layout.comm)?)?;
        Some(Task { tid, pid, comm })
    }
}

/// A pid-sized id at `offset` in the task at `task`.
fn read_id(engine: &mut Engine, cpu: &mut dyn CpuView, task: u64, offset: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    engine
        .read_linear(cpu, task.checked_add(offset)?, &mut b)
        .then(|| u32::from_le_bytes(b))
        .filter(|id| *id <= PID_MAX)
}

fn read_u64(engine: &mut Engine, cpu: &mut dyn CpuView, at: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    engine
        .read_linear(cpu, at, &mut b)
        .then(|| u64::from_le_bytes(b))
}

/// A task name: up to 15 bytes before a NUL, as the kernel keeps it.
fn read_comm(engine: &mut Engine, cpu: &mut dyn CpuView, at: u64) -> Option<String> {
    let mut b = [0u8; COMM_LEN];
    // A name near the end of a page may have nothing mapped after it.
    let in_page = COMM_LEN.min(4096 - (at & 0xfff) as usize);
    let read = if engine.read_linear(cpu, at, &mut b) {
        COMM_LEN - 1
    } else if engine.read_linear(cpu, at, &mut b[..in_page]) {
        in_page.min(COMM_LEN - 1)
    } else {
        return None;
    };
    let end = b[..read].iter().position(|&c| c == 0).unwrap_or(read);
    Some(String::from_utf8_lossy(&b[..end]).into_owned())
}
