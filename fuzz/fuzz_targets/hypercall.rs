//! Hypercalls as a guest issues them: any command, any arguments, over
//! guest memory the input also gives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vtrace_vmm::fuzzing::{BadAddress, GuestVirtualMemory, HypercallOutcome, HypercallPort};
use vtrace_vmm::Hypercall;

/// Guest memory: the input's bytes, mapped from address 0x1000.
struct Memory<'a>(&'a [u8]);

impl GuestVirtualMemory for Memory<'_> {
    fn read_virtual(&self, gva: u64, buf: &mut [u8]) -> Result<(), BadAddress> {
        let start = gva
            .checked_sub(0x1000)
            .and_then(|o| usize::try_from(o).ok())
            .ok_or(BadAddress(gva))?;
        let end = start.checked_add(buf.len()).ok_or(BadAddress(gva))?;
        buf.copy_from_slice(self.0.get(start..end).ok_or(BadAddress(gva))?);
        Ok(())
    }
}

fn word(data: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    if let Some(s) = data.get(at..at + 8) {
        b.copy_from_slice(s);
    }
    u64::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    let mut port = HypercallPort::new();
    // Several calls an input: 40 bytes each (command and four arguments).
    for chunk in data.chunks(40).take(64) {
        let call = Hypercall {
            command: word(chunk, 0) as u32,
            args: [
                word(chunk, 8),
                word(chunk, 16),
                word(chunk, 24),
                word(chunk, 32),
            ],
            ..Hypercall::default()
        };
        // As the run loop does without a monitor.
        if port.handle(call, &Memory(data), &mut |_| {}) == HypercallOutcome::ForMonitor {
            let _ = port.unanswered(call, None, &mut |_| {});
        }
    }
});
