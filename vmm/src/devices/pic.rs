//! The 8259A programmable interrupt controller pair (master at 0x20, slave
//! at 0xA0, cascaded on IRQ2), edge-triggered as PCs wire the ISA IRQs.
//!
//! The PIC lives in user space on purpose: the VMM, not KVM, decides when an
//! interrupt reaches the vCPU, so a tracer knows the vector and the step.

/// One 8259A.
#[derive(Clone, Debug, Default)]
struct Chip {
    irr: u8,
    isr: u8,
    imr: u8,
    vector_base: u8,
    auto_eoi: bool,
    /// ICW step expected next (0: initialised; 2..4 during init).
    init_step: u8,
    needs_icw4: bool,
    read_isr: bool,
    elcr: u8,
}

impl Chip {
    /// Highest-priority IRQ with a request not masked and not blocked by a
    /// same-or-higher-priority one in service.
    fn pending(&self) -> Option<u8> {
        let requests = self.irr & !self.imr;
        (0..8u8)
            .find(|&irq| self.isr & (1 << irq) != 0 || requests & (1 << irq) != 0)
            .filter(|&irq| requests & (1 << irq) != 0)
    }

    fn write_command(&mut self, value: u8) {
        if value & 0x10 != 0 {
            // ICW1: start initialisation.
            self.init_step = 2;
            self.needs_icw4 = value & 0x01 != 0;
            self.imr = 0;
            self.isr = 0;
            self.irr = 0;
            self.auto_eoi = false;
            self.read_isr = false;
        } else if value & 0x08 != 0 {
            // OCW3.
            if value & 0x02 != 0 {
                self.read_isr = value & 0x01 != 0;
            }
        } else {
            // OCW2: end of interrupt.
            match value & 0xe0 {
                0x20 | 0xa0 => {
                    // Non-specific: clear the highest-priority bit in service.
                    if let Some(irq) = (0..8).find(|i| self.isr & (1 << i) != 0) {
                        self.isr &= !(1 << irq);
                    }
                }
                0x60 | 0xe0 => self.isr &= !(1 << (value & 7)),
                _ => {}
            }
        }
    }

    fn write_data(&mut self, value: u8) {
        match self.init_step {
            2 => {
                self.vector_base = value & 0xf8;
                self.init_step = 3;
            }
            3 => self.init_step = if self.needs_icw4 { 4 } else { 0 },
            4 => {
                self.auto_eoi = value & 0x02 != 0;
                self.init_step = 0;
            }
            _ => self.imr = value,
        }
    }

    fn read_command(&self) -> u8 {
        if self.read_isr {
            self.isr
        } else {
            self.irr
        }
    }

    fn acknowledge(&mut self, irq: u8) {
        self.irr &= !(1 << irq);
        if !self.auto_eoi {
            self.isr |= 1 << irq;
        }
    }
}

/// The cascaded master/slave pair.
#[derive(Clone, Debug, Default)]
pub struct Pic {
    master: Chip,
    slave: Chip,
}

const CASCADE_IRQ: u8 = 2;

impl Pic {
    /// A pair in its power-on state (nothing programmed).
    pub fn new() -> Self {
        Pic::default()
    }

    /// An edge on ISA IRQ line `irq` (0..16).
    pub fn raise(&mut self, irq: u8) {
        match irq {
            0..=7 => self.master.irr |= 1 << irq,
            8..=15 => self.slave.irr |= 1 << (irq - 8),
            _ => {}
        }
    }

    /// The vector the pair would deliver now, if any, without taking it.
    pub fn pending_vector(&self) -> Option<u8> {
        let mut master = self.master.clone();
        master.irr = self.master_irr_with_cascade();
        match master.pending()? {
            CASCADE_IRQ => self.slave.pending().map(|i| self.slave.vector_base + i),
            irq => Some(self.master.vector_base + irq),
        }
    }

    /// Takes the pending interrupt as the CPU's INTA cycle would: returns
    /// its vector and the ISA IRQ it came from.
    pub fn acknowledge(&mut self) -> Option<(u8, u8)> {
        self.master.irr = self.master_irr_with_cascade();
        match self.master.pending()? {
            CASCADE_IRQ => {
                self.master.acknowledge(CASCADE_IRQ);
                let irq = self.slave.pending()?;
                self.slave.acknowledge(irq);
                Some((self.slave.vector_base + irq, irq + 8))
            }
            irq => {
                self.master.acknowledge(irq);
                Some((self.master.vector_base + irq, irq))
            }
        }
    }

    /// The master's IRR with the cascade input showing whether the slave
    /// has something to deliver (the slave's INT output is a level).
    fn master_irr_with_cascade(&self) -> u8 {
        if self.slave.pending().is_some() {
            self.master.irr | 1 << CASCADE_IRQ
        } else {
            self.master.irr & !(1 << CASCADE_IRQ)
        }
    }

    /// Port read.
    pub fn read(&mut self, port: u16) -> u8 {
        match port {
            0x20 => self.master.read_command(),
            0x21 => self.master.imr,
            0xa0 => self.slave.read_command(),
            0xa1 => self.slave.imr,
            0x4d0 => self.master.elcr,
            0x4d1 => self.slave.elcr,
            _ => 0xff,
        }
    }

    /// Port write.
    pub fn write(&mut self, port: u16, value: u8) {
        match port {
            0x20 => self.master.write_command(value),
            0x21 => self.master.write_data(value),
            0xa0 => self.slave.write_command(value),
            0xa1 => self.slave.write_data(value),
            0x4d0 => self.master.elcr = value,
            0x4d1 => self.slave.elcr = value,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn programmed() -> Pic {
        let mut pic = Pic::new();
        for (port, v) in [
            (0x20, 0x11),
            (0xa0, 0x11),
            (0x21, 0x20),
            (0xa1, 0x28),
            (0x21, 0x04),
            (0xa1, 0x02),
            (0x21, 0x01),
            (0xa1, 0x01),
            (0x21, 0x00),
            (0xa1, 0x00),
        ] {
            pic.write(port, v);
        }
        pic
    }

    #[test]
    fn delivers_remapped_vectors_by_priority() {
        let mut pic = programmed();
        pic.raise(4);
        pic.raise(0);
        assert_eq!(pic.acknowledge(), Some((0x20, 0)));
        // IRQ4 waits until IRQ0 is acknowledged with an EOI.
        assert_eq!(pic.pending_vector(), None);
        pic.write(0x20, 0x20);
        assert_eq!(pic.acknowledge(), Some((0x24, 4)));
    }

    #[test]
    fn masked_irqs_wait() {
        let mut pic = programmed();
        pic.write(0x21, 0x01);
        pic.raise(0);
        assert_eq!(pic.pending_vector(), None);
        pic.write(0x21, 0x00);
        assert_eq!(pic.pending_vector(), Some(0x20));
    }

    #[test]
    fn slave_irqs_cascade() {
        let mut pic = programmed();
        pic.raise(12);
        assert_eq!(pic.acknowledge(), Some((0x2c, 12)));
        pic.write(0xa0, 0x20);
        pic.write(0x20, 0x20);
        assert_eq!(pic.pending_vector(), None);
    }

    #[test]
    fn reads_isr_after_ocw3() {
        let mut pic = programmed();
        pic.raise(3);
        pic.acknowledge();
        pic.write(0x20, 0x0b);
        assert_eq!(pic.read(0x20), 0x08);
        pic.write(0x20, 0x0a);
        assert_eq!(pic.read(0x20), 0x00);
    }
}
