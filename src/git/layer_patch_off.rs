//! Off Linux there are no copy-on-write layers (overlayfs, user namespaces: the sandbox says
//! so and sessions get full clones), so nothing is ever read from a layer: the same interface
//! as [`super::layer_patch`], proving nothing, so every extraction takes the full path.

use super::command::At;
use super::layer::Layer;
use super::patch::Snapshot;
use crate::error::Result;

/// Never made off Linux.
pub(crate) struct Verified;

pub(crate) async fn verify(
    _at: At<'_>,
    _layer: &Layer,
    _commit: &str,
    _snapshot: &Snapshot,
) -> Option<Verified> {
    None
}

pub(crate) async fn patch_from_layer(
    _at: At<'_>,
    _layer: &Layer,
    _verified: &Verified,
    _base: &str,
    _snapshot: &Snapshot,
    _trust_before: u64,
) -> Result<Option<String>> {
    Ok(None)
}
