//! The operations, one file per concern. Each public function documents its errors.
//!
//! Writing operations (`write_file`, `create_directory`, `remove`, `copy`) reach their paths
//! through [`crate::dirfd`]: the named path's parent is resolved once, following symlinks, and
//! everything below it is worked by descriptor without following any symlink.

pub mod copy;
pub mod directory;
pub mod metadata;
pub mod read;
pub mod remove;
pub mod walk;
pub mod write;

/// Deepest directory level below the named path that a recursive `fs/copy` or `fs/remove`
/// descends to, and the default and largest `maxDepth` of `fs/walk`.
///
/// The walk holds one descriptor per level (two for a copy) and one stack frame per level;
/// bounding it keeps a hostile tree (thousands of nested directories made by a sandboxed
/// command) from exhausting either. Real trees stay far below it.
pub const MAX_TREE_DEPTH: usize = 256;
