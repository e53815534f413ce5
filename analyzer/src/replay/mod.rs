//! Standing at any step of a trace, as a debugger does: the registers
//! there, the memory the trace knows there, and the way to the next or
//! last earlier step at an address. `vtrace analyze gdb` serves it to gdb.
//!
//! A position is a step of one CPU, not yet run: its pc, and the
//! registers after the CPU's step before it. One pass at opening indexes
//! what look-ups need (`index`: memory accesses, code, addresses run per
//! segment); a look-up then decodes only the segments it lands in, so
//! jumping to any step costs one or two segments' decoding.

mod image;
mod index;
mod memory;
mod points;

use std::sync::Arc;

use rustc_hash::FxHashMap;
use vtrace_storage::{CpuMode, InsnBytes};

pub use image::ReadOnlyImage;
pub use memory::{space_of, MemoryIndex, Observation, Spaces};
pub use points::{Before, Point, Points};

use crate::error::{AnalyzeError, Result};
use crate::input::{Progress, SegmentInfo, Trace};
use index::{index_segment, TraceIndex};

/// Where a debugger stands: a step of the CPU followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// Index in the trace's readable segments.
    segment: usize,
    /// Index among that segment's steps of the CPU.
    index: usize,
}

/// The machine state at a position, as far as the trace knows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// The step's number in the trace.
    pub step: u64,
    /// Its address: RIP.
    pub pc: u64,
    /// Its address space.
    pub cr3: u64,
    /// Its mode.
    pub mode: CpuMode,
    /// Its privilege level.
    pub cpl: u8,
    /// RAX to R15 (encoding order) before it, where known.
    pub gpr: [Option<u64>; 16],
    /// RFLAGS before it, where known.
    pub rflags: Option<u64>,
    /// CR0, CR4 and EFER as the trace last recorded them, where it did.
    pub cr0: Option<u64>,
    /// See [`State::cr0`].
    pub cr4: Option<u64>,
    /// See [`State::cr0`].
    pub efer: Option<u64>,
}

/// Memory a debugger watches: `len` bytes at `addr`, for stores, loads or
/// both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watch {
    /// The first byte.
    pub addr: u64,
    /// How many.
    pub len: u64,
    /// Stores count.
    pub stores: bool,
    /// Loads count.
    pub loads: bool,
}

/// Which way to search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Later steps.
    Forward,
    /// Earlier steps.
    Backward,
}

/// A trace opened for standing at its steps.
pub struct Replay {
    trace: Trace,
    cpu: Option<u32>,
    segments: Vec<SegmentInfo>,
    /// Per segment: the addresses the CPU ran there, sorted.
    pcs: Vec<Vec<u64>>,
    /// Per segment: how many steps of the CPU it holds.
    counts: Vec<usize>,
    memory: MemoryIndex,
    /// Code by address space and address: each version's first step.
    code: FxHashMap<(u64, u64), Vec<(u64, InsnBytes)>>,
    /// Step, register, value, in step order.
    controls: Vec<(u64, u8, u64)>,
    images: Vec<ReadOnlyImage>,
    spaces: Spaces,
    /// Decoded segments, the latest used last.
    cache: Vec<(usize, Arc<Points>)>,
}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay")
            .field("segments", &self.segments.len())
            .field("accesses", &self.memory.len())
            .finish_non_exhaustive()
    }
}

/// Decoded segments kept: a step back over a segment's start, and a
/// search's segment, without decoding the one in use again.
const CACHED_SEGMENTS: usize = 4;

/// Code bytes at most in one instruction.
const MAX_INSN: u64 = 15;

impl Replay {
    /// Indexes `trace` (the CPU it selected, or its only one) for look-ups;
    /// `images` are read-only memory that holds at every step (a kernel's
    /// text and read-only data).
    pub fn open(
        trace: Trace,
        images: Vec<ReadOnlyImage>,
        progress: Progress<'_>,
    ) -> Result<Replay> {
        let cpu = trace.one_cpu()?;
        if trace.steps() == 0 {
            return Err(AnalyzeError::NoSteps);
        }
        let all = trace.segments.clone();
        let spaces = spaces_of(&trace, &all)?;
        let mut index = TraceIndex::new(spaces);
        trace.for_each_ordered(
            &all,
            |info, records| index_segment(records, info.first_step, cpu, spaces),
            |chunk| {
                match chunk.result {
                    Ok(segment) => index.add(chunk.info, segment),
                    Err(_) => index.damaged(&chunk.info),
                }
                Ok::<(), AnalyzeError>(())
            },
            progress,
        )?;
        if index.segments.is_empty() {
            return Err(AnalyzeError::NoSteps);
        }
        Ok(Replay {
            trace,
            cpu,
            segments: index.segments,
            pcs: index.pcs,
            counts: index.counts,
            memory: MemoryIndex::new(index.seen, index.breaks),
            code: index.code,
            controls: index.controls,
            images,
            spaces,
            cache: Vec::new(),
        })
    }

    /// The trace.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// Memory accesses the index holds.
    pub fn accesses(&self) -> usize {
        self.memory.len()
    }

