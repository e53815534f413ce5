//! The control socket: `vtrace ctl` talks to a running VM over a Unix
//! socket (mode 0600). One line in, one line out, per connection.
//!
//! The server runs on a tokio runtime on its own thread; requests reach the
//! run loop through a channel, which serves them between exits and answers
//! through a oneshot. The run loop is kicked so a request is served at once
//! even while the guest computes without exits.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// Longest request line accepted.
const MAX_LINE: usize = 256;
/// How long a client may take to send its request.
const IDLE_CLIENT: Duration = Duration::from_secs(10);
/// Pause after a failed accept (descriptors exhausted).
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// A request from `vtrace ctl`, waiting for the run loop.
pub struct ControlRequest {
    pub command: String,
    reply: tokio::sync::oneshot::Sender<String>,
}

impl std::fmt::Debug for ControlRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlRequest").finish_non_exhaustive()
    }
}

impl ControlRequest {
    /// Answers the client.
    pub fn reply(self, text: String) {
        let _ = self.reply.send(text);
    }
}

type Waker = Arc<Mutex<Option<Box<dyn Fn() + Send>>>>;

/// A listening control socket; removed from the filesystem when dropped.
pub struct ControlServer {
    path: PathBuf,
    requests: Receiver<ControlRequest>,
    waker: Waker,
}

impl std::fmt::Debug for ControlServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlServer").finish_non_exhaustive()
    }
}

/// Errors of the control socket, on either side.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The server could not listen on its socket.
    #[error("cannot listen on {path}: {source}")]
    Bind {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A client found no run listening.
    #[error("no vtrace run is listening on {path} ({source}); is it running, with a trace disk?")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A request or its answer could not be sent.
    #[error("talking to {path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl ControlError {
    /// The status a command that fails with this error exits with, as
    /// sysexits.h names them.
    pub fn exit_status(&self) -> i32 {
        match self {
            ControlError::Bind { .. } => exitcode::CANTCREAT,
            ControlError::Connect { .. } => exitcode::UNAVAILABLE,
            ControlError::Io { .. } => exitcode::SOFTWARE,
        }
    }
}

/// Where a run's socket goes by default: `$XDG_RUNTIME_DIR` (the user's
/// own), or else a directory of this user's own in /tmp, `vtrace-UID`.
/// A shared directory would let another user listen first on the name a
/// run is about to take (its pid is no secret) and so stop the run.
pub fn default_dir() -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    // Only this user's own (`sudo -E` keeps another user's).
    std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_dir() && m.uid() == current_uid()))
        .unwrap_or_else(|| std::env::temp_dir().join(format!("vtrace-{}", current_uid())))
}

fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// The default socket path of the process `pid`, its directory made where
/// it is vtrace's own (0700) and checked to be this user's alone.
pub fn default_path(pid: u32) -> Result<PathBuf, ControlError> {
    let dir = default_dir();
    let refused = |why: String| ControlError::Bind {
        path: dir.clone(),
        source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, why),
    };
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let made = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    if let Err(e) = made {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(refused(format!("cannot make it: {e}")));
        }
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| refused(e.to_string()))?;
    if !meta.is_dir() || meta.uid() != current_uid() || meta.mode() & 0o022 != 0 {
        return Err(refused(format!(
            "it is not a directory of this user's that only they can write to (owner {}, \
             mode {:o}); remove it, or name a socket with --control",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Ok(dir.join(format!("vtrace-{pid}.sock")))
}

impl ControlServer {
    /// Listens on `path` (a stale socket there is replaced).
    pub fn bind(path: &Path) -> Result<ControlServer, ControlError> {
        let bind_err = |source| ControlError::Bind {
            path: path.to_path_buf(),
            source,
        };
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            // Only a socket no run answers on is taken over: never a file,
            // and never a live run's socket.
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(bind_err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "a file that is not a socket is there; choose another --control path",
                )));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(bind_err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another vtrace run is listening there",
                )));
            }
            let _ = std::fs::remove_file(path);
        }
        let listener = std::os::unix::net::UnixListener::bind(path).map_err(bind_err)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(bind_err)?;
        let (tx, rx) = channel();
        let waker: Waker = Arc::new(Mutex::new(None));
        let wake = waker.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(bind_err)?;
        std::thread::Builder::new()
            .name("vtrace-control".into())
            .spawn(move || runtime.block_on(serve(listener, tx, wake)))
            .map_err(bind_err)?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            requests: rx,
            waker,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Called by the run loop with a function that kicks the vCPU.
    pub fn set_waker(&self, wake: Box<dyn Fn() + Send>) {
        if let Ok(mut w) = self.waker.lock() {
            *w = Some(wake);
        }
    }

    /// The next request, if one is waiting.
    pub fn try_next(&self) -> Option<ControlRequest> {
        self.requests.try_recv().ok()
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn serve(
    listener: std::os::unix::net::UnixListener,
    tx: Sender<ControlRequest>,
    waker: Waker,
) {
    let Ok(listener) = tokio::net::UnixListener::from_std(listener) else {
        return;
    };
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, most likely: the clients holding them
                // time out, so wait and serve again rather than give up.
                tracing::warn!("control socket: accept failed: {e}");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let tx = tx.clone();
        let waker = waker.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            let mut reader = tokio::io::BufReader::new(read.take(MAX_LINE as u64));
            // A client that connects and says nothing must not hold its
            // descriptor for ever.
            match tokio::time::timeout(IDLE_CLIENT, reader.read_line(&mut line)).await {
                // Closed having said nothing: `vtrace ctl` and a starting
                // run check that a socket is alive by connecting, which
                // is no request (it was served as the command '').
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(_)) => {}
                Err(_) => {
                    let _ = write.write_all(b"error: no request within 10 s\n").await;
                    return;
                }
            }
            let (reply, answer) = tokio::sync::oneshot::channel();
            let request = ControlRequest {
                command: line.trim().to_string(),
                reply,
            };
            if tx.send(request).is_err() {
                let _ = write.write_all(b"error: the VM has stopped\n").await;
                return;
            }
            if let Ok(w) = waker.lock() {
                if let Some(wake) = w.as_ref() {
                    wake();
                }
            }
            let text = answer
                .await
                .unwrap_or_else(|_| "error: the VM has stopped".into());
            let _ = write.write_all(format!("{text}\n").as_bytes()).await;
        });
    }
}

/// Sends one command to the run listening on `path`; returns its answer.
pub fn send(path: &Path, command: &str) -> Result<String, ControlError> {
    let io = |source| ControlError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut stream = UnixStream::connect(path).map_err(|source| ControlError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(io)?;
    stream
        .write_all(format!("{command}\n").as_bytes())
        .map_err(io)?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).map_err(io)?;
    Ok(answer.trim_end().to_string())
}
