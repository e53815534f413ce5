//! Notices a guest kernel's panic on its console. A Linux kernel that
//! panics with the default `panic=1` reboots a second later, which on its
//! own reads as a reboot the guest meant; its console says otherwise
//! ("Kernel panic - not syncing: ..."), and the run ends with that line.

use std::io::Write;
use std::sync::{Arc, Mutex};

/// What Linux's `panic()` prints first.
const PANIC: &str = "Kernel panic - not syncing";

/// Longest console line kept while looking for [`PANIC`]; the rest of a
/// longer line is not needed (guests may print lines of any length).
const LINE_MAX: usize = 512;

/// The first panic line seen, shared between the console and the session.
pub(crate) type PanicLine = Arc<Mutex<Option<String>>>;

/// A console writer that passes everything on and keeps the first line
/// holding [`PANIC`].
pub(crate) struct PanicWatch {
    out: Box<dyn Write + Send>,
    line: Vec<u8>,
    seen: PanicLine,
}

impl PanicWatch {
    /// Watches what goes to `out`; the panic line, if any, lands in `seen`.
    pub(crate) fn new(out: Box<dyn Write + Send>, seen: PanicLine) -> PanicWatch {
        PanicWatch {
            out,
            line: Vec::new(),
            seen,
        }
    }

    fn look(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                self.end_line();
            } else if self.line.len() < LINE_MAX {
                self.line.push(b);
            }
        }
    }

    fn end_line(&mut self) {
        let text = String::from_utf8_lossy(&self.line);
        if let Some(at) = text.find(PANIC) {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            if seen.is_none() {
                // From the phrase on (past the printk timestamp), without
                // the control characters a guest could put there.
                let panic: String = text[at..]
                    .trim_end()
                    .chars()
                    .map(|c| if c.is_control() { '?' } else { c })
                    .collect();
                *seen = Some(panic);
            }
        }
        self.line.clear();
    }
}

impl Write for PanicWatch {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.look(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched(text: &[u8]) -> Option<String> {
        let seen = PanicLine::default();
        let mut w = PanicWatch::new(Box::new(std::io::sink()), seen.clone());
        // Byte by byte, as a UART writes it.
        for b in text {
            w.write_all(std::slice::from_ref(b)).unwrap();
        }
        let line = seen.lock().unwrap().clone();
        line
    }

    #[test]
    fn the_first_panic_line_is_kept_without_its_timestamp() {
        let console = b"[    0.5] Run /init as init process\r\n\
            [    0.9] Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000300\r\n\
            [    1.0] Kernel panic - not syncing: again\r\n";
        assert_eq!(
            watched(console).as_deref(),
            Some("Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000300")
        );
    }

    #[test]
    fn ordinary_output_and_unfinished_lines_are_not_a_panic() {
        assert_eq!(watched(b"booting\nKernel panic - not syncing"), None);
        assert_eq!(watched(b"kernel panic is not this\n"), None);
        // A line longer than what is kept does not panic either way.
        let mut long = vec![b'x'; 10_000];
        long.extend(b" Kernel panic - not syncing: late\n");
        assert_eq!(watched(&long), None);
    }

    #[test]
    fn a_guest_cannot_put_escapes_in_the_line() {
        assert_eq!(
            watched(b"Kernel panic - not syncing: \x1b[2J\n").as_deref(),
            Some("Kernel panic - not syncing: ?[2J")
        );
    }
}
