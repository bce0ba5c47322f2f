//! Git for Implementor sessions, one concern per module:
//!
//! - [`repo`]: the per-repository state shared process-wide ([`RepoGit`]: its lock, the live
//!   worktrees, the small metadata operations);
//! - [`provision`]: making a session's worktree (spec "Worktree Management"), obeying the stop
//!   signal; [`setup`] runs the setup command and [`hooks`] the `post-checkout` hook, both
//!   bounded and killable as a process tree;
//! - [`worktree`]: the [`Worktree`] a session holds, its patch and its cleanup;
//! - [`patch`] (+ [`binary`] for non-UTF-8 content): the agent's work as a patch, measured from
//!   the post-setup snapshot (spec "Patch Extraction");
//! - [`sweep`]: removing worktrees this adapter made for sessions that are gone, after saving
//!   their work; it never touches anything else;
//! - [`owner`] and [`record`]: the records in a worktree's admin dir that say it is ours, whose
//!   it is, and how to save its work; [`list`]: reading the worktrees from git's own files;
//! - [`command`]: the hygiene every git invocation needs; [`version`]: the git 2.30 minimum.
//!
//! Everything here works with git 2.30 (Debian 11). napi-free.

pub(crate) mod binary;
pub mod command;
pub(crate) mod hooks;
pub(crate) mod list;
pub mod owner;
pub(crate) mod patch;
pub mod provision;
pub mod record;
pub mod repo;
pub(crate) mod setup;
pub mod sweep;
pub mod version;
pub mod worktree;

pub use command::CommandError;
pub use owner::Owner;
pub use provision::ProvisionRequest;
pub use record::SessionRecord;
pub use repo::{RepoGit, WORKTREES_DIR};
pub use sweep::Swept;
pub use version::{check_git_version, MIN_GIT_VERSION};
pub use worktree::Worktree;
