//! The guest's own requests to trace (TRACE_START, TRACE_STOP and
//! TRACE_REGION hypercalls) with their pass counts, as a decision the
//! tracer then carries out.

use vtrace_guest::cmd;
use vtrace_storage::TraceReason;

/// What a tracing hypercall asks of the tracer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Request {
    /// Start tracing for this reason.
    Start(TraceReason),
    /// Stop tracing for this reason.
    Stop(TraceReason),
}

/// The pass counts of the guest's tracing hypercalls. Pass counts as the
/// in-kernel tracers' system calls had them: 0 and 1 mean "this call"; n
/// means "the n-th call".
#[derive(Clone, Debug, Default)]
pub(super) struct GuestRequests {
    /// The guest's requests are obeyed (else only counted).
    obeyed: bool,
    start_calls: u64,
    /// The START hypercall's pass count fires once per run.
    start_fired: bool,
    /// STOP calls since tracing last started.
    stop_calls: u64,
    region_calls: u64,
    /// The call count at which a TRACE_REGION started tracing stops it.
    region_stop: Option<u64>,
}

/// Whether the `count`-th call is the one a pass count of `pass` names.
fn due(count: u64, pass: u64) -> bool {
    count >= pass.max(1)
}

impl GuestRequests {
    /// Requests that are obeyed, or only counted.
    pub(super) fn new(obeyed: bool) -> GuestRequests {
        GuestRequests {
            obeyed,
            ..GuestRequests::default()
        }
    }

    /// Whether `command` is one of the tracing hypercalls.
    pub(super) fn is_tracing_call(command: u32) -> bool {
        matches!(
            command,
            cmd::TRACE_START | cmd::TRACE_STOP | cmd::TRACE_REGION
        )
    }

    /// A tracing hypercall with its first two arguments, tracing being on
    /// (`active`) or not: counted, and what it asks for, if anything.
    pub(super) fn call(&mut self, command: u32, args: [u64; 2], active: bool) -> Option<Request> {
        match command {
            cmd::TRACE_START => {
                self.start_calls += 1;
                let fires =
                    self.obeyed && !active && !self.start_fired && due(self.start_calls, args[0]);
                if !fires {
                    return None;
                }
                self.start_fired = true;
                Some(Request::Start(TraceReason::Hypercall {
                    pass: self.start_calls,
                }))
            }
            cmd::TRACE_REGION => {
                self.region_calls += 1;
                let n = self.region_calls;
                let (start, passes) = (args[0].max(1), args[1]);
                if !self.obeyed {
                    None
                } else if self.region_stop == Some(n) {
                    self.region_stop = None;
                    Some(Request::Stop(TraceReason::Hypercall { pass: n }))
                } else if n == start && !active {
                    self.region_stop = (passes > 0).then(|| start.saturating_add(passes));
                    Some(Request::Start(TraceReason::Hypercall { pass: n }))
                } else {
                    None
                }
            }
            cmd::TRACE_STOP if self.obeyed && active => {
                self.stop_calls += 1;
                due(self.stop_calls, args[0]).then_some(Request::Stop(TraceReason::Hypercall {
                    pass: self.stop_calls,
                }))
            }
            _ => None,
        }
    }

    /// Tracing started, by whatever means: STOP's pass count starts over.
    pub(super) fn tracing_started(&mut self) {
        self.stop_calls = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hypercall(pass: u64) -> TraceReason {
        TraceReason::Hypercall { pass }
    }

    #[test]
    fn start_fires_once_at_its_pass() {
        let mut g = GuestRequests::new(true);
        assert_eq!(g.call(cmd::TRACE_START, [3, 0], false), None);
        assert_eq!(g.call(cmd::TRACE_START, [3, 0], false), None);
        assert_eq!(
            g.call(cmd::TRACE_START, [3, 0], false),
            Some(Request::Start(hypercall(3)))
        );
        assert_eq!(g.call(cmd::TRACE_START, [3, 0], false), None, "once a run");
    }

    #[test]
    fn stop_counts_its_passes_from_the_start() {
        let mut g = GuestRequests::new(true);
        assert_eq!(g.call(cmd::TRACE_STOP, [1, 0], false), None, "not tracing");
        g.tracing_started();
        assert_eq!(g.call(cmd::TRACE_STOP, [2, 0], true), None);
        assert_eq!(
            g.call(cmd::TRACE_STOP, [2, 0], true),
            Some(Request::Stop(hypercall(2)))
        );
        g.tracing_started();
        assert_eq!(
            g.call(cmd::TRACE_STOP, [0, 0], true),
            Some(Request::Stop(hypercall(1))),
            "0 means this call; counted anew after a start"
        );
    }

    #[test]
    fn a_region_traces_its_passes() {
        let mut g = GuestRequests::new(true);
        // Start on the 2nd call, trace 2 passes: stop on the 4th.
        assert_eq!(g.call(cmd::TRACE_REGION, [2, 2], false), None);
        assert_eq!(
            g.call(cmd::TRACE_REGION, [2, 2], false),
            Some(Request::Start(hypercall(2)))
        );
        assert_eq!(g.call(cmd::TRACE_REGION, [2, 2], true), None);
        assert_eq!(
            g.call(cmd::TRACE_REGION, [2, 2], true),
            Some(Request::Stop(hypercall(4)))
        );
        assert_eq!(g.call(cmd::TRACE_REGION, [2, 2], false), None);
    }

    #[test]
    fn requests_not_obeyed_are_only_counted() {
        let mut g = GuestRequests::new(false);
        assert_eq!(g.call(cmd::TRACE_START, [0, 0], false), None);
        assert_eq!(g.call(cmd::TRACE_REGION, [1, 1], false), None);
        assert_eq!(g.call(cmd::TRACE_STOP, [0, 0], true), None);
        assert!(GuestRequests::is_tracing_call(cmd::TRACE_REGION));
        assert!(!GuestRequests::is_tracing_call(cmd::PROBE));
    }
}
