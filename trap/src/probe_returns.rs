//! `fnret:` probes' calls in flight: at a routine's entry the tracer
//! notes where the call returns to (the return address on the stack, and
//! the stack pointer after the `ret`); the step that lands there with that
//! stack pointer in that address space is the return. The stack pointer
//! tells a recursive call's return from its caller's, and the address
//! space one task's from another's. While tracing, every step's pc is
//! compared with the return addresses; while not, each return address
//! takes a breakpoint, and a call whose return address finds no debug
//! register free is forgotten.

/// Calls in flight kept at most: a routine left by a jump (longjmp, a task
/// that exits) never returns, and must not fill memory.
pub(crate) const MAX_IN_FLIGHT: usize = 4096;

/// One call in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InFlight {
    /// The `fnret:` probe (its index among the function probes).
    probe: usize,
    /// Where the `ret` goes.
    to: u64,
    /// The stack pointer after the `ret`.
    sp: u64,
    /// The address space (page-table root).
    root: u64,
    /// The clock at the entry: the trace's step count while tracing, the
    /// host's nanoseconds while not.
    entered: u64,
}

/// The calls in flight.
#[derive(Debug, Default)]
pub(crate) struct ReturnWatch {
    calls: Vec<InFlight>,
}

/// The page-table root of a CR3 value (PCID and flag bits ignored).
fn root(cr3: u64) -> u64 {
    cr3 & 0x000f_ffff_ffff_f000
}

impl ReturnWatch {
    /// Probe `probe`'s routine was entered at `entered` (on its clock),
    /// with `ret` on top of the stack at `sp`.
    pub(crate) fn entered(&mut self, probe: usize, ret: u64, sp: u64, cr3: u64, entered: u64) {
        let call = InFlight {
            probe,
            to: ret,
            sp: sp.wrapping_add(8),
            root: root(cr3),
            entered,
        };
        // A call at the same stack slot ends an older one there that was
        // never seen to return (tracing was off, or it left by a jump).
        self.calls
            .retain(|c| !(c.sp == call.sp && c.root == call.root && c.probe == probe));
        if self.calls.len() >= MAX_IN_FLIGHT {
            self.calls.remove(0);
        }
        self.calls.push(call);
    }

    /// Whether a call in flight returns to `pc` (on the per-step path:
    /// one emptiness test when there are none).
    #[inline]
    pub(crate) fn at(&self, pc: u64) -> bool {
        !self.calls.is_empty() && self.calls.iter().any(|c| c.to == pc)
    }

    /// The calls that returned with the vCPU at `pc`, `sp`, `cr3`:
    /// (probe, step count at entry), innermost first.
    pub(crate) fn returned(&mut self, pc: u64, sp: u64, cr3: u64) -> Vec<(usize, u64)> {
        let root = root(cr3);
        let mut out = Vec::new();
        self.calls.retain(|c| {
            let done = c.to == pc && c.sp == sp && c.root == root;
            if done {
                out.push((c.probe, c.entered));
            }
            !done
        });
        out.reverse();
        out
    }

    /// The return addresses of the calls in flight, each once, the latest
    /// call's first (an inner call returns before an outer one).
    pub(crate) fn places(&self) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        for c in self.calls.iter().rev() {
            if !out.contains(&c.to) {
                out.push(c.to);
            }
        }
        out
    }

    /// Forgets the calls that return to `to` (no breakpoint is left to
    /// watch it); returns how many.
    pub(crate) fn forget_returning_to(&mut self, to: u64) -> u64 {
        let before = self.calls.len();
        self.calls.retain(|c| c.to != to);
        (before - self.calls.len()) as u64
    }

    /// Forgets every call (tracing started or stopped: the clock of their
    /// entries is not the clock of their returns).
    pub(crate) fn clear(&mut self) {
        self.calls.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_return_matches_its_own_call_by_stack_and_address_space() {
        let mut w = ReturnWatch::default();
        // Recursion: the outer call at sp 0x1000, the inner at 0xf00, both
        // returning into the routine itself at 0x4010 / the caller 0x2005.
        w.entered(0, 0x2005, 0x1000, 0x5000, 10);
        w.entered(0, 0x4010, 0xf00, 0x5000, 20);
        assert!(w.at(0x4010) && w.at(0x2005) && !w.at(0x3000));
        // Another task's identical call returns in its own space.
        w.entered(0, 0x2005, 0x1000, 0x9000, 30);
        assert_eq!(w.returned(0x4010, 0xf08, 0x5000), [(0, 20)]);
        assert_eq!(w.returned(0x2005, 0x1008, 0x9000), [(0, 30)]);
        // The wrong stack pointer is not the return.
        assert!(w.returned(0x2005, 0x2008, 0x5000).is_empty());
        assert_eq!(w.returned(0x2005, 0x1008, 0x5fff), [(0, 10)]);
        assert!(!w.at(0x2005));
    }

    #[test]
    fn a_call_never_seen_to_return_is_replaced_and_the_list_is_bounded() {
        let mut w = ReturnWatch::default();
        w.entered(1, 0x2005, 0x1000, 0, 10);
        w.entered(1, 0x2005, 0x1000, 0, 50);
        assert_eq!(w.returned(0x2005, 0x1008, 0), [(1, 50)]);
        for i in 0..(MAX_IN_FLIGHT as u64 + 10) {
            w.entered(1, 0x2005, 0x10_0000 + 16 * i, 0, i);
        }
        assert_eq!(w.calls.len(), MAX_IN_FLIGHT);
        w.clear();
        assert!(!w.at(0x2005));
    }

    #[test]
    fn return_places_come_innermost_first_and_can_be_given_up() {
        let mut w = ReturnWatch::default();
        w.entered(0, 0x2005, 0x1000, 0, 10);
        w.entered(0, 0x4010, 0xf00, 0, 20);
        w.entered(1, 0x2005, 0xe00, 0, 30);
        assert_eq!(w.places(), [0x2005, 0x4010]);
        assert_eq!(w.forget_returning_to(0x2005), 2);
        assert_eq!(w.places(), [0x4010]);
        assert!(!w.at(0x2005));
    }
}