    fn points(&mut self, segment: usize) -> Result<Arc<Points>> {
        if let Some(at) = self.cache.iter().position(|(s, _)| *s == segment) {
            let entry = self.cache.remove(at);
            let points = Arc::clone(&entry.1);
            self.cache.push(entry);
            return Ok(points);
        }
        let info = self.segments[segment];
        let cpu = self.cpu;
        let points = Arc::new(self.trace.read_segment(&info, |records| {
            points::points(records, info.first_step, cpu)
        })?);
        if self.cache.len() >= CACHED_SEGMENTS {
            self.cache.remove(0);
        }
        self.cache.push((segment, Arc::clone(&points)));
        Ok(points)
    }

    /// The CPU's first step in the trace.
    pub fn first(&self) -> Option<Position> {
        let segment = self.counts.iter().position(|&c| c > 0)?;
        Some(Position { segment, index: 0 })
    }

    /// The CPU's last step in the trace.
    pub fn last(&self) -> Option<Position> {
        let segment = self.counts.iter().rposition(|&c| c > 0)?;
        Some(Position {
            segment,
            index: self.counts[segment] - 1,
        })
    }

    /// The CPU's step `step`, or its first step after it where `step` is
    /// another CPU's; `None` past its last.
    pub fn at_step(&mut self, step: u64) -> Result<Option<Position>> {
        let from = self
            .segments
            .partition_point(|s| s.first_step.saturating_add(s.steps) <= step);
        for segment in from..self.segments.len() {
            let points = self.points(segment)?;
            if let Some(index) = points.points.iter().position(|p| p.step >= step) {
                return Ok(Some(Position { segment, index }));
            }
        }
        Ok(None)
    }

    /// The CPU's step after `at`.
    pub fn next(&self, at: Position) -> Option<Position> {
        if at.index + 1 < self.counts[at.segment] {
            return Some(Position {
                index: at.index + 1,
                ..at
            });
        }
        let segment = (at.segment + 1..self.counts.len()).find(|&s| self.counts[s] > 0)?;
        Some(Position { segment, index: 0 })
    }

    /// The CPU's step before `at`.
    pub fn prev(&self, at: Position) -> Option<Position> {
        if at.index > 0 {
            return Some(Position {
                index: at.index - 1,
                ..at
            });
        }
        let segment = (0..at.segment).rev().find(|&s| self.counts[s] > 0)?;
        Some(Position {
            segment,
            index: self.counts[segment] - 1,
        })
    }

    /// The step at `at`.
    pub fn point(&mut self, at: Position) -> Result<Point> {
        let points = self.points(at.segment)?;
        points
            .points
            .get(at.index)
            .copied()
            .ok_or(AnalyzeError::NoSteps)
    }

    /// How the registers before `at` are known, across segments.
    fn before(&mut self, at: Position) -> Result<(Before, Option<Point>)> {
        let point = self.point(at)?;
        if at.index > 0 {
            return Ok((
                point.before,
                Some(self.point(Position {
                    index: at.index - 1,
                    ..at
                })?),
            ));
        }
        let Some(prev) = self.prev(at) else {
            return Ok((Before::Unknown, None));
        };
        // The segment before must end where this one starts.
        let before = &self.segments[prev.segment];
        if prev.segment + 1 != at.segment
            || before.first_step.saturating_add(before.steps)
                != self.segments[at.segment].first_step
        {
            return Ok((Before::Unknown, None));
        }
        let tail = self.points(prev.segment)?.tail.unwrap_or(Before::Unknown);
        Ok((tail.then(point.before), Some(self.point(prev)?)))
    }

    /// The state at `at`.
    pub fn state(&mut self, at: Position) -> Result<State> {
        let point = self.point(at)?;
        let (before, prev) = self.before(at)?;
        let mut state = State {
            step: point.step,
            pc: point.pc,
            cr3: point.cr3,
            mode: point.mode,
            cpl: point.cpl,
            ..State::default()
        };
        if let (Some(prev), true) = (prev, before != Before::Unknown) {
            for (i, r) in state.gpr.iter_mut().enumerate() {
                *r = Some(prev.after.gpr[i]);
            }
            state.rflags = Some(prev.after.rflags);
            if before == Before::Interrupted {
                state.gpr[4] = None;
                state.rflags = None;
            }
        }
        let upto = self.controls.partition_point(|c| c.0 <= point.step);
        for &(_, reg, value) in self.controls[..upto].iter().rev() {
            let slot = match reg {
                0 => &mut state.cr0,
                4 => &mut state.cr4,
                0xEF => &mut state.efer,
                _ => continue,
            };
            slot.get_or_insert(value);
        }
        Ok(state)
    }

