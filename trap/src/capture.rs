//! Captures (`vtrace run --capture`): when execution reaches a place,
//! guest memory at the address a register holds is copied into the trace,
//! a table of places and what to copy at each.
//!
//! While tracing, every step's pc is checked against the places; while
//! not, the places take the debug registers left over (see
//! [`crate::Tracer`]).

use vtrace_storage::Event;
#[cfg(doc)]
use vtrace_storage::Regs;
use vtrace_vmm::CpuView;

use crate::engine::{to_regs, Engine};

/// Most captures a run takes: a table of places, not a general
/// instrumentation language.
pub const MAX_CAPTURES: usize = 30;

/// Most bytes one capture copies.
pub const MAX_CAPTURE_LENGTH: u32 = 4096;

/// One capture: where, from which register, how much, under what name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureSite {
    /// The name the trace gives its captures.
    pub name: String,
    /// The linear address of the instruction before which it is taken.
    pub at: u64,
    /// The general register holding the data's address, as an index
    /// into [`Regs::gpr`] (see [`Regs::gpr_index`]).
    pub register: usize,
    /// Bytes to copy, 1 to [`MAX_CAPTURE_LENGTH`].
    pub length: u32,
    /// Taken only in tasks of this name (a user program's place).
    pub task: Option<String>,
}

/// How often one capture was taken.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureCount {
    /// The capture's name.
    pub name: String,
    /// Times it was taken.
    pub taken: u64,
    /// Times some or all of its bytes were not present (and skipped).
    pub short: u64,
}

/// The run's captures, in the order given.
pub(crate) struct Captures {
    sites: Vec<CaptureSite>,
    /// The sites' places, sorted, for the per-step search...
    places: Vec<u64>,
    /// ...and the index of the site at each.
    order: Vec<usize>,
    counts: Vec<CaptureCount>,
}

impl Captures {
    pub(crate) fn new(sites: Vec<CaptureSite>) -> Captures {
        let mut order: Vec<usize> = (0..sites.len()).collect();
        order.sort_by_key(|&i| sites[i].at);
        let places = order.iter().map(|&i| sites[i].at).collect();
        let counts = sites
            .iter()
            .map(|s| CaptureCount {
                name: s.name.clone(),
                ..CaptureCount::default()
            })
            .collect();
        Captures {
            sites,
            places,
            order,
            counts,
        }
    }

    /// Whether any capture is taken at `pc` (on the per-step path: one
    /// emptiness test when there are none).
    #[inline]
    pub(crate) fn at(&self, pc: u64) -> bool {
        !self.places.is_empty() && self.places.binary_search(&pc).is_ok()
    }

    /// The distinct places, for breakpoints.
    pub(crate) fn places(&self) -> Vec<u64> {
        let mut places = self.places.clone();
        places.dedup();
        places
    }

    /// The indexes of the captures at `pc`, in the order given.
    pub(crate) fn sites_at(&self, pc: u64) -> Vec<usize> {
        let start = self.places.partition_point(|&p| p < pc);
        let end = self.places.partition_point(|&p| p <= pc);
        let mut at = self.order[start..end].to_vec();
        at.sort_unstable();
        at
    }

    pub(crate) fn site(&self, i: usize) -> &CaptureSite {
        &self.sites[i]
    }

    /// Takes capture `i` with the vCPU about to run its place: reads the
    /// register, copies what is present of the memory it points to.
    pub(crate) fn take(&mut self, i: usize, engine: &mut Engine, cpu: &mut dyn CpuView) -> Event {
        let site = &self.sites[i];
        let addr = to_regs(&cpu.regs()).get(site.register);
        let mut bytes = vec![0; site.length as usize];
        let read = engine.read_linear_prefix(cpu, addr, &mut bytes);
        bytes.truncate(read);
        let count = &mut self.counts[i];
        count.taken += 1;
        if read < site.length as usize {
            count.short += 1;
        }
        Event::Capture {
            name: site.name.clone(),
            addr,
            length: site.length,
            bytes,
        }
    }

    /// How often each was taken, in the order given.
    pub(crate) fn counts(&self) -> Vec<CaptureCount> {
        self.counts.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_machine::{machine, CODE};
    use vtrace_storage::Regs;

    fn site(name: &str, at: u64, register: &str, length: u32) -> CaptureSite {
        CaptureSite {
            name: name.into(),
            at,
            register: Regs::gpr_index(register).unwrap(),
            length,
            task: None,
        }
    }

    #[test]
    fn places_are_found_by_address_and_may_be_shared() {
        let c = Captures::new(vec![
            site("b", 0x30, "rdi", 8),
            site("a", 0x10, "rsi", 8),
            site("c", 0x30, "rdx", 8),
        ]);
        assert!(c.at(0x10) && c.at(0x30));
        assert!(!c.at(0x20));
        assert_eq!(c.places(), vec![0x10, 0x30]);
        let names: Vec<&str> = c
            .sites_at(0x30)
            .into_iter()
            .map(|i| c.site(i).name.as_str())
            .collect();
        assert_eq!(names, ["b", "c"]);
        assert!(c.sites_at(0x20).is_empty());
        assert!(!Captures::new(Vec::new()).at(0x10));
    }

    #[test]
    fn memory_is_copied_from_the_registers_address_and_what_is_absent_skipped() {
        let mut cpu = machine(&[0x90]);
        let mut engine = Engine::new();
        // The test machine maps its code page: capture from there.
        cpu.regs.rdi = CODE;
        let mut c = Captures::new(vec![site("code", CODE, "rdi", 4)]);
        let Event::Capture {
            name,
            addr,
            length,
            bytes,
        } = c.take(0, &mut engine, &mut cpu)
        else {
            panic!("not a capture")
        };
        assert_eq!((name.as_str(), addr, length), ("code", CODE, 4));
        assert_eq!(bytes, [0x90, 0, 0, 0]);
        // An address nothing maps: nothing copied, and counted as short.
        cpu.regs.rdi = 0x7fff_0000_0000;
        let Event::Capture { bytes, .. } = c.take(0, &mut engine, &mut cpu) else {
            panic!("not a capture")
        };
        assert!(bytes.is_empty());
        assert_eq!(
            c.counts(),
            [CaptureCount {
                name: "code".into(),
                taken: 2,
                short: 1
            }]
        );
    }
}
