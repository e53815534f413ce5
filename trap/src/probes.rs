//! Probes (`vtrace run --probe`), counted live and recorded as
//! [`Event::Probe`]:
//!
//! - static probes compiled into the guest (`guest-kit/include/
//!   vtrace-sdt.h`): a site fires the PROBE hypercall while its 16-bit
//!   semaphore is set, and the hypercall's address names the site. The
//!   tracer sets and clears semaphores in guest memory, before the next
//!   entry after it is asked;
//! - `fn:` probes: execution reaches a routine's entry. While tracing,
//!   every step's pc is compared with the entries; while not, they take
//!   debug registers (see [`crate::Tracer`]).

use vtrace_storage::{Event, MAX_PROBE_ARGS};
use vtrace_vmm::CpuView;
use vtrace_vmm::Hypercall;

/// One site of a static probe, as its `stapsdt` note gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticSite {
    /// `provider:name`.
    pub probe: String,
    /// The linear address of the site's hypercall.
    pub pc: u64,
    /// The guest-physical address of its 16-bit semaphore (none: it
    /// cannot be switched, and fires only if compiled to fire always).
    pub semaphore: Option<u64>,
    /// How many arguments it passes (at most [`MAX_PROBE_ARGS`]).
    pub args: usize,
}

/// A `fn:` probe: a routine's entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionProbe {
    /// `fn:ROUTINE`.
    pub probe: String,
    /// The linear address of its first instruction.
    pub entry: u64,
    /// Fires only in tasks of this name (a user program's routine).
    pub task: Option<String>,
    /// Typed values to read at each fire (`fn:ROUTINE(filename:string)`),
    /// recorded as an [`Event::ProbeValues`] after the fire.
    pub fetches: Vec<vtrace_image::probe_fetch::Fetch>,
    /// An `fnret:` probe: it fires where the call returns, with the
    /// return value and the steps since the entry, while tracing.
    pub at_return: bool,
    /// A `tp:` probe's site (`entry` is its NOP): its arguments are only
    /// its typed values (they are not in the ABI's registers there).
    pub tracepoint: bool,
    /// It also fires while tracing is off, through a breakpoint (an
    /// `fnret:` probe never does).
    pub untraced: bool,
}

/// How often one probe fired.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeCount {
    /// `provider:name`.
    pub probe: String,
    /// Fires recorded.
    pub count: u64,
    /// Whether it was enabled when the run ended.
    pub enabled: bool,
}

impl ProbeCount {
    /// Whether it is worth a word to the user: enabled, or it fired.
    pub fn shown(&self) -> bool {
        self.enabled || self.count > 0
    }
}

/// What kept probes from working as asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeTroubles {
    /// PROBE hypercalls from sites no note described.
    pub unknown_sites: u64,
    /// `fnret:` calls entered while tracing was off whose return went
    /// unwatched: no debug register was left for their return address.
    pub unwatched_returns: u64,
    /// Semaphore writes that found no guest RAM (their sites never
    /// fire, or never stop).
    pub unwritable_semaphores: u64,
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters and `?` for one. Written here rather than taken from a glob
/// crate: those match paths (separators, classes), and a probe name is a
/// plain word pair.
pub fn matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Iterative wildcard matching with one backtrack point: linear in
    // practice, and no recursion a long pattern could exhaust.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        match p.get(i) {
            Some('*') => {
                star = Some((i, j));
                i += 1;
            }
            Some(&c) if c == '?' || c == n[j] => {
                i += 1;
                j += 1;
            }
            _ => match star {
                Some((si, sj)) => {
                    i = si + 1;
                    j = sj + 1;
                    star = Some((si, sj + 1));
                }
                None => return false,
            },
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// The run's probes.
pub(crate) struct Probes {
    counts: Vec<ProbeCount>,
    sites: Vec<StaticSite>,
    /// For each site, its probe's index in `counts`.
    site_probe: Vec<usize>,
    /// The sites' pcs, sorted, with the site's index.
    by_pc: Vec<(u64, usize)>,
    functions: Vec<FunctionProbe>,
    /// For each function probe, its index in `counts`.
    function_probe: Vec<usize>,
    /// The entries of the enabled function probes, sorted (the per-step
    /// search: one emptiness test when there are none).
    watched: Vec<u64>,
    /// Those of `fn:` probes, which also fire untraced (breakpoints).
    entries: Vec<u64>,
    /// `fnret:` probes' calls in flight.
    returns: crate::probe_returns::ReturnWatch,
    /// Where the host's clock for untraced `fnret:` calls starts.
    clock_origin: std::time::Instant,
    /// Semaphore writes not yet made: (guest-physical address, value).
    writes: Vec<(u64, u16)>,
    troubles: ProbeTroubles,
}