    /// The nearest step from `at` (not `at` itself) in `direction` whose
    /// address is one of `pcs`; `None` where none is.
    pub fn find(
        &mut self,
        at: Position,
        direction: Direction,
        pcs: &[u64],
    ) -> Result<Option<Position>> {
        let holds = |segment: &Vec<u64>| pcs.iter().any(|pc| segment.binary_search(pc).is_ok());
        let mut segment = at.segment;
        loop {
            if holds(&self.pcs[segment]) {
                let points = self.points(segment)?;
                let hit = |p: &Point| pcs.contains(&p.pc);
                let found = match direction {
                    Direction::Forward => {
                        let from = if segment == at.segment {
                            at.index + 1
                        } else {
                            0
                        };
                        points
                            .points
                            .iter()
                            .enumerate()
                            .skip(from)
                            .find(|(_, p)| hit(p))
                    }
                    Direction::Backward => {
                        let to = if segment == at.segment {
                            at.index
                        } else {
                            points.points.len()
                        };
                        points.points[..to.min(points.points.len())]
                            .iter()
                            .enumerate()
                            .rev()
                            .find(|(_, p)| hit(p))
                    }
                };
                if let Some((index, _)) = found {
                    return Ok(Some(Position { segment, index }));
                }
            }
            segment = match direction {
                Direction::Forward if segment + 1 < self.segments.len() => segment + 1,
                Direction::Backward if segment > 0 => segment - 1,
                _ => return Ok(None),
            };
        }
    }

    /// The nearest step from `at` in `direction` whose memory access
    /// touches one of `watches`, and that watch's address: going forward,
    /// where the guest stands once the access is done (the next step);
    /// backward, the accessing step itself (before it ran). `None` where
    /// no step does.
    pub fn find_access(
        &mut self,
        at: Position,
        direction: Direction,
        watches: &[Watch],
    ) -> Result<Option<(Position, u64)>> {
        let point = self.point(at)?;
        let root = self.spaces.root(point.cr3);
        let forward = direction == Direction::Forward;
        let mut best: Option<(u64, u64)> = None;
        for w in watches {
            let space = space_of(root, w.addr);
            let kinds = (w.stores, w.loads);
            let Some(step) =
                self.memory
                    .nearest_access(space, (w.addr, w.len), point.step, kinds, forward)
            else {
                continue;
            };
            let nearer = best.is_none_or(|(b, _)| if forward { step < b } else { step > b });
            if nearer {
                best = Some((step, w.addr));
            }
        }
        let Some((step, addr)) = best else {
            return Ok(None);
        };
        let stand = match forward {
            true => step.saturating_add(1),
            false => step,
        };
        Ok(self.at_step(stand)?.map(|p| (p, addr)))
    }

    /// Reads memory at `addr` as it was before the step at `at` ran, into
    /// `buf` as far as it is known: returns how many bytes from the start
    /// are.
    pub fn read_memory(&mut self, at: Position, addr: u64, buf: &mut [u8]) -> Result<usize> {
        let point = self.point(at)?;
        for (i, out) in buf.iter_mut().enumerate() {
            let Some(addr) = addr.checked_add(i as u64) else {
                return Ok(i);
            };
            match self.byte(point.cr3, addr, point.step) {
                Some(b) => *out = b,
                None => return Ok(i),
            }
        }
        Ok(buf.len())
    }

    fn byte(&self, cr3: u64, addr: u64, step: u64) -> Option<u8> {
        let space = space_of(self.spaces.root(cr3), addr);
        if let Some(known) = self.memory.byte(space, addr, step) {
            return known;
        }
        self.code_byte(space, addr, step)
            .or_else(|| self.images.iter().find_map(|i| i.byte(addr)))
    }

    /// The byte at `addr` of code the trace ran: the version fetched last
    /// before `step`, else the first after.
    fn code_byte(&self, space: u64, addr: u64, step: u64) -> Option<u8> {
        let mut best: Option<(u64, u8)> = None;
        for back in 0..MAX_INSN {
            let pc = addr.checked_sub(back)?;
            let Some(versions) = self.code.get(&(space, pc)) else {
                continue;
            };
            let at = versions.partition_point(|v| v.0 <= step).saturating_sub(1);
            let (first, bytes) = versions[at];
            let Some(&b) = bytes.as_slice().get(back as usize) else {
                continue;
            };
            // The version nearest the step wins.
            let distance = first.abs_diff(step);
            if best.is_none_or(|(d, _)| distance < d) {
                best = Some((distance, b));
            }
        }
        best.map(|(_, b)| b)
    }

    /// The step number of `at`.
    pub fn step_of(&mut self, at: Position) -> Result<u64> {
        Ok(self.point(at)?.step)
    }

    /// The readable steps: the first's number and one past the last's.
    pub fn step_range(&self) -> (u64, u64) {
        self.trace.step_range().unwrap_or((0, 0))
    }
}

/// How the trace's addresses divide into spaces, from its first
/// segment's kernel steps.
fn spaces_of(trace: &Trace, segments: &[SegmentInfo]) -> Result<Spaces> {
    let Some(first) = segments.first() else {
        return Ok(Spaces::Flat);
    };
    let (mut upper, mut lower) = (0u64, 0u64);
    trace.read_segment(first, |records| {
        while let Some(record) = records.next_record() {
            if let vtrace_storage::RecordRef::Step(s) = record {
                if s.cpl == 0 {
                    if space_of(1, s.pc) == 0 {
                        upper += 1;
                    } else {
                        lower += 1;
                    }
                }
            }
        }
    })?;
    Ok(Spaces::of_kernel_steps(upper, lower))
}
