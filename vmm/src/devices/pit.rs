//! The 8254 programmable interval timer: channel 0 drives IRQ0; channel 2
//! with its gate and output on port 0x61 is there because Linux calibrates
//! its TSC against it. Counts are computed from virtual time on demand, so
//! the PIT costs nothing between the guest's accesses.

use crate::clock::VirtualNanos;

/// Input clock of every channel, in Hz.
pub const PIT_HZ: u64 = 1_193_182;

/// Ports: channel data 0x40..0x42, mode/command 0x43, and the PC speaker /
/// NMI status port 0x61 that carries channel 2's gate and output.
pub const PORT_COMMAND: u16 = 0x43;
pub const PORT_SPEAKER: u16 = 0x61;

fn ticks_in(ns: VirtualNanos) -> u64 {
    (ns as u128 * PIT_HZ as u128 / 1_000_000_000) as u64
}

fn nanos_for(ticks: u64) -> VirtualNanos {
    (ticks as u128 * 1_000_000_000).div_ceil(PIT_HZ as u128) as u64
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Access {
    #[default]
    LowHigh,
    Low,
    High,
}

#[derive(Clone, Debug, Default)]
struct Channel {
    mode: u8,
    access: Access,
    /// Reload value in PIT ticks (a programmed 0 means 65536).
    reload: u64,
    /// When the current count was loaded; None until a count is written.
    loaded_at: Option<VirtualNanos>,
    /// First byte of a low/high count write, waiting for the high byte.
    pending_low: Option<u8>,
    /// Next read of a low/high value returns the high byte.
    read_high_next: bool,
    latched_count: Option<u16>,
    latched_status: Option<u8>,
    /// Periods (or the one shot) already signalled as IRQ edges.
    fired: u64,
    gate: bool,
}

impl Channel {
    fn periodic(&self) -> bool {
        matches!(self.mode, 2 | 3)
    }

    fn elapsed(&self, now: VirtualNanos) -> Option<u64> {
        self.loaded_at.map(|t| ticks_in(now.saturating_sub(t)))
    }

    fn count(&self, now: VirtualNanos) -> u16 {
        let Some(elapsed) = self.elapsed(now) else {
            return 0;
        };
        if self.periodic() {
            (self.reload - elapsed % self.reload) as u16
        } else {
            (self.reload.wrapping_sub(elapsed) & 0xffff) as u16
        }
    }

    fn output(&self, now: VirtualNanos) -> bool {
        let Some(elapsed) = self.elapsed(now) else {
            return self.mode != 0;
        };
        match self.mode {
            0 | 1 => elapsed >= self.reload,
            3 => elapsed % self.reload < self.reload.div_ceil(2),
            4 | 5 => elapsed != self.reload,
            _ => elapsed % self.reload != self.reload - 1,
        }
    }

    fn status(&self, now: VirtualNanos) -> u8 {
        let access = match self.access {
            Access::Low => 1,
            Access::High => 2,
            Access::LowHigh => 3,
        };
        (u8::from(self.output(now)) << 7)
            | (u8::from(self.loaded_at.is_none()) << 6)
            | (access << 4)
            | (self.mode << 1)
    }

    fn set_mode(&mut self, control: u8) {
        self.access = match (control >> 4) & 3 {
            1 => Access::Low,
            2 => Access::High,
            _ => Access::LowHigh,
        };
        self.mode = match (control >> 1) & 7 {
            6 => 2,
            7 => 3,
            m => m,
        };
        self.loaded_at = None;
        self.pending_low = None;
        self.read_high_next = false;
        self.latched_count = None;
    }

    fn load(&mut self, count: u16, now: VirtualNanos) {
        self.reload = if count == 0 {
            0x10000
        } else {
            u64::from(count)
        };
        self.loaded_at = Some(now);
        self.fired = 0;
    }

    fn write(&mut self, value: u8, now: VirtualNanos) {
        match self.access {
            Access::Low => self.load(u16::from(value), now),
            Access::High => self.load(u16::from(value) << 8, now),
            Access::LowHigh => match self.pending_low.take() {
                None => self.pending_low = Some(value),
                Some(low) => self.load(u16::from(low) | u16::from(value) << 8, now),
            },
        }
    }

    fn read(&mut self, now: VirtualNanos) -> u8 {
        if let Some(status) = self.latched_status.take() {
            return status;
        }
        let value = match self.latched_count {
            Some(v) => v,
            None => self.count(now),
        };
        let (byte, done) = match self.access {
            Access::Low => (value as u8, true),
            Access::High => ((value >> 8) as u8, true),
            Access::LowHigh if self.read_high_next => ((value >> 8) as u8, true),
            Access::LowHigh => (value as u8, false),
        };
        self.read_high_next = !done;
        if done {
            self.latched_count = None;
        }
        byte
    }

    fn latch(&mut self, now: VirtualNanos) {
        if self.latched_count.is_none() {
            self.latched_count = Some(self.count(now));
        }
    }

    /// Whether a new IRQ edge is due at `now`; records it as signalled.
    fn take_edge(&mut self, now: VirtualNanos) -> bool {
        let Some(elapsed) = self.elapsed(now) else {
            return false;
        };
        let due = if self.periodic() {
            elapsed / self.reload
        } else {
            u64::from(elapsed >= self.reload)
        };
        if due > self.fired {
            self.fired = due;
            true
        } else {
            false
        }
    }

    fn next_edge(&self) -> Option<VirtualNanos> {
        let loaded = self.loaded_at?;
        if self.periodic() {
            Some(loaded + nanos_for((self.fired + 1) * self.reload))
        } else if self.fired == 0 {
            Some(loaded + nanos_for(self.reload))
        } else {
            None
        }
    }
}

/// The three-channel timer.
#[derive(Debug)]
pub struct Pit {
    channels: [Channel; 3],
    speaker_data: bool,
}

impl Default for Pit {
    fn default() -> Self {
        Self::new()
    }
}

impl Pit {
    /// A PIT with no counts loaded: channel 0 is silent until programmed.
    pub fn new() -> Self {
        let mut pit = Pit {
            channels: Default::default(),
            speaker_data: false,
        };
        pit.channels[0].gate = true;
        pit.channels[1].gate = true;
        pit
    }

    /// Port read (0x40..=0x43, 0x61).
    pub fn read(&mut self, port: u16, now: VirtualNanos) -> u8 {
        match port {
            0x40..=0x42 => self.channels[usize::from(port - 0x40)].read(now),
            PORT_SPEAKER => {
                // Bit 4 toggles with the DRAM refresh clock (~15 us); some
                // code busy-waits on it.
                let refresh = (now / 15_085) & 1 == 1;
                u8::from(self.channels[2].gate)
                    | u8::from(self.speaker_data) << 1
                    | u8::from(refresh) << 4
                    | u8::from(self.channels[2].output(now)) << 5
            }
            _ => 0xff,
        }
    }

    /// Port write (0x40..=0x43, 0x61).
    pub fn write(&mut self, port: u16, value: u8, now: VirtualNanos) {
        match port {
            0x40..=0x42 => self.channels[usize::from(port - 0x40)].write(value, now),
            PORT_COMMAND => self.command(value, now),
            PORT_SPEAKER => {
                let gate = value & 1 != 0;
                let ch2 = &mut self.channels[2];
                if gate && !ch2.gate && matches!(ch2.mode, 1 | 5) {
                    ch2.loaded_at = Some(now);
                }
                ch2.gate = gate;
                self.speaker_data = value & 2 != 0;
            }
            _ => {}
        }
    }

    fn command(&mut self, value: u8, now: VirtualNanos) {
        let channel = usize::from(value >> 6);
        if channel == 3 {
            // Read-back: bit 5 clear latches counts, bit 4 clear latches status.
            for (i, ch) in self.channels.iter_mut().enumerate() {
                if value & (2 << i) != 0 {
                    if value & 0x10 == 0 {
                        ch.latched_status = Some(ch.status(now));
                    }
                    if value & 0x20 == 0 {
                        ch.latch(now);
                    }
                }
            }
        } else if (value >> 4) & 3 == 0 {
            self.channels[channel].latch(now);
        } else {
            self.channels[channel].set_mode(value);
        }
    }

    /// Whether channel 0 produced a new IRQ0 edge by `now`. Edges missed
    /// while nobody polled coalesce into one, as they would on an edge-
    /// triggered PIC input.
    pub fn poll_irq0(&mut self, now: VirtualNanos) -> bool {
        self.channels[0].take_edge(now)
    }

    /// Virtual time of channel 0's next IRQ edge, if one is programmed.
    pub fn next_irq0(&self) -> Option<VirtualNanos> {
        self.channels[0].next_edge()
    }

    /// Channel 0's period in nanoseconds when it runs periodically.
    #[cfg(test)]
    pub fn irq0_period(&self) -> Option<VirtualNanos> {
        let ch = &self.channels[0];
        (ch.loaded_at.is_some() && ch.periodic()).then(|| nanos_for(ch.reload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn periodic(divisor: u16) -> Pit {
        let mut pit = Pit::new();
        pit.write(0x43, 0x34, 0);
        pit.write(0x40, divisor as u8, 0);
        pit.write(0x40, (divisor >> 8) as u8, 0);
        pit
    }

    #[test]
    fn periodic_mode_fires_once_per_period() {
        let mut pit = periodic(4773); // ~4 ms
        let period = pit.irq0_period().unwrap();
        assert!((3_999_000..4_001_000).contains(&period), "{period}");
        assert!(!pit.poll_irq0(period - 1));
        assert!(pit.poll_irq0(period));
        assert!(!pit.poll_irq0(period + 1));
        assert_eq!(pit.next_irq0(), Some(nanos_for(2 * 4773)));
        // Missed periods coalesce into one edge.
        assert!(pit.poll_irq0(10 * period));
        assert!(!pit.poll_irq0(10 * period));
    }

    #[test]
    fn unprogrammed_channel_is_silent() {
        let mut pit = Pit::new();
        assert!(!pit.poll_irq0(1_000 * MS));
        assert_eq!(pit.next_irq0(), None);
    }

    #[test]
    fn latched_count_reads_low_then_high() {
        let mut pit = periodic(10000);
        pit.write(0x43, 0x00, 0);
        // 1 ms later the counter moved, but the latch holds the old value.
        assert_eq!(pit.read(0x40, MS), (10000u16 & 0xff) as u8);
        assert_eq!(pit.read(0x40, MS), (10000u16 >> 8) as u8);
        // Unlatched, the live count is reload minus elapsed ticks.
        let live = u16::from(pit.read(0x40, MS)) | u16::from(pit.read(0x40, MS)) << 8;
        assert_eq!(u64::from(live), 10000 - ticks_in(MS));
    }

    #[test]
    fn channel2_one_shot_output_on_port_61() {
        let mut pit = Pit::new();
        pit.write(0x61, 0x01, 0); // gate high, speaker off
        pit.write(0x43, 0xb0, 0); // ch2, lo/hi, mode 0
        pit.write(0x42, 0x9b, 0); // 11931 ticks = 10 ms
        pit.write(0x42, 0x2e, 0);
        assert_eq!(pit.read(0x61, 9 * MS) & 0x20, 0);
        assert_eq!(pit.read(0x61, 11 * MS) & 0x20, 0x20);
    }

    #[test]
    fn one_shot_on_channel0_fires_once() {
        let mut pit = Pit::new();
        pit.write(0x43, 0x30, 0);
        pit.write(0x40, 0xff, 0);
        pit.write(0x40, 0x0f, 0);
        let at = pit.next_irq0().unwrap();
        assert!(pit.poll_irq0(at));
        assert!(!pit.poll_irq0(at * 100));
        assert_eq!(pit.next_irq0(), None);
    }

    #[test]
    fn read_back_status() {
        let mut pit = periodic(100);
        pit.write(0x43, 0xe2, 5); // read-back: status of channel 0
        let status = pit.read(0x40, 5);
        assert_eq!(status & 0x3f, 0x34);
    }
}