impl Probes {
    pub(crate) fn new(sites: Vec<StaticSite>, functions: Vec<FunctionProbe>) -> Probes {
        let mut counts: Vec<ProbeCount> = Vec::new();
        let mut index = |name: &str| match counts.iter().position(|c| c.probe == name) {
            Some(i) => i,
            None => {
                counts.push(ProbeCount {
                    probe: name.to_string(),
                    ..ProbeCount::default()
                });
                counts.len() - 1
            }
        };
        let site_probe: Vec<usize> = sites.iter().map(|s| index(&s.probe)).collect();
        let function_probe: Vec<usize> = functions.iter().map(|f| index(&f.probe)).collect();
        let mut by_pc: Vec<(u64, usize)> =
            sites.iter().enumerate().map(|(i, s)| (s.pc, i)).collect();
        by_pc.sort_unstable();
        Probes {
            counts,
            sites,
            site_probe,
            by_pc,
            functions,
            function_probe,
            watched: Vec::new(),
            entries: Vec::new(),
            returns: Default::default(),
            clock_origin: std::time::Instant::now(),
            writes: Vec::new(),
            troubles: ProbeTroubles::default(),
        }
    }

    /// Enables or disables every probe whose name matches `pattern`;
    /// returns the names it matched. Static probes' semaphores are
    /// written before the next entry ([`Probes::write_semaphores`]).
    pub(crate) fn set(&mut self, pattern: &str, on: bool) -> Vec<String> {
        let mut matched = Vec::new();
        for (i, count) in self.counts.iter_mut().enumerate() {
            if !matches(pattern, &count.probe) {
                continue;
            }
            count.enabled = on;
            matched.push(count.probe.clone());
            for (site, _) in self
                .sites
                .iter()
                .zip(&self.site_probe)
                .filter(|(_, &p)| p == i)
            {
                if let Some(gpa) = site.semaphore {
                    self.writes.push((gpa, u16::from(on)));
                }
            }
        }
        let enabled = |untraced: bool| {
            let mut at: Vec<u64> = self
                .functions
                .iter()
                .zip(&self.function_probe)
                .filter(|(f, &p)| self.counts[p].enabled && (f.untraced || !untraced))
                .map(|(f, _)| f.entry)
                .collect();
            at.sort_unstable();
            at.dedup();
            at
        };
        (self.watched, self.entries) = (enabled(false), enabled(true));
        matched
    }

    /// Whether semaphores wait to be written (asked before every entry).
    #[inline]
    pub(crate) fn writes_waiting(&self) -> bool {
        !self.writes.is_empty()
    }

    /// Writes the semaphores asked for since the last entry.
    pub(crate) fn write_semaphores(&mut self, cpu: &mut dyn CpuView) {
        for (gpa, value) in self.writes.drain(..) {
            if cpu.write_physical(gpa, &value.to_le_bytes()).is_err() {
                self.troubles.unwritable_semaphores += 1;
            }
        }
    }

    /// The static probe whose site made `call`, counted, as its event;
    /// `None` for a site no note described.
    pub(crate) fn fire(&mut self, call: &Hypercall) -> Option<Event> {
        let Ok(at) = self.by_pc.binary_search_by_key(&call.rip, |&(pc, _)| pc) else {
            self.troubles.unknown_sites += 1;
            return None;
        };
        let site = self.by_pc[at].1;
        let probe = self.site_probe[site];
        self.counts[probe].count += 1;
        let all = [
            call.args[0],
            call.args[1],
            call.args[2],
            call.args[3],
            call.more_args[0],
            call.more_args[1],
        ];
        let n = self.sites[site].args.min(MAX_PROBE_ARGS);
        Some(Event::Probe {
            name: self.counts[probe].probe.clone(),
            pc: call.rip,
            args: all[..n].to_vec(),
        })
    }

    /// Whether an enabled `fn:` or `fnret:` probe's entry, or the return
    /// of an `fnret:` probe's call, is at `pc` (on the per-step path).
    #[inline]
    pub(crate) fn function_at(&self, pc: u64) -> bool {
        (!self.watched.is_empty() && self.watched.binary_search(&pc).is_ok()) || self.returns.at(pc)
    }

