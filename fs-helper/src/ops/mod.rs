//! The operations, one file per concern. Each public function documents its errors.

pub mod directory;
pub mod metadata;
pub mod read;
pub mod write;
