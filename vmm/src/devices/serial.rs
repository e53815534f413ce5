//! COM1: a 16550A UART from vm-superio, wired to the host console. Its
//! interrupt becomes an edge on ISA IRQ4 of the user-space PIC.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};

/// First port of COM1; the UART has eight registers.
pub const COM1_BASE: u16 = 0x3f8;
/// ISA IRQ of COM1.
pub const COM1_IRQ: u8 = 4;

/// Interrupt output of the UART, sampled by the run loop.
#[derive(Clone, Debug, Default)]
pub struct IrqFlag(Arc<AtomicBool>);

impl Trigger for IrqFlag {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        self.0.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// The guest's serial console.
pub struct SerialPort {
    uart: Serial<IrqFlag, NoEvents, Box<dyn Write + Send>>,
    irq: IrqFlag,
    /// Host input that did not fit into the UART's FIFO yet.
    backlog: VecDeque<u8>,
}

impl SerialPort {
    /// A UART whose transmitted bytes go to `out`.
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        let irq = IrqFlag::default();
        SerialPort {
            uart: Serial::new(irq.clone(), out),
            irq,
            backlog: VecDeque::new(),
        }
    }

    /// Register read at `offset` (0..8).
    pub fn read(&mut self, offset: u8) -> u8 {
        let value = self.uart.read(offset);
        self.refill();
        value
    }

    /// Register write at `offset` (0..8).
    pub fn write(&mut self, offset: u8, value: u8) {
        // A closed host stdout must not stop the guest; its output is lost
        // the way a disconnected serial line loses it.
        if let Err(e) = self.uart.write(offset, value) {
            tracing::debug!("serial output dropped: {e:?}");
        }
    }

    /// Bytes typed on the host for the guest.
    pub fn queue_input(&mut self, bytes: &[u8]) {
        self.backlog.extend(bytes);
        self.refill();
    }

    fn refill(&mut self) {
        while !self.backlog.is_empty() && self.uart.fifo_capacity() > 0 {
            let (front, _) = self.backlog.as_slices();
            let n = self.uart.enqueue_raw_bytes(front).unwrap_or(0);
            if n == 0 {
                break;
            }
            self.backlog.drain(..n);
        }
    }

    /// Whether the UART raised its interrupt since the last call.
    pub fn take_irq(&mut self) -> bool {
        self.irq.0.swap(false, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn transmits_and_receives() {
        let sink = Sink::default();
        let mut port = SerialPort::new(Box::new(sink.clone()));
        port.write(0, b'h');
        port.write(0, b'i');
        assert_eq!(&*sink.0.lock().unwrap(), b"hi");

        port.write(1, 0x01); // enable the receive interrupt
        port.queue_input(&[b'x'; 100]);
        assert!(port.take_irq());
        let mut got = 0;
        while port.read(5) & 1 == 1 {
            assert_eq!(port.read(0), b'x');
            got += 1;
        }
        assert_eq!(got, 100, "backlog beyond the FIFO is delivered too");
    }
}
