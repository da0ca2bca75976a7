//! The denial audit's cost does not grow with the number of denials: a flood of 1,000,000
//! denials goes through the real pipeline (record parsing, correlation, aggregation, the
//! streamed JSON lines) while a counting allocator measures the heap. No kernel audit is
//! involved (records are built in the shape Linux 6.18 sends), so this runs anywhere;
//! `tests/audit/robustness.rs` floods a real `sandbox-run --audit` as root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use audit::correlate::Target;
use audit::limits::{AGGREGATE_MAX_BYTES, EXAMPLES_PER_GROUP, MAX_GROUPS, RECORD_LINE_MAX_BYTES};
use audit::pipeline::{Pipeline, Stream};
use audit::records::Record;
use audit::report::{RunAudit, closing_lines};
use audit::{Coverage, Layer};
use sandbox::policy::{Access, FilesystemPolicy, PathRule, ResolvedPolicy};

/// Counts live heap bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the system allocator's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The floods share the counters: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const FLOOD: u64 = 1_000_000;
const ROOT: u32 = 100;
const SESSION: u32 = 7;

fn policy() -> ResolvedPolicy {
    ResolvedPolicy::new(
        FilesystemPolicy::Restricted {
            rules: vec![
                PathRule {
                    path: "/".into(),
                    access: Access::Read,
                },
                PathRule {
                    path: "/ws".into(),
                    access: Access::Write,
                },
            ],
        },
        false,
    )
}

/// Counts the bytes streamed and the longest line.
#[derive(Clone, Default)]
struct Meter(Arc<Mutex<(usize, usize, usize)>>);

