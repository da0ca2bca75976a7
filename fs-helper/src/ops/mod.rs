//! The operations, one file per concern. Each public function documents its errors.

pub mod read;
pub mod write;
