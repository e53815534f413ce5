//! One segment's steps as columns, built in parallel per segment: a row
//! per step with what it ran, the registers it changed, the memory it
//! touched and the events before it. What only the segments before know
//! (the registers before the first step, events left over at the end of
//! the segment before, the routine of each step as the level engine sees
//! it) is filled in, in trace order, by [`SegmentRows::finish`].

use iced_x86::{Formatter, IntelFormatter};
use rustc_hash::FxHashMap;
use vtrace_storage::REG_COUNT;
use vtrace_storage::{Event, InsnBytes, MemoryValue, Regs};

use vtrace_analyzer::InsnInfo;
use vtrace_analyzer::{accesses, target_value, Access};
use vtrace_analyzer::{RoutineRun, SegmentPass, SegmentRecord};
use vtrace_analyzer::{TaskId, TaskTracker};
use vtrace_image::symbols::{cr3_root, FuncId, UNKNOWN_FUNC};

/// Every register changed: what a step shows when the registers before it
/// are not known (after a break in the trace).
pub(super) const ALL_REGISTERS: u32 = (1 << REG_COUNT) - 1;

/// No task named (an index into [`SegmentRows::tasks`]): the comm
/// column's null, so its rows are the task column as it is.
pub(super) const NO_TASK: u32 = super::keys::NO_KEY;

/// A distinct instruction's text.
pub(super) struct InsnText {
    /// Its address (the pc column's dictionary is made from these).
    pub pc: u64,
    /// Its bytes (and the bytes column's).
    pub bytes: InsnBytes,
    /// Lower case, as `vtrace analyze stats` names mnemonics.
    pub mnemonic: String,
    /// Intel syntax, numbers as `0x…`.
    pub disassembly: String,
}

/// The columns of one segment's steps of one CPU.
#[derive(Default)]
pub(super) struct SegmentRows {
    /// The CPU every row's step ran on (0 on a trace of one CPU).
    pub cpu: u32,
    /// Each row's step number.
    pub steps: Vec<u64>,
    pub cr3: Vec<u64>,
    pub cpl: Vec<u8>,
    pub bitness: Vec<u8>,
    /// Index into `texts` (which holds the instruction's pc and bytes).
    pub insn: Vec<u32>,
    pub texts: Vec<InsnText>,
    /// Index into `tasks`, or [`NO_TASK`].
    pub task: Vec<u32>,
    pub tasks: Vec<TaskId>,
    /// Registers changed, bit `i` for `REG_NAMES[i]`.
    pub changed: Vec<u32>,
    /// The changed registers' values in register order, row after row;
    /// row 0 holds all of them (its mask is known only in order).
    pub values: Vec<u64>,
    /// Whether the registers before the step are known, and so the
    /// addresses it read and wrote.
    pub known: Vec<bool>,
    /// Memory read and written (addresses, sizes, values where exact),
    /// row after row, with where each row's end (row 0's are in
    /// `first_reads`/`first_writes`).
    pub reads: Vec<Access>,
    pub reads_end: Vec<u32>,
    pub writes: Vec<Access>,
    pub writes_end: Vec<u32>,
    pub first_reads: Vec<Access>,
    pub first_writes: Vec<Access>,
    /// Events before each step, in words, with where each row's end (row
    /// 0's are `first_events`, then the start of `events`).
    pub events: Vec<String>,
    pub events_end: Vec<u32>,
    pub first_events: Vec<String>,
    /// (row, call) of the steps that make a system call.
    pub syscalls: Vec<(u32, vtrace_analyzer::SystemCall)>,
    /// (row, vector) of the steps an interrupt was delivered before.
    pub interrupts: Vec<(u32, u8)>,
    /// Routine of each row, as the level engine saw it.
    pub routine: Vec<FuncId>,
    /// For [`SegmentRows::finish`]: the first step's registers after it
    /// and memory operands, the registers after the last step (`None`
    /// when a break followed it), and events after the last step.
    first_regs: Option<Regs>,
    first_memory: Option<InsnInfo>,
    /// The first step's recorded memory values (`run --record-values`).
    first_recorded: Vec<MemoryValue>,
    pub last_regs: Option<Regs>,
    /// Whether the last step was a user-mode `int 0x80`.
    pub last_int_80: bool,
    pub trailing_events: Vec<String>,
}

