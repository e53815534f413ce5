//! The one pass over a trace that a debugger's look-ups stand on: each
//! segment's addresses run (to find breakpoints without decoding every
//! segment), the memory accesses with their values, the code fetched,
//! control-register changes and where the trace broke.

use rustc_hash::FxHashMap;
use vtrace_storage::{Event, InsnBytes, MemoryValue, RecordRef, Regs, Step};

use super::memory::{space_of, Observation, Spaces};
use crate::input::{Records, SegmentInfo};
use crate::insn::InsnCache;
use crate::memory_values::{accesses, target_value, Access};

/// What one segment adds to the index.
#[derive(Debug, Default)]
pub struct SegmentIndex {
    /// The addresses the chosen CPU ran here, sorted, each once.
    pub pcs: Vec<u64>,
    /// Memory accesses of every CPU (the memory is shared).
    pub seen: Vec<Observation>,
    /// Each address's code the first time it ran here: space, pc, step,
    /// bytes.
    pub code: Vec<(u64, u64, u64, InsnBytes)>,
    /// Control registers the chosen CPU set: step, register (0, 3, 4,
    /// 0xEF for EFER), value.
    pub controls: Vec<(u64, u8, u64)>,
    /// Steps where the trace broke before (tracing started, a gap).
    pub breaks: Vec<u64>,
    /// Each CPU's first step here, where nothing here tells the registers
    /// before it (the segment before does): CPU, step number, the step,
    /// the memory values recorded for it.
    pub openers: Vec<(u32, u64, Step, Vec<MemoryValue>)>,
    /// Each CPU's last registers and its lower half's tag here, where the
    /// registers before its next step (in the next segment) are those.
    pub closers: Vec<(u32, Regs, u64)>,
    /// How many steps of the chosen CPU it holds.
    pub steps: usize,
}

/// What the pass keeps of each CPU.
#[derive(Default)]
struct CpuState {
    /// Its last step's registers and address space, where the registers
    /// before its next step are those.
    last: Option<(Regs, u64)>,
    /// An interrupt came since its last step.
    interrupted: bool,
    /// The last such interrupt's error code.
    error_code: Option<u32>,
    /// Its last step's branch-target load (an index in `seen`, and its
    /// size), whose value is the next step's pc.
    awaiting: Option<(usize, u16)>,
    /// The trace broke since the segment began.
    broke: bool,
}

/// Indexes one segment, whose first step is `first_step`, for CPU `cpu`
/// (the only one: `None`).
pub fn index_segment(
    records: &mut Records<'_>,
    first_step: u64,
    cpu: Option<u32>,
    spaces: Spaces,
) -> SegmentIndex {
    let mut indexer = Indexer {
        out: SegmentIndex::default(),
        cache: InsnCache::default(),
        cpus: FxHashMap::default(),
        first_code: FxHashMap::default(),
        reads: Vec::new(),
        writes: Vec::new(),
        recorded: Vec::new(),
        cpu,
        spaces,
        current: 0,
        step: first_step,
        broke_all: false,
    };
    while let Some(record) = records.next_record() {
        match record {
            RecordRef::Event(event) => indexer.event(event),
            RecordRef::Step(s) => indexer.step(s),
        }
    }
    indexer.finish()
}

/// A segment's index as it is built.
struct Indexer {
    out: SegmentIndex,
    cache: InsnCache,
    cpus: FxHashMap<u32, CpuState>,
    first_code: FxHashMap<(u64, u64), InsnBytes>,
    reads: Vec<Access>,
    writes: Vec<Access>,
    /// The memory values recorded for the next step.
    recorded: Vec<MemoryValue>,
    cpu: Option<u32>,
    spaces: Spaces,
    /// The CPU whose records these are.
    current: u32,
    /// The next step's number.
    step: u64,
    /// Tracing stopped or started since the segment began.
    broke_all: bool,
}

impl Indexer {
    fn state(&mut self) -> &mut CpuState {
        let broke = self.broke_all;
        self.cpus.entry(self.current).or_insert_with(|| CpuState {
            broke,
            ..CpuState::default()
        })
    }

    fn event(&mut self, event: &Event) {
        let broken = || CpuState {
            broke: true,
            ..CpuState::default()
        };
        match event {
            Event::Cpu(n) => self.current = *n,
            Event::TraceStart(_) | Event::TraceStop(_) => {
                for state in self.cpus.values_mut() {
                    *state = broken();
                }
                self.broke_all = true;
                self.out.breaks.push(self.step);
            }
            Event::Gap { .. } => {
                self.cpus.insert(self.current, broken());
                self.out.breaks.push(self.step);
            }
            Event::Interrupt { error_code, .. } => {
                let state = self.state();
                state.interrupted = true;
                state.error_code = *error_code;
            }
            Event::ControlRegister { reg, value } if self.ours() => {
                self.out.controls.push((self.step, *reg, *value))
            }
            Event::MemoryValues(values) => self.recorded.clone_from(values),
            Event::Capture { addr, bytes, .. } => {
                let root = self
                    .cpus
                    .get(&self.current)
                    .and_then(|s| s.last)
                    .map_or(0, |l| l.1);
                for (i, b) in (0u64..).zip(bytes.iter()) {
                    let addr = addr.wrapping_add(i);
                    self.out.seen.push(Observation {
                        space: space_of(root, addr),
                        addr,
                        step: self.step,
                        value: Some(u64::from(*b)),
                        size: 1,
                        store: false,
                    });
                }
            }
            _ => {}
        }
    }

