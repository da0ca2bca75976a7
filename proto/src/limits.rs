//! Protocol limits both ends rely on: the server enforces them, the client sizes its requests
//! by them. Each with its unit and the reason for it; `docs/protocol.md`'s limits table names
//! the same constants. The server's other limits are in the supervisor's `limits` module (which
//! re-exports these).

/// Largest read of a child's pipe or PTY in one go, so the largest single `process/output`
/// chunk (before base64), in bytes (256 KiB). Kept well below the server's per-process output
/// retention (`OUTPUT_RETENTION_BYTES`, 1 MiB): retention drops whole chunks, so chunks as large
/// as the retention would leave as little as one chunk readable.
pub const OUTPUT_READ_CHUNK_BYTES: usize = 256 * 1024;
/// Cap (and default) of `process/read`'s `maxBytes`, in bytes (8 MiB): bounds one response.
pub const MAX_READ_BYTES: u64 = 8 * 1024 * 1024;
/// Largest file `fs/readFile` returns, in bytes (32 MiB).
///
/// A whole-file read is held in memory and sent base64-encoded in one JSON-RPC message (a third
/// larger again), so it must stay bounded; larger files are read with `fs/open` + `fs/readBlock`.
pub const READ_FILE_MAX_BYTES: u64 = 32 * 1024 * 1024;
/// Largest block `fs/readBlock` returns in one call, in bytes (1 MiB).
///
/// One block is one JSON-RPC response; this bounds the memory a single request can pin and keeps
/// a block small enough not to stall other traffic on the same connection.
pub const READ_BLOCK_MAX_BYTES: usize = 1024 * 1024;
/// Entries one `fs/readDirectory` answer holds at most (100,000). A larger directory is answered
/// with its first entries by name and `truncated: true`; list it in parts with `fs/walk` or
/// a process. The listing keeps only this many names while it reads, whatever the directory
/// holds.
pub const READ_DIRECTORY_MAX_ENTRIES: usize = 100_000;
/// Bytes of one `fs/readDirectory` answer's entries as JSON text (8 MiB). Each entry carries its
/// full path, so a long directory path or long names make an answer of hundreds of MiB well
/// within [`READ_DIRECTORY_MAX_ENTRIES`] (103 MiB was seen); past this the answer is cut there
/// with `truncated: true`, as past the entry cap.
pub const READ_DIRECTORY_MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;
