//! Git for sessions, one concern per module:
//!
//! - [`repo`]: the per-repository state shared process-wide ([`RepoGit`]: its lock, the live
//!   checkouts, the small metadata operations, the records of the adapter's clones);
//! - [`provision`]: making a session's checkout — a private `git clone --shared` at
//!   `.worktrees/<branch>` (spec "Worktree Management"; why a clone: see its docs) — obeying
//!   the stop signal, and replacing a stale one at that path; [`setup`] runs the setup command
//!   and [`hooks`] the `post-checkout` hook, both bounded and killable as a process tree;
//! - [`worktree`]: the [`Worktree`] (the checkout) a session holds, its patch and its cleanup;
//! - [`patch`] (+ [`binary`] for non-UTF-8 content): the agent's work as a patch, measured from
//!   the post-setup snapshot (spec "Patch Extraction"); in a clone the agent worked in, its git
//!   runs sandboxed ([`command::At`]);
//! - [`sweep`]: removing checkouts this adapter made for sessions that are gone, after saving
//!   their work; it never touches anything else;
//! - [`record`]: the records that say a checkout is ours, whose it is (a
//!   [`crate::process::Owner`]), and how to save its work; [`list`]: reading worktrees from
//!   git's own files and clones from our records;
//! - [`base`]: the shared per-commit base (checked out once, setup run once, refcounted,
//!   swept) and an Implementor's copy-on-write layer over it, where the overlay can be
//!   mounted (else the full clone of [`provision`]);
//! - [`view`]: a Planner's or Reviewer's read-only view of the repository (the default
//!   branch's content and history, no config, no ignored files, no other session's clone),
//!   made, recorded and swept like a clone;
//! - [`command`]: the hygiene every git invocation needs; [`version`]: the git 2.30 minimum.
//!
//! Everything here works with git 2.30 (Debian 11). napi-free.

pub mod base;
pub(crate) mod binary;
pub mod command;
pub(crate) mod hooks;
pub(crate) mod list;
pub(crate) mod patch;
pub mod provision;
pub mod record;
pub mod repo;
pub(crate) mod setup;
pub mod sweep;
pub mod version;
pub mod view;
pub mod worktree;

pub use command::CommandError;
pub use patch::Snapshot;
pub use provision::ProvisionRequest;
pub use record::SessionRecord;
pub use repo::{RepoGit, WORKTREES_DIR};
pub use sweep::Swept;
pub use version::{check_git_version, MIN_GIT_VERSION};
pub use view::{RepoView, ViewRequest};
pub use worktree::Worktree;
