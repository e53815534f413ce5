//! ACPI's fixed power-management registers, as much of them as a guest
//! needs to power the machine off: the PM1a event block (status, never set;
//! enable, kept as written, because ACPICA reads it back) and the PM1a
//! control register. Linux's `poweroff` writes
//! SLP_TYP (the value the DSDT's `\_S5_` names) with SLP_EN to the control
//! register; vtrace treats that as the end of the run. The tables that
//! point the guest here are the boot loader's (`boot/acpi.rs`).

/// PM1a event block: PM1 status (2 bytes), then PM1 enable (2 bytes).
pub const PM1A_EVT_BLK: u16 = 0x600;
/// Length of the PM1a event block in bytes.
pub const PM1_EVT_LEN: u8 = 4;
/// PM1a control register (2 bytes).
pub const PM1A_CNT_BLK: u16 = 0x604;
/// Length of the PM1a control register in bytes.
pub const PM1_CNT_LEN: u8 = 2;
/// The sleep type the DSDT gives for S5 (soft off).
pub const SLP_TYP_S5: u16 = 5;

/// SCI_EN: the machine is in ACPI mode (always, here: the FADT names no SMI
/// command port to switch modes with).
const SCI_EN: u16 = 1 << 0;
const SLP_TYP_SHIFT: u16 = 10;
const SLP_TYP_MASK: u16 = 0b111 << SLP_TYP_SHIFT;
const SLP_EN: u16 = 1 << 13;

/// The registers and whether the guest asked to be powered off.
#[derive(Debug, Default)]
pub struct AcpiPm {
    /// PM1 control as last written, without SLP_EN (it reads as zero).
    control: u16,
    /// PM1 enable as last written; no event it enables ever happens.
    enable: u16,
    /// The guest wrote SLP_EN with S5's sleep type.
    power_off: bool,
}

impl AcpiPm {
    /// The block as little-endian bytes from PM1a_EVT_BLK: status (never
    /// set), enable, control.
    fn bytes(&self) -> [u8; 6] {
        let [e0, e1] = self.enable.to_le_bytes();
        let [c0, c1] = (self.control | SCI_EN).to_le_bytes();
        [0, 0, e0, e1, c0, c1]
    }

    /// A guest `IN` at `port` of `data.len()` bytes.
    pub fn read(&self, port: u16, data: &mut [u8]) {
        let regs = self.bytes();
        let from = usize::from(port.wrapping_sub(PM1A_EVT_BLK));
        for (i, b) in data.iter_mut().enumerate() {
            *b = regs.get(from + i).copied().unwrap_or(0xff);
        }
    }

    /// A guest `OUT` at `port` of `data.len()` bytes.
    pub fn write(&mut self, port: u16, data: &[u8]) {
        let mut regs = self.bytes();
        let from = usize::from(port.wrapping_sub(PM1A_EVT_BLK));
        for (i, b) in data.iter().enumerate() {
            if let Some(r) = regs.get_mut(from + i) {
                *r = *b;
            }
        }
        // Status bits are write-one-to-clear, and none is ever set.
        self.enable = u16::from_le_bytes([regs[2], regs[3]]);
        let control = u16::from_le_bytes([regs[4], regs[5]]);
        self.control = control & !SLP_EN;
        let wrote_control = from + data.len() > 4;
        if wrote_control
            && control & SLP_EN != 0
            && (control & SLP_TYP_MASK) >> SLP_TYP_SHIFT == SLP_TYP_S5
        {
            self.power_off = true;
        }
    }

    /// Whether the guest entered S5 (soft off).
    pub fn power_off_requested(&self) -> bool {
        self.power_off
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_poweroff_sequence_requests_power_off() {
        // ACPICA's legacy sleep: read PM1 control, write SLP_TYP alone,
        // then SLP_TYP with SLP_EN.
        let mut pm = AcpiPm::default();
        let mut b = [0u8; 2];
        pm.read(PM1A_CNT_BLK, &mut b);
        let cnt = u16::from_le_bytes(b);
        assert_eq!(cnt & SCI_EN, SCI_EN, "always in ACPI mode");
        let typ = (cnt & !SLP_TYP_MASK) | SLP_TYP_S5 << SLP_TYP_SHIFT;
        pm.write(PM1A_CNT_BLK, &typ.to_le_bytes());
        assert!(!pm.power_off_requested(), "SLP_TYP alone is no request");
        pm.write(PM1A_CNT_BLK, &(typ | SLP_EN).to_le_bytes());
        assert!(pm.power_off_requested());
    }

    #[test]
    fn other_sleep_states_and_status_writes_do_not_power_off() {
        let mut pm = AcpiPm::default();
        pm.write(PM1A_EVT_BLK, &[0xff, 0xff]);
        pm.write(PM1A_CNT_BLK, &(3 << SLP_TYP_SHIFT | SLP_EN).to_le_bytes());
        assert!(!pm.power_off_requested(), "S3 is not S5");
        let mut b = [0xffu8; 4];
        pm.read(PM1A_EVT_BLK, &mut b);
        assert_eq!(b, [0; 4], "status write-one-to-clear, enable untouched");
    }

    #[test]
    fn enable_bits_read_back_as_written() {
        // ACPICA checks that an event it enabled stays enabled.
        let mut pm = AcpiPm::default();
        pm.write(PM1A_EVT_BLK + 2, &[0x20, 0x04]);
        let mut b = [0u8; 2];
        pm.read(PM1A_EVT_BLK + 2, &mut b);
        assert_eq!(b, [0x20, 0x04]);
        let mut one = [0u8; 1];
        pm.read(PM1A_EVT_BLK + 3, &mut one);
        assert_eq!(one, [0x04]);
    }

    #[test]
    fn byte_writes_to_the_high_half_count() {
        let mut pm = AcpiPm::default();
        pm.write(
            PM1A_CNT_BLK + 1,
            &[((SLP_TYP_S5 << SLP_TYP_SHIFT | SLP_EN) >> 8) as u8],
        );
        assert!(pm.power_off_requested());
    }
}
