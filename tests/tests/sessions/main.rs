//! A session's lifetime through the wire: how it survives disconnects (`resume`) and what it may
//! hold (`limits`). One binary, because each has a case that waits out a real 30 s default (the
//! session TTL, the closed-process retention): here they run at once, not one after the other.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod limits;
mod resume;
