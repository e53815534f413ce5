//! A gdb session played from bytes: what a client sent, fed to the loop
//! that serves a trace, with no socket. The packet fuzz target drives the
//! protocol with it; what the server answered comes back.

use std::cell::RefCell;
use std::io;
use std::rc::Rc;

use gdbstub::conn::{Connection, ConnectionExt};

use crate::serve::{serve_trace_on, Conn};
use crate::trace_target::TraceTarget;
use crate::GdbError;

/// Bytes in, bytes out; the end of the input is the client hanging up.
struct Playback {
    from_gdb: Vec<u8>,
    at: usize,
    to_gdb: Rc<RefCell<Vec<u8>>>,
}

impl Connection for Playback {
    type Error = io::Error;

    fn write(&mut self, byte: u8) -> io::Result<()> {
        self.to_gdb.borrow_mut().push(byte);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ConnectionExt for Playback {
    fn read(&mut self) -> io::Result<u8> {
        let byte = self.peek()?.ok_or(io::ErrorKind::UnexpectedEof)?;
        self.at += 1;
        Ok(byte)
    }

    fn peek(&mut self) -> io::Result<Option<u8>> {
        Ok(self.from_gdb.get(self.at).copied())
    }
}

/// Serves `target` to a client that sent `from_gdb` and then hung up:
/// how the session ended, and every byte the server sent.
pub fn serve_trace_bytes(
    target: &mut TraceTarget,
    from_gdb: &[u8],
) -> (Result<(), GdbError>, Vec<u8>) {
    let to_gdb = Rc::new(RefCell::new(Vec::new()));
    let conn: Conn = Box::new(Playback {
        from_gdb: from_gdb.to_vec(),
        at: 0,
        to_gdb: Rc::clone(&to_gdb),
    });
    let ended = serve_trace_on(target, conn);
    let sent = to_gdb.take();
    (ended, sent)
}
