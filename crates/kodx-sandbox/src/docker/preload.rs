//! Preloaded warm sandboxes (issue 43): a warm sandbox ([`super::warm`]) that already holds
//! one repository's checkout, copied in from its ready checkout ([`crate::ready`]) while no
//! run waited, with the manifest of what it holds. A run of that repository takes it
//! before an empty one:
//!
//! It is made by [`super::Engine::make_preloaded`] (in `provision`).
//!
//! - at the tip it holds, nothing is copied in;
//! - at another tip whose commit the clone has, only the difference goes in: what the
//!   newer tree lacks is removed, then a tar of what changed ([`crate::archive::plan_tip_delta`]);
//! - further away (more than [`MAX_DELTA_CHANGES`] entries or half the tree differ, or a
//!   commit the clone lacks), the workspace is emptied and the whole checkout goes in as
//!   into a new sandbox, its ready checkout read or kept, so the next preloaded sandbox
//!   holds the newer tip; over a cached setup image's checkout (whose setup results stay),
//!   the tree is packed over it (what it has the same stays out) as on a setup cache hit.
//!
//! A preloaded sandbox is tied to exactly one [`PreloadKey`]: the server's key (the
//! installation and the repository, [`super::SandboxSpec::preload`]) and the setup cache
//! key of the image it was made from. A run with another key, or none (a checks' sandbox,
//! `kodx run`), never takes it.

use std::sync::Arc;

use super::spec::Shape;
use crate::archive::Manifest;
use crate::ready::{ReadyKey, ReadyRepo};

/// Most entries a newer tip may differ by for its difference alone to go in.
pub const MAX_DELTA_CHANGES: usize = 5_000;
/// Most entries of a checkout kept preloaded: kodx holds its manifest in memory while the
/// sandbox waits (~150 bytes an entry, so 15 MB at most); a larger repository's runs take
/// an empty warm sandbox.
pub const MAX_PRELOADED_ENTRIES: usize = 100_000;

/// Which runs may take a preloaded sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PreloadKey {
    /// The server's part: one repository of one installation.
    pub repo: String,
    /// The setup cache key of the image the sandbox was made from, if it came from one.
    pub setup: Option<String>,
}

/// A repository's ready checkout: what a preloaded sandbox is made from.
#[derive(Debug, Clone)]
pub struct PreloadSource {
    pub(super) ready: ReadyRepo,
    pub(super) key: ReadyKey,
}

impl PreloadSource {
    /// The commit the checkout holds.
    pub fn commit(&self) -> &str {
        self.key.commit()
    }
}

/// A run's wish, once its sandbox started: a warm sandbox of its shape holding its
/// repository's checkout for the next run with its key.
#[derive(Debug, Clone)]
pub struct PreloadWant {
    pub key: PreloadKey,
    pub shape: Shape,
    pub source: PreloadSource,
    /// The shape's image is a cached setup image (its workspace holds an older checkout,
    /// and setup's results).
    pub(super) cached: bool,
}

/// How a run's copy-in used the preloaded sandbox it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreloadUse {
    /// It held the run's tip: nothing was copied.
    SameTip,
    /// Only the difference from its tip went in.
    Difference,
    /// Too far from its tip: the workspace was emptied and the whole checkout copied in.
    Whole,
    /// Too far from its tip, from a cached setup image: the tree was packed over its
    /// checkout (what it had the same stayed out).
    PackedOver,
}

impl PreloadUse {
    pub fn as_str(self) -> &'static str {
        match self {
            PreloadUse::SameTip => "same_tip",
            PreloadUse::Difference => "difference",
            PreloadUse::Whole => "whole",
            PreloadUse::PackedOver => "packed_over",
        }
    }
}

/// What a preloaded sandbox holds.
#[derive(Debug, Clone)]
pub(super) struct Preloaded {
    pub(super) key: PreloadKey,
    pub(super) source: PreloadSource,
    pub(super) manifest: Arc<Manifest>,
    /// The copy-in's marker follows the whole checkout and nothing ran since: the change
    /// set can come from a snapshot ([`super::snapshot`]).
    pub(super) snapshot_ready: bool,
}
