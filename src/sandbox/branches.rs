//! Branches an Implementor's agent made in its worktree (`git checkout -b x`, `git switch -c
//! x`, `git branch x` at a commit it made) are removed at cleanup: the patch carries the work,
//! and the repository keeps only what the engine and the adapter made.
//!
//! A branch counts as the agent's when it did not exist when the session started, no other
//! worktree has it checked out, and this worktree's own HEAD reflog shows it: as the target of
//! a checkout, or its tip as a commit HEAD reached during the session. A branch somebody else
//! makes in the repository meanwhile matches none of that and is left alone.
//! Call [`BranchSnapshot::remove_agent_branches`] before the worktree (and its admin dir, which
//! holds that reflog) is removed.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::process::Command;

use crate::error::{AdapterError, ErrorCode, Result};

use super::settings::WorktreeGit;

const GIT_TIMEOUT: Duration = Duration::from_secs(60);

/// The repository's branches when the session started.
#[derive(Debug, Clone)]
pub struct BranchSnapshot {
    repo: PathBuf,
    before: HashSet<String>,
    taken_secs: u64,
}

impl BranchSnapshot {
    pub async fn take(repo: &Path) -> Result<BranchSnapshot> {
        let taken_secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let before = branches(repo).await?.into_keys().collect();
        Ok(BranchSnapshot {
            repo: repo.to_path_buf(),
            before,
            taken_secs,
        })
    }

    /// Deletes the agent's branches (see the module doc); returns their names.
    pub async fn remove_agent_branches(&self, wt: &WorktreeGit) -> Result<Vec<String>> {
        let now = branches(&self.repo).await?;
        let elsewhere = checked_out_elsewhere(&self.repo, &wt.admin_dir).await?;
        let (targets, tips) = self.reflog_evidence(&wt.admin_dir);
        let mut removed = Vec::new();
        for (name, oid) in now {
            let agents = !self.before.contains(&name)
                && name != wt.branch
                && !elsewhere.contains(&name)
                && (targets.contains(&name) || tips.contains(&oid));
            if agents {
                git(
                    &self.repo,
                    &["update-ref", "-d", &format!("refs/heads/{name}"), &oid],
                )
                .await?;
                removed.push(name);
            }
        }
        Ok(removed)
    }

    /// From `<admin>/logs/HEAD`: branches checked out, and commits HEAD reached since the
    /// snapshot.
    fn reflog_evidence(&self, admin_dir: &Path) -> (HashSet<String>, HashSet<String>) {
        let log = std::fs::read_to_string(admin_dir.join("logs/HEAD")).unwrap_or_default();
        let (mut targets, mut tips) = (HashSet::new(), HashSet::new());
        for line in log.lines() {
            let Some((meta, msg)) = line.split_once('\t') else {
                continue;
            };
            if let Some(rest) = msg.strip_prefix("checkout: moving from ") {
                if let Some((_, to)) = rest.rsplit_once(" to ") {
                    targets.insert(to.to_string());
                }
            }
            let fields: Vec<&str> = meta.split(' ').collect();
            let ts = fields
                .len()
                .checked_sub(2)
                .and_then(|i| fields[i].parse::<u64>().ok());
            if ts.is_some_and(|t| t >= self.taken_secs) {
                if let Some(new) = fields.get(1) {
                    tips.insert(new.to_string());
                }
            }
        }
        (targets, tips)
    }
}

async fn git(repo: &Path, args: &[&str]) -> Result<String> {
    let fail = |why: String| AdapterError::new(ErrorCode::Provision, why);
    let out = tokio::time::timeout(
        GIT_TIMEOUT,
        Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| fail(format!("git {} timed out", args.join(" "))))?
    .map_err(|e| fail(format!("cannot run git {}", args.join(" "))).with_cause(e))?;
    if !out.status.success() {
        return Err(fail(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Branch name → tip.
async fn branches(repo: &Path) -> Result<HashMap<String, String>> {
    let out = git(
        repo,
        &[
            "for-each-ref",
            "--format=%(refname:strip=2) %(objectname)",
            "refs/heads",
        ],
    )
    .await?;
    Ok(out
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(n, o)| (n.to_string(), o.to_string()))
        .collect())
}

/// Branches checked out in any worktree other than the one whose admin dir is `admin_dir`.
async fn checked_out_elsewhere(repo: &Path, admin_dir: &Path) -> Result<HashSet<String>> {
    let ours = std::fs::read_to_string(admin_dir.join("gitdir"))
        .ok()
        .map(|g| PathBuf::from(g.trim()).parent().map(Path::to_path_buf));
    let out = git(repo, &["worktree", "list", "--porcelain"]).await?;
    let mut set = HashSet::new();
    for block in out.split("\n\n") {
        let path = block.lines().find_map(|l| l.strip_prefix("worktree "));
        let branch = block
            .lines()
            .find_map(|l| l.strip_prefix("branch refs/heads/"));
        if let (Some(p), Some(b)) = (path, branch) {
            let is_ours = ours.as_ref().and_then(|o| o.as_ref()).is_some_and(|o| {
                o == Path::new(p) || o.canonicalize().ok() == Path::new(p).canonicalize().ok()
            });
            if !is_ours {
                set.insert(b.to_string());
            }
        }
    }
    Ok(set)
}
