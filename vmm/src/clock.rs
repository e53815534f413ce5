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
    /// Virtual time is host wall time divided by this factor (at least 1):
    /// a guest running N times slower than hardware sees its timer N times
    /// slower too, instead of drowning in timer interrupts.
    Prescaled(u32),
}

impl ClockMode {
    /// Parses `wall` or `prescale:N`.
    pub fn parse(text: &str) -> Result<ClockMode, String> {
        match text.split_once(':') {
            None if text == "wall" => Ok(ClockMode::Wall),
            Some(("prescale", n)) => match n.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(ClockMode::Prescaled(n)),
                _ => Err(format!(
                    "'{n}': the prescale factor is a whole number from 1 up"
                )),
            },
            _ => Err(format!("'{text}': the clock is 'wall' or 'prescale:N'")),
        }
    }

    fn divisor(self) -> u64 {
        match self {
            ClockMode::Wall => 1,
            ClockMode::Prescaled(n) => u64::from(n),
        }
    }
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
        self.epoch.elapsed().as_nanos() as u64 / self.mode.divisor()
    }

    /// Host time left until virtual time reaches `deadline` (zero if past).
    pub fn host_delay_until(&self, deadline: VirtualNanos) -> Duration {
        Duration::from_nanos(
            deadline
                .saturating_sub(self.now())
                .saturating_mul(self.mode.divisor()),
        )
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

    #[test]
    fn prescaled_clock_runs_slower() {
        let clock = VirtualClock::new(ClockMode::Prescaled(1000));
        std::thread::sleep(Duration::from_millis(20));
        let now = clock.now();
        assert!(
            (20_000..200_000).contains(&now),
            "20 ms of host time is ~20 us: {now}"
        );
        let delay = clock.host_delay_until(now + 1_000);
        assert!(
            delay <= Duration::from_millis(1) && delay >= Duration::from_micros(900),
            "{delay:?}"
        );
    }

    #[test]
    fn parses_clock_modes() {
        assert_eq!(ClockMode::parse("wall"), Ok(ClockMode::Wall));
        assert_eq!(
            ClockMode::parse("prescale:6300"),
            Ok(ClockMode::Prescaled(6300))
        );
        assert!(ClockMode::parse("prescale:0").is_err());
        assert!(ClockMode::parse("steps").is_err());
    }
}