impl SegmentRows {
    /// Rows in the segment.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Row `row`'s pc, as its instruction text holds it.
    pub fn pc(&self, row: usize) -> Option<u64> {
        let text = self.insn.get(row)?;
        self.texts.get(*text as usize).map(|t| t.pc)
    }

    /// Completes the segment in trace order: `before` is the registers
    /// after the step just before it (`None` after a break) and whether
    /// that step was a user-mode `int 0x80`, `carried` the events the
    /// segment before ended with, `runs` each step's routine.
    pub fn finish(
        &mut self,
        before: Option<(&Regs, bool)>,
        carried: Vec<String>,
        runs: &[RoutineRun],
    ) {
        let interrupted = self.interrupts.first().is_some_and(|(row, _)| *row == 0);
        // The delivery of an `int 0x80` made at the end of the segment
        // before is its system call's entry, as within a segment (see
        // `RowBuilder::event`); it still moved the stack.
        if before.is_some_and(|(_, int_80)| int_80)
            && self.interrupts.first() == Some(&(0, vtrace_analyzer::INT_80_VECTOR))
        {
            self.interrupts.remove(0);
        }
        if let (Some((before, _)), Some(after)) = (before, &self.first_regs) {
            self.changed[0] = changed_mask(Some(before), after);
            self.known[0] = !interrupted;
            if let Some(info) = self.first_memory.as_ref().filter(|_| !interrupted) {
                // The next row's pc is the branch target where it came
                // straight after.
                let next_pc = self.pc(1).filter(|_| self.known[1]);
                accesses(
                    info,
                    (before, after),
                    next_pc,
                    &self.first_recorded,
                    &mut self.first_reads,
                    &mut self.first_writes,
                );
            }
        }
        self.first_events = carried;
        self.routine = vec![UNKNOWN_FUNC; self.len()];
        // A run's steps are consecutive, and so are its rows.
        for run in runs {
            let from = self.steps.partition_point(|s| *s < run.first);
            let end = run.first.saturating_add(run.steps);
            let to = self.steps.partition_point(|s| *s < end);
            if from < to {
                self.routine[from..to].fill(run.func);
            }
        }
    }

    /// Row `row`'s value of register `reg` where the step changed it.
    pub fn register(&self, row: usize, cursor: usize, reg: usize) -> Option<u64> {
        let mask = self.changed[row];
        if mask & (1 << reg) == 0 {
            return None;
        }
        let slot = if row == 0 {
            reg
        } else {
            (mask & ((1 << reg) - 1)).count_ones() as usize
        };
        self.values.get(cursor + slot).copied()
    }

    /// How many values row `row` stored (see [`SegmentRows::values`]).
    pub fn stored(&self, row: usize) -> usize {
        if row == 0 {
            REG_COUNT
        } else {
            self.changed[row].count_ones() as usize
        }
    }
}

/// Bits of the registers that differ between `before` and `after`; all
/// when `before` is not known.
fn changed_mask(before: Option<&Regs>, after: &Regs) -> u32 {
    let Some(before) = before else {
        return ALL_REGISTERS;
    };
    const _: () = assert!(REG_COUNT == 17, "16 general registers, then RFLAGS");
    // A comparison per register without a branch, which the compiler
    // makes a few vector instructions (a loop over `Regs::get` was about
    // 1.5 % of an export).
    let gprs = before
        .gpr
        .iter()
        .zip(&after.gpr)
        .enumerate()
        .fold(0, |m, (i, (b, a))| m | u32::from(b != a) << i);
    gprs | u32::from(before.rflags != after.rflags) << 16
}

/// The registers a mask of [`changed_mask`] names, in register order: a
/// set bit at a time, not a test of each of the 17.
pub(super) fn registers_in(mask: u32) -> impl Iterator<Item = usize> {
    let mut bits = mask;
    std::iter::from_fn(move || {
        let reg = (bits != 0).then(|| bits.trailing_zeros() as usize)?;
        bits &= bits - 1;
        Some(reg)
    })
}

/// Slots in [`RowBuilder`]'s cache of recent instruction texts.
const RECENT_TEXTS: usize = 1024;

