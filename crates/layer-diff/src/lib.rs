//! What a copy-on-write layer over a git checkout changed, read without git: the candidates of
//! a layered session's end (issue 37). The engine's local layers (`src/git/layer_patch.rs`) and
//! the in-pod agent (`cra-pod candidates`, a static binary) read them with this one copy, so
//! both backends decide alike what a limited `git add -A` must stage.
//!
//! Everything here reads what the agent wrote: every length is checked, no symlink is
//! followed, and anything not read exactly as git or overlayfs would is `None`, after which the
//! caller stages the whole checkout.

pub mod index_file;
#[cfg(target_os = "linux")]
pub mod upper;
