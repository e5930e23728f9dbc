//! Tar streams into and out of the container (SPEC §6).
//!
//! Files cross the container boundary only as tar streams, and neither direction holds a
//! tree, or even one whole file, in memory. The tar that goes in is written here from a
//! host directory straight into a pipe ([`pack_dir_to`]), hashing each file on the way into
//! a [`Manifest`] of what went in. The tar that comes out is hostile — a model with root in
//! the container may plant anything — so every entry is checked as it streams past: sizes
//! are refused on the header before any data is read, and contents go where they belong at
//! once: into a fresh directory ([`extract`], [`replace_dir_from`]), or, compared with the
//! baseline, into a [`ChangeSet`] that keeps only changed contents (small ones in memory,
//! larger ones spooled to temporary files). A single bad entry refuses the whole operation.
//!
//! The change set follows the repository's ignore rules the way `git add -A` does: paths
//! the `.gitignore` files ignore (and `.git` itself) are skipped while streaming, neither
//! kept nor held to the size limits, unless the baseline had them (a tracked file stays
//! tracked). The rules are the container's own `.gitignore` files, evaluated by libgit2 —
//! the library that commits the result — on a scratch repository holding copies of them.
//!
//! One file per layer, each naming only the ones before it: [`limits`] (the limits and
//! helpers all share), [`names`] (the checks of entry names and symlink targets),
//! [`manifest`] (the baseline), [`tip`] (the pack of a tip-only `.git`), [`treecheck`] (the
//! rules a git tree keeps), [`pack`] (host directory or git tree → tar), [`delta`] (the tar
//! that brings a tip-only checkout to a newer tip), [`bounded`] (the byte-level bounds of a
//! hostile tar), [`contents`] (changed file data, in memory or spooled), [`disk`] (where a
//! path under a host directory may be written), [`ignore`] (the `.gitignore` rules met on
//! the way), [`untrusted`] (the reader that checks every entry of a hostile tar),
//! [`changes`] (the change-set diff against the manifest) and [`write`] (trees and change
//! sets onto the host disk). This file only declares them.

mod bounded;
mod changes;
mod contents;
mod delta;
mod disk;
mod ignore;
mod limits;
mod manifest;
mod names;
mod pack;
#[cfg(test)]
mod testutil;
mod tip;
mod treecheck;
mod untrusted;
mod write;

pub use bounded::{untrusted_archive, Bounded};
pub use changes::{
    change_set, change_set_from, change_set_from_snapshot, Change, ChangeKind, ChangeSet, NewEntry,
};
pub use contents::Contents;
pub use delta::{plan_tip_delta, TipDelta};
pub use limits::{human, ArchiveLimits, Open, STREAM_HEADROOM};
pub use manifest::{Manifest, ManifestEntry};
pub use pack::{
    pack_checkout_to, pack_dir, pack_dir_to, pack_file, pack_files, pack_over_to, pack_tip_to,
    PackSource, Skipped,
};
pub use untrusted::memory_opener;
pub use write::{extract, replace_dir, replace_dir_from, Exported};
