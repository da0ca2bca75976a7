//! The server side of `exec-guardian`: a helper that kills every process group the server
//! created once the server dies (its stdin pipe reaches EOF), however the server dies.
//!
//! With the guardian running, pipe-mode children can be started with `posix_spawn` (no
//! `pre_exec` hook, so no `fork` of the whole server: the spawn round trip is about 0.3 ms
//! shorter) and still die with the server. Without it, children fall back to a forked start
//! with `PR_SET_PDEATHSIG`.

use std::io::Write;
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::Mutex;

/// A running guardian.
pub struct Guardian {
    pipe: Mutex<ChildStdin>,
}

impl Guardian {
    /// Start the guardian binary in its own process group (so a signal to the server's group
    /// does not take it down first).
    ///
    /// # Errors
    /// The spawn error.
    pub fn start(binary: &Path) -> std::io::Result<Self> {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(binary)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()?;
        let pipe = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("guardian stdin missing"))?;
        // The guardian outlives us on purpose; it is reaped by init after it acts.
        drop(child);
        Ok(Self {
            pipe: Mutex::new(pipe),
        })
    }

    fn send(&self, op: u8, pgid: i32) {
        let mut record = [op, 0, 0, 0, 0];
        record[1..].copy_from_slice(&pgid.to_le_bytes());
        // 5 bytes < PIPE_BUF: the write is atomic and, with the guardian reading, never blocks
        // for long.
        let mut pipe = self
            .pipe
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Err(error) = pipe.write_all(&record) {
            tracing::warn!(%error, "exec-guardian is gone; children will not be killed if the server dies");
        }
    }

    /// Kill this process group if the server dies.
    pub fn register(&self, pgid: i32) {
        self.send(b'+', pgid);
    }

    /// Forget this process group (it has finished).
    pub fn unregister(&self, pgid: i32) {
        self.send(b'-', pgid);
    }
}
