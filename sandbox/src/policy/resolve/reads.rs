//! Resolution for a sandbox that only reads (the `fs/*` requests that read): the same reads,
//! without the search of the writable roots that only narrows writes.

use super::{ResolveContext, SandboxSpec};
use crate::policy::{Access, FilesystemPolicy, PolicyError, ResolvedPolicy};

/// A policy resolved for reading only, before it is [finished](Self::finish).
///
/// The writable roots were not searched for protected names (`.git`, `.agents`, `.codex`; up
/// to `PROTECTED_SCAN_MAX_ENTRIES` entries per root, milliseconds in a large workspace): their
/// rules only keep those names read-only inside writable roots. So the policy is only ever had through [`Self::finish`], which makes every
/// rule that lets write let read instead: nothing is writable, and every read is granted or
/// refused exactly as the full resolution would.
#[derive(Debug)]
pub struct ReadsOnly(ResolvedPolicy);

impl SandboxSpec {
    /// [`Self::resolve_with`] for a sandbox that will only read: see [`ReadsOnly`].
    ///
    /// # Errors
    /// As [`Self::resolve_with`].
    pub fn resolve_reads_with(&self, ctx: &ResolveContext) -> Result<ReadsOnly, PolicyError> {
        self.resolve_scanning(ctx, false).map(ReadsOnly)
    }
}

impl ReadsOnly {
    /// Whether the policy restricts nothing (then there is no sandbox to read in).
    pub fn is_unrestricted(&self) -> bool {
        self.0.is_unrestricted()
    }

    /// Narrows the policy further (another server's secrets, ...) before it is finished.
    ///
    /// # Errors
    /// `narrow`'s.
    pub fn narrow<E>(
        self,
        narrow: impl FnOnce(ResolvedPolicy) -> Result<ResolvedPolicy, E>,
    ) -> Result<Self, E> {
        narrow(self.0).map(Self)
    }

    /// The policy, with every rule that lets write letting read instead. Every rule keeps its
    /// path (none is merged into its parent), so what a layout carries into a private
    /// directory stays carried in. An unrestricted filesystem stays unrestricted (its policy
    /// restricts the network only, and nothing was searched).
    pub fn finish(self) -> ResolvedPolicy {
        let mut policy = self.0;
        if let FilesystemPolicy::Restricted { rules } = &mut policy.filesystem {
            for rule in rules.iter_mut().filter(|rule| rule.access == Access::Write) {
                rule.access = Access::Read;
            }
        }
        policy
    }
}
