//! Every limit the server enforces, with its unit and the reason for it. docs/protocol.md names
//! the same constants.

use std::time::Duration;

/// Largest websocket message or frame accepted from a client. Big enough for a 32 MiB
/// `fs/writeFile` in base64 plus envelope; anything larger is refused while its header is read,
/// before the payload is buffered.
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;
/// Time a websocket message has, from its first byte, to arrive whole. Until then its bytes are
/// held by the websocket layer (charged to the connection's memory as they arrive); a message not
/// complete by then closes the connection (1008). A 64 MiB message needs about 54 Mbit/s; the
/// listener serves loopback, unix sockets and local networks (remote mode has its own relay).
pub const MESSAGE_COMPLETION_TIMEOUT: Duration = Duration::from_secs(10);
/// Unfinished message bytes are charged in steps of this size (a few budget operations per large
/// message, not one per socket read). A message's first step is not charged (like the socket's
/// read buffer): an ordinary request is received whatever room the budgets have; past it the
/// whole message is charged, to [`CONNECTION_MEMORY_ALLOWANCE`] and then [`MEMORY_BUDGET_BYTES`].
pub const MESSAGE_CHARGE_STEP_BYTES: usize = 256 * 1024;
/// Largest HTTP upgrade head (request line plus headers) read before the websocket starts.
pub const MAX_UPGRADE_HEAD_BYTES: usize = 16 * 1024;
/// Time a client has to send the whole HTTP head (defeats slowloris connections). A client sends
/// its head right after connecting; two seconds is generous even over a slow link, and short
/// enough that silent sockets cannot pile up.
pub const UPGRADE_HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// Time an upgraded connection has to send a successful `initialize`; one that does not is
/// closed. Until then it holds a pending slot, not a connection slot.
pub const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections accepted but not yet initialized (head not read, token not checked, or upgraded
/// without `initialize` yet). They live in this small pool apart from [`MAX_CONNECTIONS`]; when it
/// is full the oldest is closed (an unauthenticated one first), so silent sockets cannot lock
/// out the clients that do speak.
pub const MAX_PENDING_CONNECTIONS: usize = 256;
/// Pending connections from one source address (an IPv6 /64 counts as one source; every unix
/// socket peer is the same local source). Past it, the source's own oldest pending connection is
/// closed, so one host flooding the pool churns its own slots and not others'. Large enough for
/// a harness that opens a hundred sessions at once (at 16, most of such a burst was closed
/// before the server had read its first request).
pub const MAX_PENDING_PER_SOURCE: usize = 128;
/// Requests of one connection handled at once; past this the server stops reading the socket
/// until one completes, so a client that floods requests gets backpressure, not unbounded tasks.
pub const MAX_INFLIGHT_REQUESTS: usize = 128;
/// How long a connection that ended (its client closed it, left, or broke a rule) still gets to
/// write the answers already queued before its socket is closed. A client that stopped reading
/// holds its socket and the answers queued for it no longer than this after it left.
pub const CLOSE_DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// Outgoing messages queued per connection. A client that does not read stalls process output
/// (and so the child, through its pipe) instead of growing server memory.
pub const OUTBOUND_QUEUE_MESSAGES: usize = 1024;
/// Bytes of serialized messages queued per connection. Together with the count limit above this
/// bounds a non-reading client's cost to the server (about this much plus one message).
pub const OUTBOUND_QUEUE_BYTES: usize = 8 * 1024 * 1024;
/// Allocations up to this size come from the allocator's arenas rather than a fresh `mmap`
/// each (glibc; set once at start). Messages of the output and relay paths are a few hundred
/// KiB; mapping and faulting in each one cost about a quarter of remote-mode throughput.
pub const ALLOCATOR_MMAP_THRESHOLD_BYTES: usize = 2 * 1024 * 1024;
/// Free memory an allocator arena keeps at its top before giving it back (glibc). Below about
/// 16 MiB the arenas shrink and regrow for every few messages (measured: 4 MiB gained nothing).
/// Large requests still give memory back at once (`sys::release_free_memory`).
pub const ALLOCATOR_TRIM_THRESHOLD_BYTES: usize = 16 * 1024 * 1024;
/// Initialized client connections. Past it `initialize` is refused with `limitExceeded` (and the
/// connection closed); a slot is only taken once a connection passed admission and initialized.
pub const MAX_CONNECTIONS: usize = 256;
/// Sessions the server holds, attached or detached. Past it, `initialize` for a new session is
/// refused with `limitExceeded` (retryable: detached sessions expire).
pub const MAX_SESSIONS: usize = 320;
/// Detached sessions one client (a peer uid, a remote address; see
/// `transport::identity`) keeps for a resume, however many connections it used. When one more of
/// its sessions detaches, its own session detached longest ago expires at once (its processes
/// are terminated): a client churning sessions ends its own, never another client's.
pub const MAX_DETACHED_SESSIONS_PER_CLIENT: usize = 64;
/// Detached sessions kept for a resume across all clients, so abandoned sessions cannot hold
/// processes and descriptors beyond this. Past it, the client holding the most detached sessions
/// loses its oldest one. Four clients' full shares; below [`MAX_SESSIONS`] so attached clients
/// always have room.
pub const MAX_DETACHED_SESSIONS: usize = 4 * MAX_DETACHED_SESSIONS_PER_CLIENT;
/// Server memory for requests being handled and the answers they produce, across all
/// connections: an in-flight request's payload (twice its size: the parsed params and a decoded
/// copy) plus the worst-case size of its answer, reserved before the work starts. Past it, new
/// work is refused with `limitExceeded` (retryable) instead of growing the process toward the
/// OOM killer. Each connection's first [`CONNECTION_MEMORY_ALLOWANCE`] bytes do not draw on it,
/// so small requests keep being served while large ones are refused. The default of
/// `--memory-budget`.
pub const MEMORY_BUDGET_BYTES: usize = 1024 * 1024 * 1024;
/// Bytes of requests and answers each connection may hold without drawing on
/// [`MEMORY_BUDGET_BYTES`]: what a client issuing ordinary small requests needs.
pub const CONNECTION_MEMORY_ALLOWANCE: usize = 2 * 1024 * 1024;
/// Bytes of requests in flight and answers not yet written, per connection (the sum of their
/// reservations, see [`MEMORY_BUDGET_BYTES`]). When a new request does not fit, the server stops
/// reading the socket until earlier answers were written: a client that pipelines large reads
/// and does not read the answers holds at most this much.
pub const MAX_INFLIGHT_BYTES_PER_CONNECTION: usize = 160 * 1024 * 1024;
/// Reservation for the answer of a method whose answer is small (everything but file contents,
/// process output and HTTP bodies). A larger answer is still sent if the budget has room for it.
pub const SMALL_RESPONSE_BYTES: usize = 64 * 1024;
/// Longest error message sent to a client; longer ones (an error quoting a huge input) are cut.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 2048;
/// Longest `clientName`, in bytes.
pub const MAX_CLIENT_NAME_BYTES: usize = 256;
/// Descriptors the server keeps free for accepting connections, spawning (pipes exist briefly
/// in the server) and helpers starting, beyond what clients can hold: the client descriptor
/// budget is the open-file limit minus this, minus two per possible connection (its socket and
/// the duplicate watching for its close) and one per `http/request`.
pub const DESCRIPTOR_RESERVE: usize = 2048;
/// Upper bound of the descriptors clients can make the server hold (fs handles, process pipes,
/// pidfds and terminals, helper sockets), whatever the open-file limit allows. Past the budget
/// the request that needs one more is refused with `limitExceeded` (retryable).
pub const MAX_CLIENT_DESCRIPTORS: usize = 16 * 1024;
/// Processes running at once, across all sessions (each holds descriptors, a pump task and up
/// to [`OUTPUT_RETENTION_BYTES`] of output). Past it `process/start` is refused with
/// `limitExceeded` (retryable).
pub const MAX_LIVE_PROCESSES: usize = 4096;
/// Blocking work (filesystem calls, helper exchanges, policy resolution, program lookup and
/// spawn) running at once, across all connections; more waits its turn. Keeps the blocking
/// thread pool, and so CPU contention with the async workers, bounded.
pub const MAX_BLOCKING_TASKS: usize = 32;
/// Blocking work one connection may have running at once; its further requests wait, so one
/// connection cannot take every blocking slot.
pub const MAX_BLOCKING_TASKS_PER_CONNECTION: usize = 4;
/// `fs/readFile`s of at least [`BULK_READ_BYTES`] being read and encoded at once, across all
/// connections; more wait their turn (without a thread). Each is CPU-bound for tens of
/// milliseconds (page-cache copies, page faults, base64), and on a small host dozens at once
/// would leave an ordinary request a sliver of a core: a neighbour's small read took 50 to
/// 117 ms while eight connections pipelined 32 MiB reads, 34 to 38 ms at the p99 with this.
pub const MAX_BULK_READS: usize = 2;
/// The size from which an `fs/readFile` counts against [`MAX_BULK_READS`].
pub const BULK_READ_BYTES: u64 = 1024 * 1024;
/// Threads for CPU-bound request work (large parses and encodings, policy resolution): one per
/// core, at most this many, at a lower priority than the async workers (`cpu_pool`).
pub const MAX_CPU_POOL_THREADS: usize = 8;
/// Nice value of the CPU pool's threads (the async workers keep the process's own, 0 by default).
pub const CPU_POOL_NICE: i32 = 10;
/// Longest `argv` element or environment value, in bytes: the kernel's `MAX_ARG_STRLEN`
/// (longer ones fail exec with E2BIG anyway).
pub const MAX_ARG_BYTES: usize = 128 * 1024;
/// Total bytes of `argv` and `env` (names, values and separators) of one `process/start`: half
/// of the kernel's usual 2 MiB `ARG_MAX`, checked before any work.
pub const MAX_ARGV_ENV_BYTES: usize = 1024 * 1024;
/// Longest `PATH` searched for a program named without a `/` (longer is refused before the
/// search; identical entries are searched once).
pub const MAX_PATH_SEARCH_BYTES: usize = 16 * 1024;
/// Output retained per process for `process/read`; older chunks are dropped first.
pub const OUTPUT_RETENTION_BYTES: usize = 1024 * 1024;
/// Output retained by all processes of all sessions together (default of
/// `--retained-output-bytes`). Every chunk is charged to its session before it is held; past
/// this, the oldest output of the session retaining the most is dropped (reported to its readers
/// as dropped), never a process stopped. Without it, 1,200 processes of one session held
/// 1.2 GiB. A quarter of [`MEMORY_BUDGET_BYTES`]: the server's whole bound stays near 1.3 GiB.
pub const RETAINED_OUTPUT_BUDGET_BYTES: usize = 256 * 1024 * 1024;
/// What a retained chunk costs beyond its bytes (its entry in the process's log and in its
/// session's order, the allocation's header), so a flood of one-byte chunks is charged honestly.
pub const RETAINED_CHUNK_OVERHEAD_BYTES: usize = 128;
/// Worker threads of the runtime that reads every process's output (`process::pump`).
pub const OUTPUT_RUNTIME_THREADS: usize = 1;

/// Largest read of a child's pipe or PTY in one go (one `process/output` chunk at most), well
/// below [`OUTPUT_RETENTION_BYTES`]. A protocol limit the client relies on too, so it lives in
/// `proto`.
pub use proto::limits::OUTPUT_READ_CHUNK_BYTES;
/// Pipe buffer requested for a child's stdout/stderr (fewer, larger chunks at high throughput).
pub const CHILD_PIPE_BYTES: i32 = 1024 * 1024;
/// Cap (and default) of `process/read`'s `maxBytes` (shared with the client through `proto`).
pub use proto::limits::MAX_READ_BYTES;
/// Cap of `process/read`'s `waitMs`: a long-poll never holds a request slot longer than this.
pub const MAX_WAIT_MS: u64 = 60_000;
/// Processes `GET /status` lists at most (about 400 bytes each: a page of at most ~2 MiB); past
/// it the page counts the rest in `processesOmitted`. Sessions may hold far more (closed
/// processes stay in their tables for a while), and a page is built whole in memory.
pub const MAX_STATUS_PROCESSES: usize = 4096;
/// Processes (running or retained after exit) one session may hold.
pub const MAX_PROCESSES_PER_SESSION: usize = 2048;
/// Longest `processId`, in bytes.
pub const MAX_PROCESS_ID_BYTES: usize = 128;
/// `writeId`s remembered per process to deduplicate retried writes (the reference server
/// remembers as many, so a client retrying within its window sees the same behaviour). Each is
/// kept as a 128-bit keyed hash, so the memory is fixed whatever the ids' length.
pub const WRITE_ID_MEMORY: usize = 4096;
/// Longest `writeId`, in bytes.
pub const MAX_WRITE_ID_BYTES: usize = 128;
/// Denial records kept per audited process (`auditDenials`) for `process/read`.
pub const MAX_DENIALS_RETAINED: usize = 1024;
/// Bytes of denial records kept per audited process (oldest dropped first, counted in
/// `denialsDropped`), shared with the audit side through `proto`.
pub use proto::methods::process::MAX_DENIAL_BYTES_RETAINED;
/// Longest denial record line accepted from `sandbox-run --audit-fd` (shared with the audit
/// side through `proto`).
pub use proto::methods::process::MAX_DENIAL_RECORD_BYTES;
/// How long `process/terminate` waits after SIGTERM before SIGKILL.
pub const TERMINATE_GRACE: Duration = Duration::from_secs(2);
/// How long a process stays readable after `process/closed`.
pub const CLOSED_PROCESS_RETENTION: Duration = Duration::from_secs(30);
/// How long a detached session (its connection lost) keeps its processes for a resume.
pub const DETACHED_SESSION_TTL: Duration = Duration::from_secs(30);
/// Largest `fs/readBlock` (1 MiB; shared with the client and the fs-helper, which enforces it,
/// through `proto`).
pub use proto::limits::READ_BLOCK_MAX_BYTES;
/// Largest file `fs/readFile` returns (32 MiB); larger files are read with `fs/open` +
/// `fs/readBlock`. Shared with the fs-helper, which enforces it, through `proto`.
pub use proto::limits::READ_FILE_MAX_BYTES;
/// Entries and bytes of one `fs/readDirectory` answer (100,000 / 8 MiB of JSON text); past
/// either, its first entries by name and `truncated: true`. Shared with the fs-helper, which
/// enforces them, through `proto`.
pub use proto::limits::{READ_DIRECTORY_MAX_ANSWER_BYTES, READ_DIRECTORY_MAX_ENTRIES};
/// Open `fs/open` handles per connection.
pub const MAX_OPEN_HANDLES: usize = 128;
/// Longest `handleId`, in bytes.
pub const MAX_HANDLE_ID_BYTES: usize = 32;
/// Default PTY size.
pub const DEFAULT_PTY_COLS: u16 = 80;
/// Default PTY size.
pub const DEFAULT_PTY_ROWS: u16 = 24;
/// Largest `http/request` request body (decoded): the largest file `fs/writeFile` takes, so a
/// request fits one frame in base64.
pub const MAX_HTTP_REQUEST_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Largest body a buffered `http/request` returns (decoded); larger bodies are refused with
/// `limitExceeded` (stream them with `streamResponse`). The answer is one JSON message held in
/// memory, so it is bounded like `fs/readFile`.
pub const MAX_HTTP_RESPONSE_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Largest body slice in one `http/request/bodyDelta` (decoded). Upstream chunks are passed on as
/// they arrive (an event stream must not wait for more data) and split past this size.
pub const HTTP_BODY_DELTA_BYTES: usize = 256 * 1024;
/// Total deadline of an `http/request` that gives no `timeoutMs`: a buffered one from the start
/// to the last byte of its body, a streamed one until its status and headers arrived (the body
/// then streams while its client is there). An upstream that never answers cannot hold a slot
/// and the memory reserved for its answer longer than this.
pub const HTTP_REQUEST_DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// Largest `timeoutMs` of an `http/request`; a larger one is capped to it (the request still
/// runs). Ten minutes covers a slow download; past it, stream the body or split the request.
pub const HTTP_REQUEST_MAX_TIMEOUT_MS: u64 = 10 * 60 * 1000;
/// `http/request` calls in flight on one connection, buffered or streaming (a stream counts
/// until its last delta). More are refused with `limitExceeded`, not queued.
pub const MAX_HTTP_REQUESTS_PER_CONNECTION: usize = 32;
/// `http/request` calls in flight in the whole server: bounds the sockets and buffers the server
/// holds for clients however many connections they open.
pub const MAX_HTTP_REQUESTS: usize = 256;
/// Longest `requestId`, in bytes.
pub const MAX_HTTP_REQUEST_ID_BYTES: usize = 128;
/// Redirects an `http/request` follows (each hop checked like the first) before failing.
pub const MAX_HTTP_REDIRECTS: usize = 10;
/// Pooled HTTP clients kept, one per (host, checked addresses); the least recently used is
/// dropped first, with its idle connections.
pub const HTTP_CLIENT_CACHE_ENTRIES: usize = 64;
/// Idle pooled connections per host and client.
pub const HTTP_POOL_MAX_IDLE_PER_HOST: usize = 8;
/// How long an idle pooled connection is kept.
pub const HTTP_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long `environment/info` waits for `sandbox-run --explain` to describe the host.
pub const SANDBOX_PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest `limits.wallSeconds` (365 days): anything longer is a mistake, not a bound.
pub const MAX_WALL_SECONDS: u64 = 365 * 24 * 60 * 60;
/// How long a killed tree may take to exit before its cgroup is left behind with a warning
/// (SIGKILL is prompt; a process in uninterruptible I/O may need a moment).
pub const CGROUP_EMPTY_DEADLINE: Duration = Duration::from_secs(5);
/// How often a killed tree's cgroup is checked for being empty.
pub const CGROUP_EMPTY_POLL: Duration = Duration::from_millis(5);
/// Most passes over a new tree's processes that move them into the server's shared CPU group
/// after the start (`containment::Tree::join_cpu_group`); each pass moves what the tree forked
/// before its parents moved, so a tree that is still forking new processes after this many is
/// left partly outside (it is still bounded by its own limits).
pub const CPU_GROUP_JOIN_PASSES: usize = 16;
/// Extra time a sandboxed command's own wall-clock kill (by `sandbox-run`, which drains the
/// sandbox's terminal first) gets before the server kills the tree itself.
pub const WALL_BACKSTOP_GRACE: Duration = Duration::from_secs(2);
/// Shortest pause between two checks of a tree's CPU use against `cpuSeconds` (the next check
/// is when the budget could run out at the earliest, with every CPU busy).
pub const CPU_BUDGET_MIN_CHECK: Duration = Duration::from_millis(50);
/// Rounds of killing the server's orphans at shutdown without a cgroup (each round's kills
/// re-parent their own orphans to the server).
pub const ORPHAN_KILL_ROUNDS: usize = 16;

/// Relay streams one executor serves at once (remote mode); handshakes beyond this are answered
/// with a reset. Their sessions take connection slots of their own, apart from
/// [`MAX_CONNECTIONS`], so harnesses holding every relay stream never lock out a local client.
pub const MAX_RELAY_STREAMS: usize = 256;

/// Why a size option (`--retained-output-bytes`, `--memory-budget`) was refused.
#[derive(Debug, thiserror::Error)]
pub enum SizeOptionError {
    /// Not a number of bytes.
    #[error("{0:?} is not a size (bytes, or a number with K, M or G)")]
    NotASize(String),
    /// Below the least the option can work with.
    #[error("{bytes} bytes is below {what} ({minimum}); give at least that")]
    TooSmall {
        /// The value given.
        bytes: usize,
        /// What the minimum is.
        what: &'static str,
        /// The least accepted.
        minimum: usize,
    },
}

/// A size given as bytes or as a number with K, M or G (powers of 1024), at least `minimum`
/// (`what` names it in the refusal).
///
/// # Errors
/// [`SizeOptionError`].
pub fn parse_size(
    text: &str,
    what: &'static str,
    minimum: usize,
) -> Result<usize, SizeOptionError> {
    let trimmed = text.trim();
    let (digits, unit) = match trimmed.as_bytes().last() {
        Some(b'K' | b'k') => (&trimmed[..trimmed.len() - 1], 1usize << 10),
        Some(b'M' | b'm') => (&trimmed[..trimmed.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&trimmed[..trimmed.len() - 1], 1 << 30),
        _ => (trimmed, 1),
    };
    let bytes = digits
        .parse::<usize>()
        .ok()
        .and_then(|number| number.checked_mul(unit))
        .ok_or_else(|| SizeOptionError::NotASize(text.to_owned()))?;
    if bytes < minimum {
        return Err(SizeOptionError::TooSmall {
            bytes,
            what,
            minimum,
        });
    }
    Ok(bytes)
}

/// The default of `--memory-budget`, as it shows it ([`MEMORY_BUDGET_BYTES`]; a unit test keeps
/// the two equal).
pub const DEFAULT_MEMORY_BUDGET: &str = "1G";

/// `--memory-budget`: at least [`MAX_FRAME_BYTES`], so that one request of the largest size a
/// connection may send can be backed.
///
/// # Errors
/// [`SizeOptionError`].
pub fn parse_memory_budget(text: &str) -> Result<usize, SizeOptionError> {
    parse_size(
        text,
        "the largest message (MAX_FRAME_BYTES)",
        MAX_FRAME_BYTES,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_budget_option_defaults_to_the_constant_and_refuses_less_than_a_message() {
        assert_eq!(
            parse_memory_budget(DEFAULT_MEMORY_BUDGET).unwrap(),
            MEMORY_BUDGET_BYTES
        );
        assert_eq!(parse_memory_budget("256M").unwrap(), 256 << 20);
        assert!(matches!(
            parse_memory_budget("1M"),
            Err(SizeOptionError::TooSmall { .. })
        ));
        assert!(matches!(
            parse_memory_budget("lots"),
            Err(SizeOptionError::NotASize(_))
        ));
    }
}
