//! Records in, a bounded report out: the correlator, the aggregate and the streams the listed
//! denials are written to as they arrive (sans-I/O apart from the writers it is given).
//!
//! Memory does not grow with the number of denials: the correlator holds a bounded number of
//! open events, the aggregate a bounded number of groups and examples (see
//! [`super::limits`]), and nothing else is kept. `sandbox/tests/audit_cost.rs` feeds it a
//! flood and measures.

use std::io::Write;

use crate::audit::advice::Advisor;
use crate::audit::aggregate::Aggregate;
use crate::audit::correlate::{Correlator, Evasion, Target};
use crate::audit::records::Record;
use crate::audit::report;
use crate::policy::ResolvedPolicy;

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

/// Where records go: the correlator, the aggregate, and the streams.
#[derive(Debug)]
pub struct Pipeline {
    correlator: Correlator,
    advisor: Advisor,
    aggregate: Aggregate,
    streams: Vec<Stream>,
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
        }
    }

    /// Tells the advice which hidden paths are `sandbox-run --deny` paths (see
    /// [`Advisor::with_cli_denied`]).
    pub fn with_cli_denied(mut self, paths: Vec<std::path::PathBuf>) -> Self {
        self.advisor = self.advisor.with_cli_denied(paths);
        self
    }

    /// Takes one record.
    pub fn record(&mut self, record: Record) {
        let found = self.correlator.push(record);
        self.take(found);
    }

    /// Takes a denial seen directly, not through the kernel audit (the egress proxy's): it
    /// comes with its own advice.
    pub fn denial(&mut self, denial: crate::audit::Denial) {
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

    fn take(&mut self, found: Vec<crate::audit::Denial>) {
        for denial in found {
            let advisor = &self.advisor;
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
            }
        }
    }
}
