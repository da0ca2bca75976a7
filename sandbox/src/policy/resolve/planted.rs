//! Symlinks a sandboxed command could have planted: a path a start names (working directory,
//! writable root, read or deny entry) that passes one is refused, never followed.
//!
//! "Could have planted" covers the directories the policy being resolved makes writable and
//! those earlier sandboxes could write ([`PlantableDirs`], kept by a server across its starts):
//! a workspace-write command at `cwd = ws` that replaces `ws/task` with a symlink to `/elsewhere`
//! must not make the next start at `cwd = ws/task` a sandbox that writes `/elsewhere`, although
//! `ws` itself is not writable under that next policy.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use crate::policy::{Access, PolicyError, ResolvedPolicy};

/// Most writable roots a [`PlantableDirs`] keeps apart. Past it, the roots are replaced by their
/// parent directories (a wider set: more symlinks refused, never fewer), so a client that names
/// ever new roots costs bounded memory and no protection.
pub const MAX_PLANTABLE_ROOTS: usize = 4096;

/// Host directories (canonical) in which some sandbox already started could create entries:
/// the writable roots of every restricted policy recorded, except the private `/tmp` and
/// `$TMPDIR` layers each command gets. Only roots not inside another root are kept.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlantableDirs {
    roots: BTreeSet<PathBuf>,
}

impl PlantableDirs {
    /// Records the directories a sandbox under `policy` can write. An unrestricted policy is
    /// no sandbox and records nothing (what it plants is the user's own doing).
    pub fn record(&mut self, policy: &ResolvedPolicy) {
        for root in policy.plantable_roots() {
            self.insert(root);
        }
        while self.roots.len() > MAX_PLANTABLE_ROOTS {
            let wider: Vec<PathBuf> = self
                .roots
                .iter()
                .map(|root| root.parent().unwrap_or(root).to_owned())
                .collect();
            self.roots.clear();
            for root in wider {
                self.insert(root);
            }
        }
    }

    fn insert(&mut self, root: PathBuf) {
        if self.contains(&root) {
            return;
        }
        self.roots.retain(|kept| !kept.starts_with(&root));
        self.roots.insert(root);
    }

    /// Whether `dir` is at or below a recorded root.
    pub fn contains(&self, dir: &Path) -> bool {
        dir.ancestors()
            .any(|ancestor| self.roots.contains(ancestor))
    }

    /// The recorded roots, sorted.
    pub fn roots(&self) -> impl Iterator<Item = &Path> {
        self.roots.iter().map(PathBuf::as_path)
    }
}

impl ResolvedPolicy {
    /// Refuses `named` when the way to it passes a symlink in a directory a sandbox under this
    /// policy can write: an earlier command could have planted it to redirect this root, cwd or
    /// rule (`workspace/link -> /etc`). Symlinks the sandbox cannot have made (system ones like
    /// `/lib -> usr/lib`, a user's own in the host's `/tmp`, which every sandbox sees a private
    /// copy of) are followed.
    ///
    /// # Errors
    /// [`PolicyError::PlantedSymlink`] naming the path and the link.
    pub fn refuse_planted_symlink(&self, named: &Path) -> Result<(), PolicyError> {
        self.refuse_planted_symlink_after(named, &PlantableDirs::default())
    }

    /// [`Self::refuse_planted_symlink`], also refusing a symlink in a directory an earlier
    /// sandbox could write (`earlier`).
    ///
    /// # Errors
    /// [`PolicyError::PlantedSymlink`] naming the path and the link.
    pub fn refuse_planted_symlink_after(
        &self,
        named: &Path,
        earlier: &PlantableDirs,
    ) -> Result<(), PolicyError> {
        let mut at = PathBuf::from("/");
        for component in named.components() {
            let Component::Normal(part) = component else {
                continue;
            };
            let candidate = at.join(part);
            let Ok(meta) = candidate.symlink_metadata() else {
                return Ok(());
            };
            if meta.file_type().is_symlink() {
                if self.sandbox_can_plant_in(&at) || earlier.contains(&at) {
                    return Err(PolicyError::PlantedSymlink {
                        path: named.to_owned(),
                        link: candidate,
                    });
                }
                at = std::fs::canonicalize(&candidate).unwrap_or(candidate);
            } else {
                at = candidate;
            }
        }
        Ok(())
    }

    /// The host directories a sandbox under this policy can create entries in: its writable
    /// roots but the private `/tmp`/`$TMPDIR` layers, writable roots inside those layers
    /// included (they are host directories carried in, kept as rules of their own by
    /// normalisation; a working directory carried in writable becomes one through
    /// [`Self::with_working_directory`]); none when the filesystem is unrestricted.
    pub fn plantable_roots(&self) -> Vec<PathBuf> {
        self.rules()
            .iter()
            .filter(|rule| rule.access == Access::Write && !self.is_private_layer(&rule.path))
            .map(|rule| rule.path.clone())
            .collect()
    }

    fn is_private_layer(&self, root: &Path) -> bool {
        self.private_layers().iter().any(|layer| layer == root)
    }

    /// Whether a sandbox under this policy can create entries in the host directory `dir`:
    /// writable, and not only through the private `/tmp`/`$TMPDIR` every command gets.
    fn sandbox_can_plant_in(&self, dir: &Path) -> bool {
        let rules = self.rules();
        let covering = rules
            .iter()
            .filter(|rule| dir.starts_with(&rule.path))
            .max_by_key(|rule| (rule.path.components().count(), rule.access));
        match covering {
            Some(rule) if rule.access == Access::Write => !self.is_private_layer(&rule.path),
            Some(_) => false,
            None => !self.restricts_filesystem(),
        }
    }
}
