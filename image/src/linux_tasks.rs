//! Where an unmodified Linux kernel keeps the task a CPU runs, and how to
//! read a task's name and ids: the way debuggers and PANDA's OSI find them.
//!
//! - The kernel's own symbols (kallsyms, see [`crate::symbols`]) give the
//!   per-CPU variable `current_task` (or `pcpu_hot`, whose `current_task`
//!   field kernels 6.2 to 6.14 use instead) and the routines that switch
//!   and rename tasks.
//! - The kernel's BTF (the `.BTF` section of its vmlinux; Debian's kernels
//!   have one) gives the offsets of `pid`, `tgid` and `comm` in
//!   `task_struct`, whatever the kernel's configuration or layout
//!   randomization made of it.
//! - The same BTF locates each process's memory map (its maple tree of
//!   VMAs and their files), for kernels 6.1 and later.

use btf_rs::{Btf, BtfType, Type};
use object::{Object, ObjectSection};

use vtrace_storage::{MapLayout, TaskLayout};

use crate::symbols::all_kallsyms;

/// Why a kernel's tasks cannot be followed.
#[derive(Debug, thiserror::Error)]
pub enum TaskLayoutError {
    /// The image carries no kallsyms table.
    #[error("the kernel's symbol table (kallsyms) was not found")]
    NoKallsyms,
    /// kallsyms lacks a symbol the layout needs.
    #[error("the kernel has no symbol {0}")]
    MissingSymbol(&'static str),
    /// The per-CPU variable is linked at a kernel address, not as an
    /// offset (kernels without absolute per-CPU symbols).
    #[error("{0} is not a per-CPU offset in this kernel ({1:#x})")]
    NotPerCpu(&'static str, u64),
    /// The vmlinux has no `.BTF` section (`CONFIG_DEBUG_INFO_BTF` off).
    #[error("the kernel has no BTF type information (.BTF section)")]
    NoBtf,
    /// The `.BTF` section could not be parsed.
    #[error("the kernel's BTF cannot be read: {0}")]
    BadBtf(String),
    /// BTF lacks a structure or field the layout needs.
    #[error("the kernel's BTF has no {0}")]
    MissingField(&'static str),
}

/// Finds the task layout of the kernel `vmlinux` (the ELF inside a
/// bzImage, stripped or not).
pub fn task_layout(vmlinux: &[u8]) -> Result<TaskLayout, TaskLayoutError> {
    let symbols = all_kallsyms(vmlinux, "vmlinux").map_err(|_| TaskLayoutError::NoKallsyms)?;
    let find = |name: &str| {
        symbols
            .iter()
            .find(|(_, n, _)| n == name)
            .map(|(_, _, a)| *a)
    };
    let routine = |name: &'static str| find(name).ok_or(TaskLayoutError::MissingSymbol(name));
    let switch_to = routine("__switch_to")?;
    let set_comm = find("__set_task_comm");
    let exit = find("do_exit");
    let btf = read_btf(vmlinux)?;
    let task = named_struct(&btf, "task_struct")?;
    let field = |name: &'static str| {
        field_offset(&btf, &task, name, 0).ok_or(TaskLayoutError::MissingField(name))
    };
    let (pid, tgid, comm) = (field("pid")?, field("tgid")?, field("comm")?);
    let current_task = match find("current_task") {
        Some(offset) => per_cpu("current_task", offset)?,
        None => {
            let hot = find("pcpu_hot").ok_or(TaskLayoutError::MissingSymbol("current_task"))?;
            let hot = per_cpu("pcpu_hot", hot)?;
            let layout = named_struct(&btf, "pcpu_hot")?;
            let field = field_offset(&btf, &layout, "current_task", 0)
                .ok_or(TaskLayoutError::MissingField("pcpu_hot.current_task"))?;
            hot.checked_add(field)
                .ok_or(TaskLayoutError::NotPerCpu("pcpu_hot", hot))?
        }
    };
    let maps = map_layout(&btf, &task, &find);
    let nr_running = find("runqueues")
        .and_then(|rq| per_cpu("runqueues", rq).ok())
        .zip(named_struct(&btf, "rq").ok())
        .and_then(|(rq, layout)| rq.checked_add(field_offset(&btf, &layout, "nr_running", 0)?));
    Ok(TaskLayout {
        current_task,
        switch_to,
        set_comm,
        exit,
        pid,
        tgid,
        comm,
        maps,
        nr_running,
    })
}

/// Where processes keep their memory maps: `None` where the kernel does
/// not keep them in a maple tree (before 6.1) or lacks a symbol or field.
fn map_layout(
    btf: &Btf,
    task: &btf_rs::Struct,
    find: &dyn Fn(&str) -> Option<u64>,
) -> Option<MapLayout> {
    let offset = |s: &'static str, f: &str| field_offset(btf, &named_struct(btf, s).ok()?, f, 0);
    let sum = |a: Option<u64>, b: Option<u64>| a?.checked_add(b?);
    // The walk in the tracer reads maple nodes as 6.1 lays them out: a
    // parent pointer, then pivots, then slots (range nodes: 15 pivots;
    // allocation-range nodes: 9 pivots, 10 slots, 10 gaps).
    let nodes = [
        offset("maple_range_64", "pivot") == Some(8),
        offset("maple_range_64", "slot") == Some(128),
        offset("maple_arange_64", "slot") == Some(80),
        offset("maple_arange_64", "gap") == Some(160),
    ];
    if nodes.contains(&false) {
        return None;
    }
    Some(MapLayout {
        mm: field_offset(btf, task, "mm", 0)?,
        tree_root: sum(
            offset("mm_struct", "mm_mt"),
            offset("maple_tree", "ma_root"),
        )?,
        vm_start: offset("vm_area_struct", "vm_start")?,
        vm_end: offset("vm_area_struct", "vm_end")?,
        vm_pgoff: offset("vm_area_struct", "vm_pgoff")?,
        vm_file: offset("vm_area_struct", "vm_file")?,
        file_dentry: sum(offset("file", "f_path"), offset("path", "dentry"))?,
        d_parent: offset("dentry", "d_parent")?,
        d_name: sum(offset("dentry", "d_name"), offset("qstr", "name"))?,
        syscall_entry: find("entry_SYSCALL_64")?,
        syscall_exit: find("syscall_exit_to_user_mode")?,
    })
}

/// Per-CPU symbols are offsets from the per-CPU base on x86-64 kernels
/// linked with absolute per-CPU symbols (all up to 6.14): small numbers.
fn per_cpu(name: &'static str, value: u64) -> Result<u64, TaskLayoutError> {
    const MAX_PER_CPU: u64 = 16 << 20;
    if value < MAX_PER_CPU {
        Ok(value)
    } else {
        Err(TaskLayoutError::NotPerCpu(name, value))
    }
}

fn read_btf(vmlinux: &[u8]) -> Result<Btf, TaskLayoutError> {
    let elf = object::File::parse(vmlinux).map_err(|_| TaskLayoutError::NoBtf)?;
    let section = elf.section_by_name(".BTF").ok_or(TaskLayoutError::NoBtf)?;
    let data = section.data().map_err(|_| TaskLayoutError::NoBtf)?;
    // The parser asserts on some malformed input (a structure without a
    // size): a crafted kernel image must cost the tracing of tasks, not
    // the run.
    std::panic::catch_unwind(|| Btf::from_bytes(data))
        .map_err(|_| TaskLayoutError::BadBtf("the parser gave up".into()))?
        .map_err(|e| TaskLayoutError::BadBtf(e.to_string()))
}

fn named_struct(btf: &Btf, name: &'static str) -> Result<btf_rs::Struct, TaskLayoutError> {
    let types = btf
        .resolve_types_by_name(name)
        .map_err(|_| TaskLayoutError::MissingField(name))?;
    types
        .into_iter()
        .find_map(|t| match t {
            Type::Struct(s) => Some(s),
            _ => None,
        })
        .ok_or(TaskLayoutError::MissingField(name))
}

/// Byte offset of field `name` in `s`, looking into anonymous structures
/// and unions (`depth` bounds a crafted, cyclic BTF).
fn field_offset(btf: &Btf, s: &btf_rs::Struct, name: &str, depth: u32) -> Option<u64> {
    if depth > 8 {
        return None;
    }
    for member in &s.members {
        let at = u64::from(member.bit_offset() / 8);
        let own = btf.resolve_name(member).unwrap_or_default();
        if own == name {
            return Some(at);
        }
        if !own.is_empty() {
            continue;
        }
        let inner = match btf.resolve_chained_type(member as &dyn BtfType) {
            Ok(Type::Struct(inner) | Type::Union(inner)) => inner,
            _ => continue,
        };
        if let Some(off) = field_offset(btf, &inner, name, depth + 1) {
            return at.checked_add(off);
        }
    }
    None
}
