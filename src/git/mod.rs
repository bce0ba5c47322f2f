//! Git for Implementor sessions: worktree provisioning and cleanup ([`worktree`]), patch
//! extraction ([`patch`]), the owner records that let a sweep tell live worktrees from stale
//! ones ([`owner`]), and the hygiene every git invocation needs ([`command`]). napi-free.

pub mod command;
pub mod owner;
pub mod patch;
pub mod worktree;

pub use command::CommandError;
pub use owner::Owner;
pub use patch::extract_patch;
pub use worktree::{RepoGit, Worktree};
