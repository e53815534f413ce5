//! gdb driven as a user drives it: a server (`vtrace analyze gdb` or
//! `vtrace run --gdb`) started on a free port, and Debian's gdb in batch
//! mode against it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;

use super::{stderr, stdout, vtrace};

/// A gdb server running: the process, the address it listens on, and what
/// it says on stderr after that, collected until it ends.
pub type Server = (Child, String, JoinHandle<String>);

/// `command`, started with stderr read up to the line holding `marker`
/// (the address follows it, up to `end`).
fn listening(mut command: Command, marker: &str, end: char) -> Server {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vtrace");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let address = loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("vtrace ended before it said {marker:?}"))
            .unwrap();
        if let Some(rest) = line.split(marker).nth(1) {
            break rest.split(end).next().unwrap().to_string();
        }
    };
    // The rest is read as it comes, so the server never blocks on stderr.
    let rest = std::thread::spawn(move || {
        lines
            .map_while(Result::ok)
            .map(|l| l + "\n")
            .collect::<String>()
    });
    (child, address, rest)
}

/// `vtrace analyze gdb TRACE --listen 127.0.0.1:0 ARGS`, running.
pub fn serve(trace: &Path, args: &[&str]) -> Server {
    let mut command = vtrace();
    command
        .args(["analyze", "gdb", trace.to_str().unwrap(), "-q"])
        .args(["--listen", "127.0.0.1:0"])
        .args(args);
    listening(command, "serving the trace to gdb at ", ',')
}

/// `vtrace run ARGS --gdb 127.0.0.1:0`, running.
pub fn run_with_gdb(args: &[&str]) -> Server {
    let mut command = vtrace();
    command
        .args(["run", "--no-input", "--gdb", "127.0.0.1:0"])
        .args(args);
    listening(command, "gdb can attach at ", ' ')
}

/// gdb in batch mode on `address`, with `elf` as its program (else the
/// one vtrace offers it): what it printed.
pub fn gdb(address: &str, elf: Option<&Path>, commands: &[&str]) -> String {
    let mut gdb = Command::new("timeout");
    gdb.args([
        "300",
        "gdb",
        "-batch",
        "-nx",
        "-ex",
        "set pagination off",
        "-ex",
        "set confirm off",
    ]);
    if let Some(elf) = elf {
        gdb.args(["-ex", &format!("file {}", elf.display())]);
    }
    gdb.args(["-ex", &format!("target remote {address}")]);
    for c in commands {
        gdb.args(["-ex", c]);
    }
    let out = gdb.output().expect("gdb (scripts/test.sh installs it)");
    format!("{}{}", stdout(&out), stderr(&out))
}

/// A bare connection to a gdb server, speaking the remote protocol by
/// hand as a fuzzer or a careless client does: no handshake, any packet.
pub struct RawGdb(std::net::TcpStream);

impl RawGdb {
    /// Connected to `address`; a reply not come in 120 s fails the test
    /// (the server hangs) instead of hanging it.
    pub fn connect(address: &str) -> RawGdb {
        let stream = std::net::TcpStream::connect(address).expect("connect to the gdb server");
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(120)))
            .unwrap();
        RawGdb(stream)
    }

    /// Sends `$BODY#CHECKSUM`.
    pub fn send(&mut self, body: &str) {
        use std::io::Write;
        let sum = body.bytes().fold(0u8, |a, b| a.wrapping_add(b));
        write!(self.0, "${body}#{sum:02x}").expect("send a packet");
    }

    /// The body of the next packet the server sends (its acks passed
    /// over), acknowledged; None once the server closed the connection.
    pub fn reply(&mut self) -> Option<String> {
        use std::io::{Read, Write};
        let mut byte = [0u8; 1];
        let mut next = |stream: &mut std::net::TcpStream| match stream.read(&mut byte) {
            Ok(1) => Some(byte[0]),
            Ok(_) => None,
            Err(e) => panic!("no reply from the gdb server: {e}"),
        };
        while next(&mut self.0)? != b'$' {}
        let mut body = Vec::new();
        loop {
            match next(&mut self.0)? {
                b'#' => break,
                b => body.push(b),
            }
        }
        next(&mut self.0)?;
        next(&mut self.0)?;
        self.0.write_all(b"+").ok()?;
        Some(String::from_utf8_lossy(&body).into_owned())
    }

    /// Sends `body` and returns the reply to it.
    pub fn ask(&mut self, body: &str) -> String {
        self.send(body);
        self.reply()
            .unwrap_or_else(|| panic!("the server hung up on {body:?}"))
    }

    /// Writes raw bytes, until the server stops taking them: how many it
    /// took before the connection failed (all of them if it never did).
    pub fn pour(&mut self, bytes: &[u8], times: usize) -> usize {
        use std::io::Write;
        let mut taken = 0;
        for _ in 0..times {
            match self.0.write_all(bytes) {
                Ok(()) => taken += bytes.len(),
                Err(_) => break,
            }
        }
        taken
    }
}