/// Rows reserved at most before a segment's first: a damaged segment
/// table cannot make the builder ask for more than this.
const MAX_RESERVED_ROWS: usize = 1 << 22;

/// Builds a segment's rows, a record at a time.
pub(super) struct RowBuilder {
    rows: SegmentRows,
    before: Option<Regs>,
    tracker: TaskTracker,
    task: u32,
    /// The next step's number.
    step: u64,
    texts: FxHashMap<(u64, InsnBytes, u8), u32>,
    /// The text ids of instructions seen lately, a slot per pc: most
    /// steps find theirs here without hashing their bytes.
    recent: Vec<(u64, InsnBytes, u8, u32)>,
    formatter: IntelFormatter,
    pending: Vec<String>,
    /// The vector of an interrupt delivered before the next step (not an
    /// `int 0x80`'s: see `syscalls::is_int_80`).
    interrupt: Option<u8>,
    /// A delivery moved the stack before the next step.
    delivered: bool,
    /// The last step was a user-mode `int 0x80`.
    after_int_80: bool,
    /// The read in `rows.reads` of a branch's target, waiting for the next
    /// step's pc.
    awaiting: Option<usize>,
    /// The memory values recorded for the next step.
    recorded: Vec<MemoryValue>,
}

impl RowBuilder {
    /// A builder for CPU `cpu`'s rows of the segment whose first step is
    /// `first_step`, with room for its `steps` rows made at once: growing
    /// the columns a doubling at a time cost a copy of each (about 6 % of
    /// an export).
    pub fn new(cpu: u32, first_step: u64, steps: u64) -> Self {
        let n = usize::try_from(steps).unwrap_or(0).min(MAX_RESERVED_ROWS);
        RowBuilder {
            rows: SegmentRows {
                cpu,
                steps: Vec::with_capacity(n),
                cr3: Vec::with_capacity(n),
                cpl: Vec::with_capacity(n),
                bitness: Vec::with_capacity(n),
                insn: Vec::with_capacity(n),
                texts: Vec::new(),
                task: Vec::with_capacity(n),
                tasks: Vec::new(),
                changed: Vec::with_capacity(n),
                // Three registers a step: about the demo's and Linux's.
                values: Vec::with_capacity(n * 3),
                known: Vec::with_capacity(n),
                reads: Vec::with_capacity(n),
                reads_end: Vec::with_capacity(n),
                writes: Vec::with_capacity(n / 2),
                writes_end: Vec::with_capacity(n),
                first_reads: Vec::new(),
                first_writes: Vec::new(),
                events: Vec::new(),
                events_end: Vec::with_capacity(n),
                first_events: Vec::new(),
                syscalls: Vec::new(),
                interrupts: Vec::new(),
                routine: Vec::new(),
                first_regs: None,
                first_memory: None,
                first_recorded: Vec::new(),
                last_regs: None,
                last_int_80: false,
                trailing_events: Vec::new(),
            },
            before: None,
            tracker: TaskTracker::default(),
            task: NO_TASK,
            step: first_step,
            texts: FxHashMap::default(),
            // An unused slot's bytes are empty: no instruction's are.
            recent: vec![(0, InsnBytes::default(), 0, 0); RECENT_TEXTS],
            formatter: vtrace_analyzer::intel_formatter(),
            pending: Vec::new(),
            interrupt: None,
            delivered: false,
            after_int_80: false,
            awaiting: None,
            recorded: Vec::new(),
        }
    }

    fn text(&mut self, pc: u64, bytes: InsnBytes, bitness: u8, info: &InsnInfo) -> u32 {
        let slot = (pc ^ pc >> 12) as usize % RECENT_TEXTS;
        if let Some(&(p, b, m, id)) = self.recent.get(slot) {
            if (p, b, m) == (pc, bytes, bitness) {
                return id;
            }
        }
        let rows = &mut self.rows;
        let formatter = &mut self.formatter;
        let id = *self.texts.entry((pc, bytes, bitness)).or_insert_with(|| {
            let mut disassembly = String::new();
            formatter.format(&info.instruction, &mut disassembly);
            rows.texts.push(InsnText {
                pc,
                bytes,
                mnemonic: format!("{:?}", info.mnemonic).to_lowercase(),
                disassembly,
            });
            u32::try_from(rows.texts.len() - 1).unwrap_or(u32::MAX)
        });
        if let Some(recent) = self.recent.get_mut(slot) {
            *recent = (pc, bytes, bitness, id);
        }
        id
    }

