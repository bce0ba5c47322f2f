//! Start-param validation, before anything is provisioned or fetched. Every failure is
//! `ERR_INVALID_PARAMS` and names the field (`workItemID`, `specPaths[2]`, …) as the engine
//! spells it.

use std::path::{Component, Path};

use crate::domain::StartParams;
use crate::error::{AdapterError, Result};

pub fn validate_start_params(params: &StartParams, repo_root: &Path) -> Result<()> {
    match params {
        StartParams::Planner { spec_paths } => {
            for (i, path) in spec_paths.iter().enumerate() {
                validate_spec_path(&format!("specPaths[{i}]"), path, repo_root)?;
            }
            Ok(())
        }
        StartParams::Implementor {
            work_item_id,
            branch_name,
        } => {
            require_id("workItemID", work_item_id)?;
            validate_branch_name("branchName", branch_name)
        }
        StartParams::Reviewer {
            work_item_id,
            revision_id,
        } => {
            require_id("workItemID", work_item_id)?;
            require_id("revisionID", revision_id)
        }
    }
}

/// Blank (whitespace-only) ids count as empty: no provider has such an id, and the error
/// is clearer here than as a failed fetch later.
fn require_id(field: &str, value: &str) -> Result<()> {
    if value.trim().is_empty() {
        return Err(AdapterError::invalid_params(format!("{field} is empty")));
    }
    Ok(())
}

/// A spec path must name a file inside the repository: relative, no `..`, and — when it
/// exists — not reached through a symlink that leads outside.
pub fn validate_spec_path(field: &str, path: &str, repo_root: &Path) -> Result<()> {
    let bad = |why: &str| {
        Err(AdapterError::invalid_params(format!(
            "{field} {path:?} {why}"
        )))
    };
    if path.trim().is_empty() {
        return Err(AdapterError::invalid_params(format!("{field} is empty")));
    }
    if path.contains('\0') {
        return bad("contains a NUL character");
    }
    let p = Path::new(path);
    if p.is_absolute() || path.starts_with('/') || path.starts_with('\\') {
        return bad("is absolute; spec paths are relative to repoRoot");
    }
    for component in p.components() {
        match component {
            Component::ParentDir => return bad("escapes repoRoot (contains '..')"),
            Component::Prefix(_) | Component::RootDir => {
                return bad("is absolute; spec paths are relative to repoRoot")
            }
            Component::CurDir | Component::Normal(_) => {}
        }
    }
    let joined = repo_root.join(p);
    // Only an existing path can be resolved; a missing one is reported by context assembly.
    if let (Ok(real_root), Ok(real_path)) = (repo_root.canonicalize(), joined.canonicalize()) {
        if !real_path.starts_with(&real_root) {
            return bad(&format!(
                "escapes repoRoot through a symlink (resolves to {})",
                real_path.display()
            ));
        }
    }
    Ok(())
}

/// The rules of `git check-ref-format --branch`, plus what keeps `.worktrees/<branchName>`
/// inside `.worktrees/` (an absolute name or a `..`/dot component is already refused by git's
/// rules; they are checked first so the message says why).
pub fn validate_branch_name(field: &str, name: &str) -> Result<()> {
    match branch_name_problem(name) {
        Some(why) => Err(AdapterError::invalid_params(format!(
            "{field} {name:?} is not a valid branch name: {why}"
        ))),
        None => Ok(()),
    }
}

fn branch_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("it is empty");
    }
    if name.starts_with('/') {
        return Some("it starts with '/' (an absolute path would leave .worktrees/)");
    }
    if name.contains("..") {
        return Some("it contains '..'");
    }
    if name.starts_with('-') {
        return Some("it starts with '-'");
    }
    if name == "@" {
        return Some("it is '@'");
    }
    if name == "HEAD" {
        return Some("'HEAD' is reserved");
    }
    if name.contains("@{") {
        return Some("it contains '@{'");
    }
    if name.chars().any(|c| (c as u32) < 0x20 || c == '\u{7f}') {
        return Some("it contains a control character");
    }
    if name.contains(' ') {
        return Some("it contains a space");
    }
    if name.contains(['~', '^', ':', '?', '*', '[', '\\']) {
        return Some("it contains one of ~ ^ : ? * [ \\");
    }
    if name.ends_with('/') {
        return Some("it ends with '/'");
    }
    if name.contains("//") {
        return Some("it contains '//'");
    }
    if name.ends_with('.') {
        return Some("it ends with '.'");
    }
    for component in name.split('/') {
        if component.starts_with('.') {
            return Some("a '/'-separated component starts with '.'");
        }
        if component.ends_with(".lock") {
            return Some("a '/'-separated component ends with '.lock'");
        }
    }
    None
}
