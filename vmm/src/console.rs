//! The host console: the guest's serial port on the terminal, in raw mode
//! when stdin is a TTY, with a QEMU-like `Ctrl-A` escape for hotkeys.
//!
//! The terminal is restored on every way out: normal return, error, panic
//! (panic hook), SIGQUIT (restore, then die of it) and the stop signals
//! (see `signals`: they end the run normally, or restore and die when
//! repeated).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};

use crate::error::{Error, Result};

/// The escape prefix, Ctrl-A, as in QEMU.
pub const ESCAPE: u8 = 0x01;

/// What a byte typed on the host turned into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsoleInput {
    /// Bytes for the guest's serial port.
    Guest(Vec<u8>),
    /// `Ctrl-A <key>`: a hotkey.
    Hotkey(u8),
    /// Standard input reached its end.
    Closed,
}

/// Splits typed bytes into guest input and hotkeys.
#[derive(Clone, Debug, Default)]
pub struct EscapeParser {
    armed: bool,
}

impl EscapeParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds typed bytes; returns what they mean, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<ConsoleInput> {
        let mut out = Vec::new();
        let mut guest = Vec::new();
        for &b in bytes {
            if self.armed {
                self.armed = false;
                if b == ESCAPE {
                    guest.push(ESCAPE);
                } else {
                    if !guest.is_empty() {
                        out.push(ConsoleInput::Guest(std::mem::take(&mut guest)));
                    }
                    out.push(ConsoleInput::Hotkey(b));
                }
            } else if b == ESCAPE {
                self.armed = true;
            } else {
                guest.push(b);
            }
        }
        if !guest.is_empty() {
            out.push(ConsoleInput::Guest(guest));
        }
        out
    }
}

/// Whether the terminal is in raw mode now: messages for the user then need
/// an explicit carriage return.
static RAW_ACTIVE: AtomicBool = AtomicBool::new(false);
/// Saved terminal state, for the panic hook and signal handlers.
static SAVED: Mutex<Option<(i32, libc::termios)>> = Mutex::new(None);
static HOOKS: Once = Once::new();

/// Prints a line for the user on stderr, correct in raw and cooked mode.
pub fn user_message(text: &str) {
    let mut err = std::io::stderr().lock();
    let nl = if RAW_ACTIVE.load(Ordering::Relaxed) {
        "\r\n"
    } else {
        "\n"
    };
    for line in text.lines() {
        // Messages quote paths, trace metadata and guest text: nothing in
        // them may steer the terminal.
        let _ = write!(err, "{}{nl}", crate::guest_text::escape_within_line(line));
    }
    let _ = err.flush();
}

/// Restores the terminal from inside a signal handler.
pub(crate) fn restore_terminal_in_handler() {
    // try_lock: a signal may arrive while the lock is held; better to leave
    // the terminal raw than to deadlock in a signal handler.
    if let Ok(guard) = SAVED.try_lock() {
        if let Some((fd, termios)) = guard.as_ref() {
            // SAFETY: tcsetattr reads a valid termios; it is async-signal-safe.
            unsafe { libc::tcsetattr(*fd, libc::TCSANOW, termios) };
            RAW_ACTIVE.store(false, Ordering::Relaxed);
        }
    }
}

fn install_hooks() {
    HOOKS.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal_in_handler();
            previous(info);
        }));
        // SIGQUIT (Ctrl-\ in cooked mode, or kill -QUIT) is for leaving at
        // once: restore the terminal and die of it, without a flush.
        // SAFETY: the action only calls async-signal-safe functions.
        let _ = unsafe {
            signal_hook::low_level::register(libc::SIGQUIT, || {
                restore_terminal_in_handler();
                let _ = signal_hook::low_level::emulate_default_handler(libc::SIGQUIT);
            })
        };
    });
}

/// Raw mode on the terminal for as long as it lives.
pub struct RawTerminal {
    fd: i32,
    original: libc::termios,
}

impl RawTerminal {
    /// Puts stdin's terminal into raw mode, or returns `None` if stdin is
    /// not a terminal (a pipe, a file, /dev/null: tests and scripts).
    pub fn enable() -> Result<Option<RawTerminal>> {
        let fd = std::io::stdin().as_raw_fd();
        // SAFETY: isatty only inspects the descriptor.
        if unsafe { libc::isatty(fd) } != 1 {
            return Ok(None);
        }
        // SAFETY: termios is plain data; tcgetattr fills it.
        let mut original: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: fd is a terminal and original is writable.
        if unsafe { libc::tcgetattr(fd, &mut original) } != 0 {
            return Err(Error::Console(std::io::Error::last_os_error()));
        }
        install_hooks();
        if let Ok(mut saved) = SAVED.lock() {
            *saved = Some((fd, original));
        }
        let mut raw = original;
        // SAFETY: cfmakeraw edits the struct in place.
        unsafe { libc::cfmakeraw(&mut raw) };
        // Keep output post-processing so host messages print normally.
        raw.c_oflag |= libc::OPOST | libc::ONLCR;
        // SAFETY: fd is a terminal, raw is a valid termios.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return Err(Error::Console(std::io::Error::last_os_error()));
        }
        RAW_ACTIVE.store(true, Ordering::Relaxed);
        Ok(Some(RawTerminal { fd, original }))
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: restoring the state read in enable().
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.original) };
        RAW_ACTIVE.store(false, Ordering::Relaxed);
        if let Ok(mut saved) = SAVED.lock() {
            *saved = None;
        }
    }
}

/// Reads stdin on its own thread and hands what it means to `send`, which
/// returns false when nobody listens any more.
pub fn spawn_input_thread(send: impl Fn(ConsoleInput) -> bool + Send + 'static) -> Result<()> {
    std::thread::Builder::new()
        .name("vtrace-console".into())
        .spawn(move || {
            let mut parser = EscapeParser::new();
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 256];
            loop {
                let n = match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        send(ConsoleInput::Closed);
                        return;
                    }
                    Ok(n) => n,
                };
                for input in parser.feed(&buf[..n]) {
                    if !send(input) {
                        return;
                    }
                }
            }
        })
        .map(|_| ())
        .map_err(|source| Error::Host {
            what: "start the console thread",
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_bytes_go_to_the_guest() {
        let mut p = EscapeParser::new();
        assert_eq!(p.feed(b"ls\r"), vec![ConsoleInput::Guest(b"ls\r".to_vec())]);
    }

    #[test]
    fn escape_then_key_is_a_hotkey() {
        let mut p = EscapeParser::new();
        assert_eq!(
            p.feed(b"a\x01xb"),
            vec![
                ConsoleInput::Guest(b"a".to_vec()),
                ConsoleInput::Hotkey(b'x'),
                ConsoleInput::Guest(b"b".to_vec())
            ]
        );
    }

    #[test]
    fn escape_split_across_reads() {
        let mut p = EscapeParser::new();
        assert_eq!(p.feed(b"\x01"), vec![]);
        assert_eq!(p.feed(b"t"), vec![ConsoleInput::Hotkey(b't')]);
    }

    #[test]
    fn double_escape_sends_a_literal_ctrl_a() {
        let mut p = EscapeParser::new();
        assert_eq!(p.feed(b"\x01\x01"), vec![ConsoleInput::Guest(vec![ESCAPE])]);
    }
}