    /// Takes in an event before the next step.
    fn event(&mut self, e: &Event) {
        if self.tracker.follow(e) {
            self.task = match self.tracker.current() {
                Some(t) => {
                    self.rows.tasks.push(*t);
                    Self::end_of(self.rows.tasks.len() - 1)
                }
                None => NO_TASK,
            };
        }
        match e {
            // Where the recorder cut segments, not what ran.
            Event::Running { .. } => {}
            // The next step's own values, in its columns.
            Event::MemoryValues(values) => self.recorded.clone_from(values),
            _ => self.pending.push(vtrace_analyzer::describe_event(e)),
        }
        match e {
            Event::Interrupt { vector, .. } => {
                self.delivered = true;
                if !(self.after_int_80 && *vector == vtrace_analyzer::INT_80_VECTOR) {
                    self.interrupt = Some(*vector);
                }
            }
            Event::Gap { .. } | Event::TraceStop(_) => self.before = None,
            _ => {}
        }
    }

    fn end_of(v: usize) -> u32 {
        // A segment holds at most 2^27 bytes, so far fewer rows, bytes or
        // addresses than this.
        u32::try_from(v).unwrap_or(u32::MAX)
    }
}

impl SegmentPass for RowBuilder {
    type Output = SegmentRows;

    fn pass_over_step(&mut self) {
        self.step = self.step.saturating_add(1);
    }

    fn record(&mut self, record: SegmentRecord<'_>) {
        let (s, info) = match record {
            SegmentRecord::Step(s, info) => (s, info),
            SegmentRecord::Event(e) => return self.event(e),
        };
        let row = self.rows.len();
        let row32 = Self::end_of(row);
        let bitness = s.mode.bitness() as u8;
        let text = self.text(s.pc, s.bytes, bitness, info);
        let rows = &mut self.rows;
        rows.steps.push(self.step);
        self.step = self.step.saturating_add(1);
        rows.cr3.push(cr3_root(s.cr3));
        rows.cpl.push(s.cpl);
        rows.bitness.push(bitness);
        rows.insn.push(text);
        rows.task.push(self.task);
        if row == 0 {
            rows.changed.push(ALL_REGISTERS);
            rows.values.extend((0..REG_COUNT).map(|i| s.regs.get(i)));
            rows.known.push(false);
            rows.first_regs = Some(s.regs);
            rows.first_memory = Some(info.clone());
            rows.first_recorded = std::mem::take(&mut self.recorded);
        } else {
            let mask = changed_mask(self.before.as_ref(), &s.regs);
            rows.changed.push(mask);
            rows.values
                .extend(registers_in(mask).map(|reg| s.regs.get(reg)));
            // An interrupt's delivery moved the stack between the steps:
            // the registers before the handler's first step are not the
            // interrupted step's.
            let before = self.before.as_ref().filter(|_| !self.delivered);
            rows.known.push(before.is_some());
            // The step before branched here, with nothing between.
            if let Some(access) = self.awaiting.take().and_then(|i| rows.reads.get_mut(i)) {
                if before.is_some() {
                    access.value = Some(target_value(s.pc, access.size));
                }
            }
            if let Some(before) = before {
                self.awaiting = accesses(
                    info,
                    (before, &s.regs),
                    None,
                    &self.recorded,
                    &mut rows.reads,
                    &mut rows.writes,
                );
            }
            self.recorded.clear();
        }
        rows.reads_end.push(Self::end_of(rows.reads.len()));
        rows.writes_end.push(Self::end_of(rows.writes.len()));
        rows.events.append(&mut self.pending);
        rows.events_end.push(Self::end_of(rows.events.len()));
        if let Some(n) = vtrace_analyzer::system_call_made_by(s) {
            rows.syscalls.push((row32, n));
        }
        if let Some(v) = self.interrupt.take() {
            rows.interrupts.push((row32, v));
        }
        self.delivered = false;
        self.after_int_80 = vtrace_analyzer::is_int_80(s);
        // In place: a new `Some` copied the registers twice (measured).
        match &mut self.before {
            Some(before) => *before = s.regs,
            None => self.before = Some(s.regs),
        }
    }

