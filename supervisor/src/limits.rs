//! Every limit the server enforces, with its unit and the reason for it. docs/protocol.md names
//! the same constants.

use std::time::Duration;

/// Largest websocket message or frame accepted from a client. Big enough for a 32 MiB
/// `fs/writeFile` in base64 plus envelope; anything larger is refused while its header is read,
/// before the payload is buffered.
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;
/// Largest HTTP upgrade head (request line plus headers) read before the websocket starts.
pub const MAX_UPGRADE_HEAD_BYTES: usize = 16 * 1024;
/// Time a client has to send the whole HTTP head (defeats slowloris connections).
pub const UPGRADE_HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests of one connection handled at once; past this the server stops reading the socket
/// until one completes, so a client that floods requests gets backpressure, not unbounded tasks.
pub const MAX_INFLIGHT_REQUESTS: usize = 128;
/// Outgoing messages queued per connection. A client that does not read stalls process output
/// (and so the child, through its pipe) instead of growing server memory.
pub const OUTBOUND_QUEUE_MESSAGES: usize = 1024;
/// Bytes of serialized messages queued per connection. Together with the count limit above this
/// bounds a non-reading client's cost to the server (about this much plus one message).
pub const OUTBOUND_QUEUE_BYTES: usize = 8 * 1024 * 1024;
/// Simultaneous client connections; more are closed right after accept.
pub const MAX_CONNECTIONS: usize = 1024;
/// Output retained per process for `process/read`; older chunks are dropped first.
pub const OUTPUT_RETENTION_BYTES: usize = 1024 * 1024;
/// Largest read of a child's pipe or PTY in one go (one `process/output` chunk at most). Keep it
/// well below [`OUTPUT_RETENTION_BYTES`]: retention drops whole chunks, so chunks as large as the
/// retention would leave as little as one chunk readable.
pub const OUTPUT_READ_CHUNK_BYTES: usize = 256 * 1024;
/// Pipe buffer requested for a child's stdout/stderr (fewer, larger chunks at high throughput).
pub const CHILD_PIPE_BYTES: i32 = 1024 * 1024;
/// Cap (and default) of `process/read`'s `maxBytes`.
pub const MAX_READ_BYTES: u64 = 8 * 1024 * 1024;
/// Cap of `process/read`'s `waitMs`: a long-poll never holds a request slot longer than this.
pub const MAX_WAIT_MS: u64 = 60_000;
/// Processes (running or retained after exit) one session may hold.
pub const MAX_PROCESSES_PER_SESSION: usize = 2048;
/// Longest `processId`, in bytes.
pub const MAX_PROCESS_ID_BYTES: usize = 128;
/// `writeId`s remembered per process to deduplicate retried writes (the reference server
/// remembers as many, so a client retrying within its window sees the same behaviour).
pub const WRITE_ID_MEMORY: usize = 4096;
/// Denial records kept per audited process (`auditDenials`) for `process/read`.
pub const MAX_DENIALS_RETAINED: usize = 1024;
/// Longest denial record line accepted from `sandbox-run --audit-fd`.
pub const MAX_DENIAL_RECORD_BYTES: usize = 64 * 1024;
/// How long `process/terminate` waits after SIGTERM before SIGKILL.
pub const TERMINATE_GRACE: Duration = Duration::from_secs(2);
/// How long a process stays readable after `process/closed`.
pub const CLOSED_PROCESS_RETENTION: Duration = Duration::from_secs(30);
/// How long a detached session (its connection lost) keeps its processes for a resume.
pub const DETACHED_SESSION_TTL: Duration = Duration::from_secs(30);
/// Largest `fs/readBlock` (1 MiB).
pub use fs_helper::READ_BLOCK_MAX_BYTES;
/// Largest file `fs/readFile` returns (32 MiB); larger files are read with `fs/open` +
/// `fs/readBlock`. Defined by the fs-helper library, which enforces it.
pub use fs_helper::READ_FILE_MAX_BYTES;
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
/// Extra time a sandboxed command's own wall-clock kill (by `sandbox-run`, which drains the
/// sandbox's terminal first) gets before the server kills the tree itself.
pub const WALL_BACKSTOP_GRACE: Duration = Duration::from_secs(2);
/// Shortest pause between two checks of a tree's CPU use against `cpuSeconds` (the next check
/// is when the budget could run out at the earliest, with every CPU busy).
pub const CPU_BUDGET_MIN_CHECK: Duration = Duration::from_millis(50);
/// Rounds of killing the server's orphans at shutdown without a cgroup (each round's kills
/// re-parent their own orphans to the server).
pub const ORPHAN_KILL_ROUNDS: usize = 16;
