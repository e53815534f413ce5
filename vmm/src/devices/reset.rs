//! The ways a PC guest resets itself: the i8042 keyboard controller's
//! CPU-reset line (0xFE to port 0x64; vm-superio's model) and the PCI reset
//! control register at 0xCF9 (Linux's `reboot=pci`). vtrace treats a reset
//! as the end of the run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use vm_superio::{I8042Device, Trigger};

pub const PORT_DATA: u16 = 0x60;
pub const PORT_COMMAND: u16 = 0x64;
pub const PORT_RESET_CONTROL: u16 = 0xcf9;

#[derive(Clone, Debug, Default)]
struct ResetLine(Arc<AtomicBool>);

impl Trigger for ResetLine {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        self.0.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// The controller and whether the guest pulled reset.
pub struct ResetController {
    device: I8042Device<ResetLine>,
    line: ResetLine,
}

impl Default for ResetController {
    fn default() -> Self {
        let line = ResetLine::default();
        ResetController {
            device: I8042Device::new(line.clone()),
            line,
        }
    }
}

impl ResetController {
    pub fn read(&mut self, port: u16) -> u8 {
        match port {
            PORT_DATA | PORT_COMMAND => self.device.read((port - PORT_DATA) as u8),
            _ => 0,
        }
    }

    pub fn write(&mut self, port: u16, value: u8) {
        match port {
            PORT_DATA | PORT_COMMAND => {
                let Ok(()) = self.device.write((port - PORT_DATA) as u8, value);
            }
            // Bit 2 starts the reset; bit 1 picks hard over soft.
            PORT_RESET_CONTROL if value & 0x04 != 0 => self.line.0.store(true, Ordering::Relaxed),
            _ => {}
        }
    }

    /// Whether the guest asked for a reset.
    pub fn reset_requested(&self) -> bool {
        self.line.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_reset_paths() {
        let mut r = ResetController::default();
        r.write(PORT_COMMAND, 0xaa);
        assert!(!r.reset_requested());
        r.write(PORT_COMMAND, 0xfe);
        assert!(r.reset_requested());
        let mut r = ResetController::default();
        r.write(PORT_RESET_CONTROL, 0x02);
        assert!(!r.reset_requested());
        r.write(PORT_RESET_CONTROL, 0x06);
        assert!(r.reset_requested());
    }
}