    fn finish(self) -> SegmentRows {
        let mut rows = self.rows;
        rows.last_regs = self.before;
        rows.last_int_80 = self.after_int_80;
        rows.trailing_events = self.pending;
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vtrace_analyzer::InsnCache;
    use vtrace_storage::{CpuMode, InterruptSource, Step};

    fn step(pc: u64, bytes: &[u8], rsp: u64, rax: u64) -> Step {
        let mut regs = Regs::default();
        regs.gpr[4] = rsp;
        regs.gpr[0] = rax;
        Step {
            pc,
            bytes: InsnBytes::new(bytes).expect("bytes"),
            cr3: 0x5000,
            mode: CpuMode::Long64,
            cpl: 0,
            regs,
        }
    }

    fn build(records: &[Result<Step, Event>]) -> SegmentRows {
        let mut cache = InsnCache::default();
        let mut b = RowBuilder::new(0, 100, 8);
        for r in records {
            match r {
                Ok(s) => b.record(SegmentRecord::Step(s, &cache.get(s).clone())),
                Err(e) => b.record(SegmentRecord::Event(e)),
            }
        }
        b.finish()
    }

    const PUSH_RAX: &[u8] = &[0x50];
    const MOV_RAX_1: &[u8] = &[0x48, 0xc7, 0xc0, 1, 0, 0, 0];

    #[test]
    fn rows_hold_changes_addresses_and_events() {
        let interrupt = Event::Interrupt {
            vector: 32,
            error_code: None,
            source: InterruptSource::Injected,
        };
        let mut rows = build(&[
            Ok(step(0x1000, MOV_RAX_1, 0x8000, 1)),
            Ok(step(0x1007, PUSH_RAX, 0x7ff8, 1)),
            Err(interrupt),
            // The delivery pushed a frame: rsp moved between the steps.
            Ok(step(0x2000, PUSH_RAX, 0x7fc8, 1)),
            Ok(step(0x2001, MOV_RAX_1, 0x7fc8, 1)),
            Err(Event::Halt),
        ]);
        assert_eq!(rows.len(), 4);
        // Before `finish`, the first row lists every register.
        assert_eq!(rows.changed[0], ALL_REGISTERS);
        assert_eq!(rows.changed[1], 1 << 4, "push changes rsp only");
        assert_eq!(rows.register(1, REG_COUNT, 4), Some(0x7ff8));
        assert_eq!(rows.register(1, REG_COUNT, 0), None);
        // push writes at the new rsp, from the registers before it.
        assert_eq!(
            rows.writes[..rows.writes_end[1] as usize],
            [Access {
                addr: 0x7ff8,
                size: 8,
                value: Some(1)
            }]
        );
        // The handler's first step: changes known, addresses not.
        assert!(!rows.known[2]);
        assert_eq!(rows.changed[2], 1 << 4);
        assert_eq!(rows.interrupts, vec![(2, 32)]);
        assert_eq!(rows.events[..rows.events_end[2] as usize].len(), 1);
        assert!(rows.known[3]);
        assert_eq!(rows.changed[3], 0, "mov rax, 1 with rax already 1");
        assert_eq!(
            rows.trailing_events.len(),
            1,
            "the halt after the last step"
        );

        // Completed with the registers before the first step and routines.
        let mut before = Regs::default();
        before.gpr[4] = 0x8000;
        let runs = [
            RoutineRun {
                first: 100,
                steps: 2,
                func: 7,
            },
            RoutineRun {
                first: 102,
                steps: 2,
                func: 9,
            },
        ];
        rows.finish(Some((&before, false)), vec!["carried".into()], &runs);
        assert_eq!(rows.changed[0], 1, "rax only");
        assert_eq!(rows.register(0, 0, 0), Some(1));
        assert!(rows.known[0]);
        assert_eq!(rows.routine, vec![7, 7, 9, 9]);
        assert_eq!(rows.first_events, vec!["carried".to_string()]);
    }

    #[test]
    fn an_int_80_delivery_at_a_segments_start_is_the_system_call_before() {
        let mut int_80 = step(0x1000, &[0xcd, 0x80], 0x7ff8, 20);
        int_80.cpl = 3;
        let ended = build(&[Ok(step(0x0ffe, PUSH_RAX, 0x7ff8, 20)), Ok(int_80)]);
        assert!(ended.last_int_80);
        let next = || {
            build(&[
                Err(Event::Interrupt {
                    vector: 0x80,
                    error_code: None,
                    source: InterruptSource::Injected,
                }),
                Ok(step(0x2000, PUSH_RAX, 0xf000, 20)),
            ])
        };
        let regs = ended.last_regs.expect("registers after the int 0x80");
        for (int_80, interrupts) in [(true, vec![]), (false, vec![(0, 0x80)])] {
            let mut rows = next();
            rows.finish(Some((&regs, int_80)), Vec::new(), &[]);
            assert_eq!(rows.interrupts, interrupts, "after an int 0x80: {int_80}");
            assert!(!rows.known[0], "the delivery moved the stack all the same");
        }
    }

    #[test]
    fn an_int_80_delivery_is_no_interrupt_but_moves_the_stack() {
        let interrupt = |vector| {
            Err(Event::Interrupt {
                vector,
                error_code: None,
                source: InterruptSource::Injected,
            })
        };
        let mut int_80 = step(0x1000, &[0xcd, 0x80], 0x7ff8, 20);
        int_80.cpl = 3;
        let rows = build(&[
            Ok(step(0x0ffe, PUSH_RAX, 0x7ff8, 20)),
            Ok(int_80),
            // The host recorded the delivery (AMD-V does).
            interrupt(0x80),
            Ok(step(0x2000, PUSH_RAX, 0xf000, 20)),
            interrupt(0x80),
            Ok(step(0x2000, PUSH_RAX, 0xeff8, 20)),
        ]);
        assert_eq!(rows.syscalls.len(), 1, "the int 0x80");
        assert_eq!(
            rows.interrupts,
            vec![(3, 0x80)],
            "only the one after a push"
        );
        assert!(!rows.known[2], "the delivery moved the stack all the same");
        assert!(!rows.known[3]);
    }

    #[test]
    fn a_break_makes_every_register_changed_and_addresses_unknown() {
        let rows = build(&[
            Ok(step(0x1000, PUSH_RAX, 0x7ff8, 1)),
            Err(Event::Gap {
                from: 0x1001,
                to: 0x3000,
            }),
            Ok(step(0x3000, PUSH_RAX, 0x6ff8, 1)),
        ]);
        assert_eq!(rows.changed[1], ALL_REGISTERS);
        assert!(!rows.known[1]);
        assert_eq!(rows.register(1, REG_COUNT, 4), Some(0x6ff8));
        assert_eq!(rows.last_regs.map(|r| r.gpr[4]), Some(0x6ff8));
    }

    #[test]
    fn each_step_gets_its_own_instruction_text() {
        // 0x1000 and 0x1400 share a slot of the recent texts; the code at
        // 0x1000 changes (new bytes at the same pc) and changes back.
        let rows = build(&[
            Ok(step(0x1000, PUSH_RAX, 0x7ff8, 1)),
            Ok(step(0x1400, MOV_RAX_1, 0x7ff8, 1)),
            Ok(step(0x1000, PUSH_RAX, 0x7ff0, 1)),
            Ok(step(0x1000, MOV_RAX_1, 0x7ff0, 1)),
            Ok(step(0x1000, PUSH_RAX, 0x7fe8, 1)),
        ]);
        let text = |row: usize| rows.texts[rows.insn[row] as usize].disassembly.as_str();
        assert_eq!(RECENT_TEXTS, 1024, "the slots this test's pcs share");
        assert_eq!(text(0), "push rax");
        assert_eq!(text(1), "mov rax,1");
        assert_eq!(text(2), "push rax");
        assert_eq!(text(3), "mov rax,1");
        assert_eq!(text(4), "push rax");
        // One text per distinct pc and bytes.
        assert_eq!(rows.texts.len(), 3);
    }
}
