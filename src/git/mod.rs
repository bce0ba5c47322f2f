//! Git for sessions, one concern per module. Listed bottom up: each module imports only from
//! those before it in this list (`scripts/check-layers.py` and the import-circle check keep
//! the crate so), and the modules that add operations to [`RepoGit`] call only operations of
//! modules listed before them.
//!
//! - [`record`]: the records that say a checkout is ours, whose it is (a
//!   [`crate::process::Owner`]), and how to save its work; [`list`]: reading worktrees from
//!   git's own files, clones from our records, and the object stores a checkout borrows;
//! - [`layer`]: an Implementor's copy-on-write layer (its parts, its record, what a sandbox
//!   mounts to show it, its removal); [`confine`]: what git asks of the OS sandbox, a layer
//!   above it (a jail for its own git in an agent's clone; whether a layer can be mounted);
//! - [`command`]: the hygiene every git invocation needs, and where it runs ([`command::At`]:
//!   sandboxed in a clone the agent worked in); [`version`]: the git 2.30 minimum;
//! - [`repo`]: the per-repository state shared process-wide ([`RepoGit`]: its lock, the live
//!   checkouts, the small metadata operations, the records of the adapter's clones, their
//!   claim, rollback and removal);
//! - [`setup`] runs the setup command and [`hooks`] the `post-checkout` hook, both bounded and
//!   killable as a process tree;
//! - [`patch`] (+ [`binary`] for non-UTF-8 content): the agent's work as a patch, measured from
//!   the post-setup snapshot (spec "Patch Extraction");
//! - [`layer_patch`]: the patch of a layered checkout read from what its layer changed, the
//!   base verified once for it (its index and `upper/` read by the `layer-diff` crate);
//! - [`prepare`]: a fresh checkout made ready for an agent (identity, hook, setup, snapshot);
//! - [`base`]: the shared per-commit base (checked out once, setup run once, refcounted,
//!   swept) and the layers made over it, where the overlay can be mounted (else the full clone
//!   of [`provision`]);
//! - [`worktree`]: the [`Worktree`] (the checkout) a session holds, its patch and its cleanup;
//! - [`view`]: a Planner's or Reviewer's read-only view of the repository (the default
//!   branch's content and history, no config, no ignored files, no other session's clone),
//!   made, recorded and swept like a clone;
//! - [`sweep`]: removing checkouts this adapter made for sessions that are gone, after saving
//!   their work; it never touches anything else;
//! - [`provision`]: making a session's checkout — a private `git clone --shared` at
//!   `.worktrees/<branch>` (spec "Worktree Management"; why a clone: see its docs) — obeying
//!   the stop signal, and replacing a stale one at that path (its work saved as the sweep
//!   saves it).
//!
//! Everything here works with git 2.30 (Debian 11). napi-free.

pub mod base;
pub(crate) mod binary;
pub mod command;
pub mod confine;
pub(crate) mod hooks;
pub mod interrupted;
pub mod layer;
#[cfg(target_os = "linux")]
pub(crate) mod layer_patch;
#[cfg(not(target_os = "linux"))]
#[path = "layer_patch_off.rs"]
pub(crate) mod layer_patch;
pub(crate) mod list;
pub(crate) mod patch;
pub(crate) mod prepare;
pub mod provision;
pub mod record;
pub mod repo;
pub(crate) mod setup;
pub mod sweep;
pub mod version;
pub mod view;
pub mod worktree;

pub use command::CommandError;
pub use confine::{CloneMounts, Confinement, Confiner};
pub use layer::{Layer, LayerMounts};
pub use patch::Snapshot;
pub use provision::ProvisionRequest;
pub use record::SessionRecord;
pub use repo::{RepoGit, WORKTREES_DIR};
pub use sweep::Swept;
pub use version::{check_git_version, MIN_GIT_VERSION};
pub use view::{RepoView, ViewRequest};
pub use worktree::Worktree;
