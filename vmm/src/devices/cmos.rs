//! The MC146818 CMOS RTC at ports 0x70/0x71: enough for Linux to read the
//! wall-clock time at boot. The time is the host's at VM start plus virtual
//! time, so the guest's clock advances at the guest's pace.

use crate::clock::VirtualNanos;

pub const PORT_INDEX: u16 = 0x70;
pub const PORT_DATA: u16 = 0x71;

const REG_A: usize = 0x0a;
const REG_B: usize = 0x0b;
const REG_C: usize = 0x0c;
const REG_D: usize = 0x0d;
const REG_CENTURY: usize = 0x32;

/// The RTC and its 128 bytes of NVRAM.
#[derive(Debug)]
pub struct Cmos {
    index: u8,
    nvram: [u8; 128],
    /// Seconds since the Unix epoch at virtual time zero.
    base_unix: i64,
}

fn bcd(v: u32) -> u8 {
    ((v / 10) << 4 | (v % 10)) as u8
}

/// (year, month, day) for days since 1970-01-01 (Howard Hinnant's algorithm;
/// a calendar crate for six lines would be a poor trade).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

impl Cmos {
    /// An RTC that reads `base_unix` seconds at virtual time zero.
    pub fn new(base_unix: i64) -> Self {
        let mut nvram = [0u8; 128];
        nvram[REG_A] = 0x26; // 32.768 kHz time base, 1.024 kHz rate; UIP clear
        nvram[REG_B] = 0x02; // 24-hour, BCD
        nvram[REG_D] = 0x80; // valid RAM and time
        Cmos {
            index: 0,
            nvram,
            base_unix,
        }
    }

    /// Port read.
    pub fn read(&mut self, port: u16, now: VirtualNanos) -> u8 {
        if port != PORT_DATA {
            return 0xff;
        }
        let secs = self.base_unix + (now / 1_000_000_000) as i64;
        let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
        let tod = secs.rem_euclid(86_400) as u32;
        let weekday = ((secs.div_euclid(86_400) + 4).rem_euclid(7) + 1) as u32;
        match usize::from(self.index) {
            0x00 => bcd(tod % 60),
            0x02 => bcd(tod / 60 % 60),
            0x04 => bcd(tod / 3600),
            0x06 => bcd(weekday),
            0x07 => bcd(day),
            0x08 => bcd(month),
            0x09 => bcd((year % 100) as u32),
            REG_CENTURY => bcd((year / 100) as u32),
            REG_C => std::mem::take(&mut self.nvram[REG_C]),
            i => self.nvram[i],
        }
    }

    /// Port write.
    pub fn write(&mut self, port: u16, value: u8) {
        match port {
            // Bit 7 of the index port gates NMIs; vtrace has none to gate.
            PORT_INDEX => self.index = value & 0x7f,
            PORT_DATA => match usize::from(self.index) {
                REG_C | REG_D => {}
                REG_A => self.nvram[REG_A] = value & 0x7f,
                i => self.nvram[i] = value,
            },
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(cmos: &mut Cmos, reg: u8, now: VirtualNanos) -> u8 {
        cmos.write(PORT_INDEX, reg);
        cmos.read(PORT_DATA, now)
    }

    #[test]
    fn reads_time_in_bcd() {
        // 2026-11-21 22:50:04 UTC
        let mut cmos = Cmos::new(1_795_301_404);
        assert_eq!(read(&mut cmos, 0x09, 0), 0x26);
        assert_eq!(read(&mut cmos, 0x32, 0), 0x20);
        assert_eq!(read(&mut cmos, 0x08, 0), 0x11);
        assert_eq!(read(&mut cmos, 0x07, 0), 0x21);
        assert_eq!(read(&mut cmos, 0x04, 0), 0x22);
        assert_eq!(read(&mut cmos, 0x02, 0), 0x50);
        assert_eq!(read(&mut cmos, 0x00, 0), 0x04);
        assert_eq!(read(&mut cmos, 0x00, 3_000_000_000), 0x07);
        assert_eq!(read(&mut cmos, 0x0d, 0), 0x80);
    }

    #[test]
    fn nvram_keeps_writes() {
        let mut cmos = Cmos::new(0);
        cmos.write(PORT_INDEX, 0x40);
        cmos.write(PORT_DATA, 0x5a);
        assert_eq!(read(&mut cmos, 0x40, 0), 0x5a);
    }
}