impl Write for Meter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut m = self.0.lock().unwrap();
        m.0 += buf.len();
        for line in buf.split_inclusive(|b| *b == b'\n') {
            m.2 += line.len();
            if line.ends_with(b"\n") {
                m.1 = m.1.max(m.2);
                m.2 = 0;
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Outcome {
    audit: RunAudit,
    heap_growth: usize,
    streamed: usize,
    longest_line: usize,
    seconds: f64,
}

/// Runs `records` (kind, text) through a pipeline; measures the heap above the baseline.
fn flood(records: impl Iterator<Item = (u16, String)>) -> Outcome {
    let meter = Meter::default();
    let started = std::time::Instant::now();
    let baseline = LIVE.load(Ordering::Relaxed);
    PEAK.store(baseline, Ordering::Relaxed);
    let mut pipeline = Pipeline::new(
        Target {
            root_pid: ROOT,
            session: Some(SESSION),
            own_pids: vec![99],
        },
        policy(),
        vec![Stream::new(Box::new(meter.clone()))],
    );
    for (kind, text) in records {
        pipeline.record(Record::parse(kind, text.as_bytes()).unwrap());
    }
    let findings = pipeline.finish();
    let heap_growth = PEAK.load(Ordering::Relaxed) - baseline;
    let audit = RunAudit {
        command: vec!["flood".to_owned()],
        root: std::path::PathBuf::from("/"),
        exit_status: 0,
        aggregate: findings.aggregate,
        coverage: Coverage::default(),
    };
    let mut streams = findings.streams;
    streams[0].write(closing_lines(&audit).as_bytes());
    let (streamed, longest_line, _) = *meter.0.lock().unwrap();
    Outcome {
        audit,
        heap_growth,
        streamed,
        longest_line,
        seconds: started.elapsed().as_secs_f64(),
    }
}

#[test]
fn a_million_seccomp_denials_are_counted_in_one_group_in_bounded_memory() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let records = (0..FLOOD).map(|i| {
        (
            1326,
            format!(
                "audit(1700000000.{:03}:{}): auid=0 uid=0 gid=0 ses={SESSION} subj=unconfined pid=102 comm=\"flood\" exe=\"/usr/bin/flood\" sig=0 arch=c000003e syscall=41 compat=0 ip=0x7f9a79b28dc7 code=0x50000",
                i % 1000,
                i + 1
            ),
        )
    });
    let out = flood(records);
    let aggregate = &out.audit.aggregate;
    assert_eq!(aggregate.total(), FLOOD);
    assert_eq!(aggregate.groups().len(), 1);
    assert_eq!(aggregate.groups()[0].layer, Layer::Seccomp);
    assert_eq!(aggregate.groups()[0].count, FLOOD);
    // Every denial has the same target: one example, the rest aggregated.
    assert_eq!(aggregate.listed(), 1);
    assert_eq!(aggregate.aggregated(), FLOOD - 1);
    assert!(
        out.heap_growth < 1024 * 1024,
        "heap grew by {} bytes for {FLOOD} denials of one kind",
        out.heap_growth
    );
    assert!(out.streamed < 4 * RECORD_LINE_MAX_BYTES, "{}", out.streamed);
    eprintln!(
        "seccomp flood: {FLOOD} records in {:.2} s ({:.0}/s), heap growth {} bytes, {} bytes streamed",
        out.seconds,
        FLOOD as f64 / out.seconds,
        out.heap_growth,
        out.streamed
    );
}

#[test]
fn a_million_denials_on_long_distinct_paths_stay_under_the_aggregate_bound() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // The worst a command can do: every denial in a directory of its own, each path as long
    // as the kernel records (hex-encoded, of control characters: six bytes each in JSON).
    let hex = |text: &str| text.bytes().map(|b| format!("{b:02X}")).collect::<String>();
    let (head, tail) = (hex("/ws/.git/"), hex(&format!("{}/f", "\u{1}".repeat(900))));
    let hex_name = move |i: u64| format!("{head}{}{tail}", hex(&i.to_string()));
    let exe = hex(&"\u{7}".repeat(2000));
    let records = (0..FLOOD).flat_map(move |i| {
        let stamp = format!("audit(1700000000.{:03}:{})", i % 1000, i + 1);
        [
            (
                1300,
                format!(
                    "{stamp}: arch=c000003e syscall=257 success=no exit=-30 a0=ffffff9c a1=7ffd a2=241 a3=1b6 items=1 ppid=101 pid=102 auid=0 uid=0 ses={SESSION} comm=\"flood\" exe={exe} key=(null)"
                ),
            ),
            (1307, format!("{stamp}: cwd=\"/ws\"")),
            (
                1302,
                format!(
                    "{stamp}: item=0 name={} inode=9 dev=fe:00 mode=0100644 nametype=NORMAL",
                    hex_name(i)
                ),
            ),
            (1320, format!("{stamp}: ")),
        ]
        .into_iter()
    });
    let out = flood(records);
    let aggregate = &out.audit.aggregate;
    assert_eq!(aggregate.total(), FLOOD);
    let groups = aggregate.groups();
    assert_eq!(groups.iter().filter(|g| !g.folded()).count(), MAX_GROUPS);
    assert_eq!(aggregate.folded_groups(), 1);
    assert_eq!(groups.iter().map(|g| g.count).sum::<u64>(), FLOOD);
    assert_eq!(aggregate.listed(), MAX_GROUPS as u64 + 1);
    assert!(groups.iter().all(|g| g.examples.len() == 1));
    assert!(
        out.heap_growth < AGGREGATE_MAX_BYTES,
        "heap grew by {} bytes (bound {AGGREGATE_MAX_BYTES})",
        out.heap_growth
    );
    assert!(
        out.longest_line <= RECORD_LINE_MAX_BYTES,
        "{}",
        out.longest_line
    );
    let lines_bound = (MAX_GROUPS * (EXAMPLES_PER_GROUP + 1) + 2) * RECORD_LINE_MAX_BYTES;
    assert!(out.streamed < lines_bound, "{}", out.streamed);
    eprintln!(
        "distinct-path flood: {FLOOD} denials ({} records) in {:.2} s, heap growth {} bytes, \
         {} bytes streamed, longest line {}",
        4 * FLOOD,
        out.seconds,
        out.heap_growth,
        out.streamed,
        out.longest_line
    );
}
