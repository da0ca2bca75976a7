//! Error text for messages and logs, and the last words of helper processes.

/// An error and its causes on one line, `outer: cause: root cause` (reqwest's and hyper's own
/// `Display` is only the outermost layer, which says little: "error sending request").
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The last `keep` bytes a child writes to stderr, collected by a thread until the pipe closes
/// (a helper's or a launcher's last words, for the error that reports its failure).
#[derive(Clone, Debug, Default)]
pub(crate) struct StderrTail(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl StderrTail {
    /// Starts collecting `pipe` (no pipe: nothing to collect).
    pub(crate) fn collect(pipe: Option<std::process::ChildStderr>, keep: usize) -> Self {
        use std::io::Read;
        let tail = Self::default();
        if let Some(mut pipe) = pipe {
            let sink = tail.0.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n @ 1..) = pipe.read(&mut buf) {
                    let mut kept = sink.lock().unwrap_or_else(|p| p.into_inner());
                    kept.extend_from_slice(&buf[..n]);
                    let excess = kept.len().saturating_sub(keep);
                    kept.drain(..excess);
                }
            });
        }
        tail
    }

    /// What was collected so far, as trimmed text.
    pub(crate) fn text(&self) -> String {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&kept).trim().to_owned()
    }
}