    fn ours(&self) -> bool {
        self.cpu.is_none_or(|c| c == self.current)
    }

    fn step(&mut self, s: &Step) {
        let (step, root) = (self.step, self.spaces.root(s.cr3));
        if self.ours() {
            self.out.steps += 1;
            self.out.pcs.push(s.pc);
            let code = &mut self.out.code;
            self.first_code
                .entry((space_of(root, s.pc), s.pc))
                .or_insert_with(|| {
                    code.push((space_of(root, s.pc), s.pc, step, s.bytes));
                    s.bytes
                });
        }
        let current = self.current;
        let state = self.state();
        let opener = state.last.is_none() && !state.broke && !state.interrupted;
        let awaiting = state.awaiting.take().filter(|_| !state.interrupted);
        let (last, interrupted, error_code) = (state.last, state.interrupted, state.error_code);
        state.last = Some((s.regs, root));
        state.interrupted = false;
        state.error_code = None;
        if opener {
            let recorded = self.recorded.clone();
            self.out.openers.push((current, step, *s, recorded));
        }
        if let Some((i, size)) = awaiting {
            self.out.seen[i].value = Some(target_value(s.pc, size));
        }
        match (last, interrupted) {
            (Some((before, _)), false) => self.memory_of(s, &before, root),
            (Some((before, root)), true) => {
                // The handler's first step tells where the CPU put the
                // frame (on this stack, or another where the privilege
                // changed or an IST stack was used): the stack pointer
                // before that step.
                let moved = self.cache.get(s).instruction.stack_pointer_increment();
                let frame = s.regs.gpr[4].wrapping_sub(moved as i64 as u64);
                interrupt_frame(&mut self.out.seen, root, frame, error_code, &before, step);
            }
            (None, _) => {}
        }
        self.recorded.clear();
        self.step = step.saturating_add(1);
    }

    /// The accesses of step `s`, whose registers before it are `before`.
    fn memory_of(&mut self, s: &Step, before: &Regs, root: u64) {
        self.reads.clear();
        self.writes.clear();
        let info = self.cache.get(s);
        let awaiting = accesses(
            info,
            (before, &s.regs),
            None,
            &self.recorded,
            &mut self.reads,
            &mut self.writes,
        );
        let mut target = None;
        for (n, a) in self.reads.iter().enumerate() {
            if let Some(i) = observe(&mut self.out.seen, root, a, self.step, false) {
                if awaiting == Some(n) {
                    target = Some((i, a.size));
                }
            }
        }
        for a in &self.writes {
            observe(&mut self.out.seen, root, a, self.step, true);
        }
        self.state().awaiting = target;
    }

    fn finish(mut self) -> SegmentIndex {
        for (cpu, state) in self.cpus {
            if let (Some((regs, root)), false) = (state.last, state.interrupted) {
                self.out.closers.push((cpu, regs, root));
            }
        }
        self.out.pcs.sort_unstable();
        self.out.pcs.dedup();
        self.out
    }
}

/// Adds access `a` of a step (whose lower half's tag is `root`) to `seen`: any
/// of 1 to 8 bytes as it is (a load of no known value tells nothing, but
/// a branch target's may get its value from the next step), a larger
/// store as stores of unknown value. Returns its index in `seen` where it
/// went in whole.
pub(super) fn observe(
    seen: &mut Vec<Observation>,
    root: u64,
    a: &Access,
    step: u64,
    store: bool,
) -> Option<usize> {
    match u8::try_from(a.size).ok().filter(|s| (1..=8).contains(s)) {
        Some(size) => {
            seen.push(Observation {
                space: space_of(root, a.addr),
                addr: a.addr,
                step,
                value: a.value,
                size,
                store,
            });
            Some(seen.len() - 1)
        }
        None if store => {
            unknown_store(seen, root, a.addr, u64::from(a.size), step);
            None
        }
        None => None,
    }
}