    /// Whether function probe `i` fires at its routine's return.
    pub(crate) fn at_return(&self, i: usize) -> bool {
        self.functions.get(i).is_some_and(|f| f.at_return)
    }

    /// Whether function probe `i` fires while tracing is off.
    pub(crate) fn untraced(&self, i: usize) -> bool {
        self.functions.get(i).is_some_and(|f| f.untraced)
    }

    /// `fnret:` probe `i`'s routine was entered (see
    /// [`crate::probe_returns::ReturnWatch::entered`]).
    pub(crate) fn call_entered(&mut self, i: usize, ret: u64, sp: u64, cr3: u64, steps: u64) {
        self.returns.entered(i, ret, sp, cr3, steps);
    }

    /// The host's nanoseconds since the run began: the clock of calls
    /// entered while tracing is off.
    pub(crate) fn host_ns(&self) -> u64 {
        u64::try_from(self.clock_origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Fires the `fnret:` probes whose calls returned with the vCPU at
    /// `regs`, in address space `cr3`, the clock at `now`: each fire's
    /// arguments are the return value and what the call took, and its
    /// typed values the same by name. While tracing (`traced`) it took
    /// `steps`, from the routine's first instruction to its `ret`, both
    /// counted; while not, `ns` of the host's time from the entry's
    /// breakpoint to the return's.
    pub(crate) fn fire_returns(
        &mut self,
        regs: &vtrace_x86::Registers,
        cr3: u64,
        now: u64,
        traced: bool,
    ) -> Vec<(Event, Event)> {
        let mut out = Vec::new();
        for (i, entered) in self.returns.returned(regs.rip, regs.rsp, cr3) {
            let probe = self.function_probe[i];
            self.counts[probe].count += 1;
            let took = now.saturating_sub(entered);
            let fire = Event::Probe {
                name: self.counts[probe].probe.clone(),
                pc: regs.rip,
                args: vec![regs.rax, took],
            };
            let int = |value| vtrace_storage::ProbeValue::Int {
                value,
                size: 8,
                signed: true,
            };
            // A return probe's own fetches are constants its plan knew (a
            // system call's number): nothing is read here.
            let mut fields = crate::probe_values::fetch_values(
                &self.functions[i].fetches,
                &crate::engine::to_regs(regs),
                &mut |_, _| 0,
            );
            fields.extend([
                vtrace_storage::ProbeField {
                    name: "retval".into(),
                    value: int(regs.rax),
                },
                vtrace_storage::ProbeField {
                    name: if traced { "steps" } else { "ns" }.into(),
                    value: int(took),
                },
            ]);
            fields.truncate(vtrace_storage::MAX_PROBE_FIELDS);
            let values = Event::ProbeValues(fields);
            out.push((fire, values));
        }
        out
    }

    /// Forgets the `fnret:` calls in flight (tracing started or stopped:
    /// their returns go unseen).
    pub(crate) fn forget_calls(&mut self) {
        self.returns.clear();
    }

    /// Where the `fnret:` calls in flight return to, innermost first.
    pub(crate) fn return_places(&self) -> Vec<u64> {
        self.returns.places()
    }

    /// Gives up the calls returning to `to`: no breakpoint is left for it.
    pub(crate) fn unwatch_returns(&mut self, to: u64) {
        self.troubles.unwatched_returns += self.returns.forget_returning_to(to);
    }

    /// The distinct entries of enabled `fn:` probes, for breakpoints.
    pub(crate) fn entries(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.iter().copied()
    }

    /// The enabled `fn:` probes at `pc`: (index, the task it is bound to).
    pub(crate) fn functions_at(&self, pc: u64) -> Vec<(usize, Option<String>)> {
        self.functions
            .iter()
            .enumerate()
            .filter(|(i, f)| f.entry == pc && self.counts[self.function_probe[*i]].enabled)
            .map(|(i, f)| (i, f.task.clone()))
            .collect()
    }

    /// Fires `fn:` probe `i` with the vCPU at its entry: its arguments are
    /// the six argument registers of the x86-64 System V ABI (none for a
    /// tracepoint's site); a typed probe's values follow, read through
    /// `read`.
    pub(crate) fn fire_function(
        &mut self,
        i: usize,
        r: &vtrace_x86::Registers,
        read: &mut crate::probe_values::ReadMemory<'_>,
    ) -> (Event, Option<Event>) {
        let probe = self.function_probe[i];
        self.counts[probe].count += 1;
        let fire = Event::Probe {
            name: self.counts[probe].probe.clone(),
            pc: self.functions[i].entry,
            args: match self.functions[i].tracepoint {
                true => Vec::new(),
                false => vec![r.rdi, r.rsi, r.rdx, r.rcx, r.r8, r.r9],
            },
        };
        let fetches = &self.functions[i].fetches;
        let values = (!fetches.is_empty()).then(|| {
            Event::ProbeValues(crate::probe_values::fetch_values(
                fetches,
                &crate::engine::to_regs(r),
                read,
            ))
        });
        (fire, values)
    }

    /// Every probe's count, in the order first named.
    pub(crate) fn counts(&self) -> Vec<ProbeCount> {
        self.counts.clone()
    }

    /// What `vtrace ctl status` adds: the enabled probes and their counts.
    pub(crate) fn status(&self) -> Option<String> {
        let on: Vec<String> = self
            .counts
            .iter()
            .filter(|c| c.shown())
            .map(|c| format!("{} {}", c.probe, c.count))
            .collect();
        (!on.is_empty()).then(|| format!("probes: {}", on.join(", ")))
    }

    /// What kept probes from working as asked.
    pub(crate) fn troubles(&self) -> ProbeTroubles {
        self.troubles
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_globs() {
        assert!(matches("sched:*", "sched:switch"));
        assert!(matches("*", "timer:tick"));
        assert!(matches("sys*:e*t", "syscall:exit"));
        assert!(matches("timer:t?ck", "timer:tick"));
        assert!(matches("fn:schedule", "fn:schedule"));
        assert!(!matches("sched:*", "syscall:entry"));
        assert!(!matches("fn:schedule", "fn:schedule_tail"));
        assert!(!matches("*:tick?", "timer:tick"));
        assert!(matches("**a*", "banana"));
    }

    fn site(probe: &str, pc: u64, semaphore: u64, args: usize) -> StaticSite {
        StaticSite {
            probe: probe.into(),
            pc,
            semaphore: Some(semaphore),
            args,
        }
    }

    #[test]
    fn enabling_writes_every_site_semaphore_and_a_fire_names_its_site() {
        let mut p = Probes::new(
            vec![
                site("sched:switch", 0x200, 0x900, 2),
                site("timer:tick", 0x100, 0x902, 1),
                site("sched:switch", 0x300, 0x904, 2),
            ],
            Vec::new(),
        );
        assert_eq!(p.set("sched:*", true), ["sched:switch"]);
        assert_eq!(p.writes, [(0x900, 1), (0x904, 1)]);
        let call = Hypercall {
            command: vtrace_guest::cmd::PROBE,
            args: [7, 8, 9, 10],
            more_args: [11, 12],
            rip: 0x300,
        };
        assert_eq!(
            p.fire(&call),
            Some(Event::Probe {
                name: "sched:switch".into(),
                pc: 0x300,
                args: vec![7, 8],
            })
        );
        assert_eq!(p.fire(&Hypercall { rip: 0x301, ..call }), None);
        assert_eq!(
            p.troubles(),
            ProbeTroubles {
                unknown_sites: 1,
                unwatched_returns: 0,
                unwritable_semaphores: 0
            }
        );
        assert_eq!(p.status().as_deref(), Some("probes: sched:switch 1"));
        p.writes.clear();
        assert_eq!(p.set("sched:switch", false), ["sched:switch"]);
        assert_eq!(p.writes, [(0x900, 0), (0x904, 0)]);
        assert!(p.set("nothing:*", true).is_empty());
    }

    #[test]
    fn function_probes_are_watched_while_enabled() {
        let f = FunctionProbe {
            probe: "fn:schedule".into(),
            entry: 0x500,
            task: None,
            fetches: Vec::new(),
            at_return: false,
            tracepoint: false,
            untraced: true,
        };
        let mut p = Probes::new(Vec::new(), vec![f]);
        assert!(!p.function_at(0x500), "not before it is enabled");
        p.set("fn:*", true);
        assert!(p.function_at(0x500));
        assert_eq!(p.entries().collect::<Vec<_>>(), [0x500]);
        assert_eq!(p.functions_at(0x500), [(0, None)]);
        p.set("fn:schedule", false);
        assert!(!p.function_at(0x500));
        assert!(p.functions_at(0x500).is_empty());
    }
}
