//! Records in, a bounded report out: the correlator, the aggregate and the streams the listed
//! denials are written to as they arrive (sans-I/O apart from the writers it is given).
//!
//! Memory does not grow with the number of denials: the correlator holds a bounded number of
//! open events, the aggregate a bounded number of groups and examples (see
//! [`super::limits`]), and nothing else is kept. `sandbox/audit/tests/cost.rs` feeds it a
//! flood and measures.

use std::io::Write;

use crate::advice::Advisor;
use crate::aggregate::Aggregate;
use crate::correlate::{Correlator, Evasion, Target};
use crate::limits::LIVE_LINES_MAX;
use crate::records::Record;
use crate::report;
use sandbox::policy::ResolvedPolicy;

/// A writer the JSON lines go to; after its first failure it is written no more and keeps
/// the error.
pub struct Stream {
    writer: Box<dyn Write>,
    error: Option<std::io::Error>,
}

impl Stream {
    /// A stream writing to `writer`.
    pub fn new(writer: Box<dyn Write>) -> Self {
        Self {
            writer,
            error: None,
        }
    }

    /// Writes and flushes `bytes`, unless an earlier write failed.
    pub fn write(&mut self, bytes: &[u8]) {
        if self.error.is_none()
            && let Err(err) = self
                .writer
                .write_all(bytes)
                .and_then(|()| self.writer.flush())
        {
            self.error = Some(err);
        }
    }

    /// The first write error, if any.
    pub fn error(&self) -> Option<&std::io::Error> {
        self.error.as_ref()
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

/// The live denial lines: one human line per new group as it appears, at most
/// [`LIVE_LINES_MAX`], then one line saying the rest is in the summary.
struct Live {
    writer: Stream,
    written: usize,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("written", &self.written)
            .finish_non_exhaustive()
    }
}

/// Where records go: the correlator, the aggregate, and the streams.
#[derive(Debug)]
pub struct Pipeline {
    correlator: Correlator,
    advisor: Advisor,
    aggregate: Aggregate,
    streams: Vec<Stream>,
    live: Option<Live>,
}

/// What the pipeline found, once the last record is in.
#[derive(Debug)]
pub struct Findings {
    /// The denials, aggregated.
    pub aggregate: Aggregate,
    /// What the command did that could have hidden denials.
    pub evasion: Evasion,
    /// The streams, in the order given (for the closing lines).
    pub streams: Vec<Stream>,
}

impl Pipeline {
    /// A pipeline for `target` under `policy`; each listed denial is written to every stream as
    /// a JSON line when it arrives.
    pub fn new(target: Target, policy: ResolvedPolicy, streams: Vec<Stream>) -> Self {
        Self {
            correlator: Correlator::new(target, policy.clone()),
            advisor: Advisor::new(policy),
            aggregate: Aggregate::new(),
            streams,
            live: None,
        }
    }

    /// Tells the advice which hidden paths are `sandbox-run --deny` paths (see
    /// [`Advisor::with_cli_denied`]).
    pub fn with_cli_denied(mut self, paths: Vec<std::path::PathBuf>) -> Self {
        self.advisor = self.advisor.with_cli_denied(paths);
        self
    }

    /// Also writes one human line to `writer` (stderr) for each new group as it appears (see
    /// [`report::live_line`]), at most [`LIVE_LINES_MAX`] of them.
    pub fn with_live_lines(mut self, writer: Box<dyn Write>) -> Self {
        self.live = Some(Live {
            writer: Stream::new(writer),
            written: 0,
        });
        self
    }

    /// Takes one record.
    pub fn record(&mut self, record: Record) {
        let found = self.correlator.push(record);
        self.take(found);
    }

    /// Takes a denial seen directly, not through the kernel audit (the egress proxy's): it
    /// comes with its own advice.
    pub fn denial(&mut self, denial: crate::Denial) {
        self.take(vec![denial]);
    }

    /// Completes the pending events and returns the findings.
    pub fn finish(mut self) -> Findings {
        let found = self.correlator.finish();
        self.take(found);
        Findings {
            aggregate: self.aggregate,
            evasion: self.correlator.evasion().clone(),
            streams: self.streams,
        }
    }

    fn take(&mut self, found: Vec<crate::Denial>) {
        for denial in found {
            let advisor = &self.advisor;
            let groups_before = self.aggregate.groups().len();
            let listed = self.aggregate.add(denial, |d| {
                if d.allow_rule.is_empty() {
                    advisor.allow_rule(d.layer, &d.operation, d.path.as_deref(), d.errno.as_deref())
                } else {
                    d.allow_rule.clone()
                }
            });
            if let Some((group, denial)) = listed {
                let line = report::denial_line(group, denial);
                for stream in &mut self.streams {
                    stream.write(line.as_bytes());
                }
                // Groups are numbered in first-seen order: a number not seen before is new.
                let new_group = group >= groups_before;
                if let Some(live) = self.live.as_mut().filter(|_| new_group) {
                    if live.written < LIVE_LINES_MAX {
                        live.writer.write(report::live_line(denial).as_bytes());
                    } else if live.written == LIVE_LINES_MAX {
                        live.writer.write(
                            format!(
                                "sandbox-run: audit: more than {LIVE_LINES_MAX} kinds of denial; \
                                 the rest are in the summary at exit\n"
                            )
                            .as_bytes(),
                        );
                    }
                    live.written = live.written.saturating_add(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Denial, Layer};
    use sandbox::policy::{Access, FilesystemPolicy, PathRule};
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn denial(path: &str) -> Denial {
        Denial {
            time: "2026-01-01T00:00:00.000Z".to_owned(),
            pid: Some(5),
            exe: None,
            layer: Layer::Proxy,
            operation: "net.connect".to_owned(),
            path: None,
            address: Some(path.to_owned()),
            syscall: None,
            errno: None,
            allow_rule: format!("--allow-domain {path}"),
        }
    }

    #[test]
    fn live_lines_are_one_per_new_group_and_bounded() {
        let policy = ResolvedPolicy::new(
            FilesystemPolicy::Restricted {
                rules: vec![PathRule {
                    path: "/".into(),
                    access: Access::Read,
                }],
            },
            false,
        );
        let live = Shared::default();
        let mut pipeline = Pipeline::new(
            Target {
                root_pid: 1,
                session: None,
                own_pids: Vec::new(),
            },
            policy,
            Vec::new(),
        )
        .with_live_lines(Box::new(live.clone()));
        // The same group three times (two distinct examples): one line.
        pipeline.denial(denial("a.example:443"));
        pipeline.denial(denial("a.example:443"));
        pipeline.denial(denial("a.example:443"));
        let text = String::from_utf8(live.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text,
            "sandbox-run: audit: denied net.connect a.example:443 (proxy) — allow: \
             --allow-domain a.example:443\n"
        );
        // Many new groups: LIVE_LINES_MAX lines, then one that says the rest is at exit.
        for i in 0..100 {
            pipeline.denial(denial(&format!("h{i}\n.example:443")));
        }
        let text = String::from_utf8(live.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), LIVE_LINES_MAX + 1, "{text}");
        assert!(lines[1].contains("h0\\x0a.example"), "{text}");
        assert!(
            lines[LIVE_LINES_MAX].contains("the rest are in the summary"),
            "{text}"
        );
        assert_eq!(pipeline.finish().aggregate.total(), 103);
    }
}
