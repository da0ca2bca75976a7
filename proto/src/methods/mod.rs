//! Typed params and results of every method, and the method names.
//!
//! Params use `camelCase` and reject unknown fields, so a misspelt field is an error that names
//! it instead of a silently ignored option.

pub mod fs;
pub mod initialize;
pub mod process;

/// `initialize` (request).
pub const INITIALIZE: &str = "initialize";
/// `initialized` (client notification after the `initialize` response).
pub const INITIALIZED: &str = "initialized";
/// `process/start`.
pub const PROCESS_START: &str = "process/start";
/// `process/read`.
pub const PROCESS_READ: &str = "process/read";
/// `process/write`.
pub const PROCESS_WRITE: &str = "process/write";
/// `process/signal`.
pub const PROCESS_SIGNAL: &str = "process/signal";
/// `process/resize`.
pub const PROCESS_RESIZE: &str = "process/resize";
/// `process/terminate`.
pub const PROCESS_TERMINATE: &str = "process/terminate";
/// `process/output` (server notification).
pub const PROCESS_OUTPUT: &str = "process/output";
/// `process/exited` (server notification).
pub const PROCESS_EXITED: &str = "process/exited";
/// `process/closed` (server notification).
pub const PROCESS_CLOSED: &str = "process/closed";
/// `fs/readFile`.
pub const FS_READ_FILE: &str = "fs/readFile";
/// `fs/writeFile`.
pub const FS_WRITE_FILE: &str = "fs/writeFile";
/// `fs/createDirectory`.
pub const FS_CREATE_DIRECTORY: &str = "fs/createDirectory";
/// `fs/getMetadata`.
pub const FS_GET_METADATA: &str = "fs/getMetadata";
/// `fs/canonicalize`.
pub const FS_CANONICALIZE: &str = "fs/canonicalize";
/// `fs/readDirectory`.
pub const FS_READ_DIRECTORY: &str = "fs/readDirectory";
/// `fs/remove`.
pub const FS_REMOVE: &str = "fs/remove";
/// `fs/copy`.
pub const FS_COPY: &str = "fs/copy";
/// `fs/open`.
pub const FS_OPEN: &str = "fs/open";
/// `fs/readBlock`.
pub const FS_READ_BLOCK: &str = "fs/readBlock";
/// `fs/close`.
pub const FS_CLOSE: &str = "fs/close";

/// An empty result object `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}