/// The frame the CPU stored at `frame` delivering an interrupt before
/// `step`: the error code and the interrupted RSP (the registers `before`)
/// as they were; RIP, CS, RFLAGS and SS of unknown value (RIP is the
/// faulting or the next instruction, RFLAGS may have RF set).
fn interrupt_frame(
    seen: &mut Vec<Observation>,
    root: u64,
    frame: u64,
    error_code: Option<u32>,
    before: &Regs,
    step: u64,
) {
    // The frame is there before `step` runs.
    let at = step.saturating_sub(1);
    let mut slot = frame;
    let known = |seen: &mut Vec<Observation>, slot: u64, value: Option<u64>| {
        seen.push(Observation {
            space: space_of(root, slot),
            addr: slot,
            step: at,
            value,
            size: 8,
            store: true,
        })
    };
    if let Some(code) = error_code {
        known(seen, slot, Some(u64::from(code)));
        slot = slot.wrapping_add(8);
    }
    // RIP, CS, RFLAGS, RSP, SS.
    for (i, value) in [None, None, None, Some(before.gpr[4]), None]
        .into_iter()
        .enumerate()
    {
        known(seen, slot.wrapping_add(8 * i as u64), value);
    }
}

/// Stores of unknown value over `len` bytes from `addr`, in pieces of 8.
fn unknown_store(seen: &mut Vec<Observation>, root: u64, addr: u64, len: u64, step: u64) {
    let mut at = 0;
    while at < len {
        let size = (len - at).min(8);
        let addr = addr.wrapping_add(at);
        seen.push(Observation {
            space: space_of(root, addr),
            addr,
            step,
            value: None,
            size: size as u8,
            store: true,
        });
        at += size;
    }
}

/// The whole trace's index, built from its segments' in trace order.
pub struct TraceIndex {
    /// The segments that decoded.
    pub segments: Vec<SegmentInfo>,
    /// Per segment: the addresses the CPU ran there, sorted.
    pub pcs: Vec<Vec<u64>>,
    /// Per segment: how many steps of the CPU it holds.
    pub counts: Vec<usize>,
    /// Every memory access.
    pub seen: Vec<Observation>,
    /// Code by address space and address: each version's first step.
    pub code: FxHashMap<(u64, u64), Vec<(u64, InsnBytes)>>,
    /// Control registers set: step, register, value.
    pub controls: Vec<(u64, u8, u64)>,
    /// Where the trace broke.
    pub breaks: Vec<u64>,
    spaces: Spaces,
    /// Each CPU's registers and lower half's tag at the end of the
    /// segment before, for its first step in the next.
    carried: FxHashMap<u32, (Regs, u64)>,
    /// The first step of the segment that would follow without a hole.
    expected: Option<u64>,
    cache: InsnCache,
}

impl TraceIndex {
    /// An empty index of a trace whose addresses divide as `spaces` says.
    pub fn new(spaces: Spaces) -> TraceIndex {
        TraceIndex {
            segments: Vec::new(),
            pcs: Vec::new(),
            counts: Vec::new(),
            seen: Vec::new(),
            code: FxHashMap::default(),
            controls: Vec::new(),
            breaks: Vec::new(),
            spaces,
            carried: FxHashMap::default(),
            expected: None,
            cache: InsnCache::default(),
        }
    }

    /// A segment that did not decode: what it held is not known.
    pub fn damaged(&mut self, info: &SegmentInfo) {
        self.breaks.push(info.first_step);
        self.carried.clear();
        self.expected = None;
    }

    /// Adds the next segment's index.
    pub fn add(&mut self, info: SegmentInfo, mut index: SegmentIndex) {
        if self.expected != Some(info.first_step) {
            self.breaks.push(info.first_step);
            self.carried.clear();
        }
        self.expected = Some(info.first_step.saturating_add(info.steps));
        // Each CPU's first step here, with the registers the segment
        // before left.
        for (cpu, step, s, recorded) in &index.openers {
            let Some((before, _)) = self.carried.get(cpu) else {
                continue;
            };
            let root = self.spaces.root(s.cr3);
            let (mut reads, mut writes) = (Vec::new(), Vec::new());
            let info = self.cache.get(s);
            accesses(
                info,
                (before, &s.regs),
                None,
                recorded,
                &mut reads,
                &mut writes,
            );
            for a in &reads {
                observe(&mut index.seen, root, a, *step, false);
            }
            for a in &writes {
                observe(&mut index.seen, root, a, *step, true);
            }
        }
        self.carried = index
            .closers
            .iter()
            .map(|&(cpu, regs, root)| (cpu, (regs, root)))
            .collect();
        for (space, pc, step, bytes) in index.code {
            let versions = self.code.entry((space, pc)).or_default();
            if versions.last().is_none_or(|v| v.1 != bytes) {
                versions.push((step, bytes));
            }
        }
        self.seen.append(&mut index.seen);
        self.controls.append(&mut index.controls);
        self.breaks.append(&mut index.breaks);
        self.segments.push(info);
        self.pcs.push(index.pcs);
        self.counts.push(index.steps);
    }
}
