//! The virtual clock every device reads time from.
//!
//! Devices never look at the host clock themselves: the run loop asks the
//! clock for "now" and passes it in. That is what lets the tracer make time
//! advance per executed step (deterministic traces) instead of per host
//! nanosecond, without touching any device.

use std::time::{Duration, Instant};

/// Nanoseconds of virtual time since the VM started.
pub type VirtualNanos = u64;

/// How virtual time relates to host time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockMode {
    /// Virtual time is host wall time since the VM started.
    Wall,
}

/// The VM's one source of time.
#[derive(Debug)]
pub struct VirtualClock {
    mode: ClockMode,
    epoch: Instant,
}

impl VirtualClock {
    /// A clock starting at zero now.
    pub fn new(mode: ClockMode) -> Self {
        VirtualClock {
            mode,
            epoch: Instant::now(),
        }
    }

    /// The clock's mode.
    pub fn mode(&self) -> ClockMode {
        self.mode
    }

    /// Current virtual time.
    pub fn now(&self) -> VirtualNanos {
        match self.mode {
            ClockMode::Wall => self.epoch.elapsed().as_nanos() as u64,
        }
    }

    /// Host time left until virtual time reaches `deadline` (zero if past).
    pub fn host_delay_until(&self, deadline: VirtualNanos) -> Duration {
        Duration::from_nanos(deadline.saturating_sub(self.now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_clock_moves_forward() {
        let clock = VirtualClock::new(ClockMode::Wall);
        let a = clock.now();
        std::thread::sleep(Duration::from_millis(2));
        let b = clock.now();
        assert!(b >= a + 2_000_000, "{a} -> {b}");
        assert_eq!(clock.host_delay_until(0), Duration::ZERO);
    }
}
