//! The `sandbox` block of the CLI's `--settings`, per session. Keys as documented by Claude
//! Code ("Sandboxing", "Settings") and verified on the pinned 2.1.330 binary (README, "Security
//! model", lists each one and why).
//!
//! Filesystem, as the CLI's sandbox behaves (observed): commands can write their cwd and the
//! per-user temp dir (`$TMPDIR`, `/tmp/claude-<uid>`); when cwd is a linked worktree the CLI
//! also makes the repository's whole common git dir writable (hooks and config excepted) so that
//! git works. `denyWrite` wins over `allowWrite` for everything below it (read-only recursive
//! bind mounts), and a denied existing file can be neither written, replaced nor deleted
//! ("Device or resource busy"). A denied path that does not exist is mounted unreadable, which
//! breaks git when it is a ref or `packed-refs`, so only existing paths are denied.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::config::SandboxConfig;

/// What an Implementor's git needs writable and what must stay untouched around it.
#[derive(Debug, Clone)]
pub struct WorktreeGit {
    /// `<repo>/.git`, shared by every worktree.
    pub common_dir: PathBuf,
    /// `<common>/worktrees/<name>`: this worktree's HEAD, index and reflog.
    pub admin_dir: PathBuf,
    /// The session's branch (without `refs/heads/`).
    pub branch: String,
}

/// Where the session's commands run and what they may change.
#[derive(Debug, Clone)]
pub struct SessionScope {
    pub cwd: PathBuf,
    /// `Some` for an Implementor (writes its worktree and commits on its branch); `None` for a
    /// Planner or Reviewer, whose commands write nothing in the repository.
    pub git: Option<WorktreeGit>,
}

/// Credential stores under the home directory that agent commands may not read.
pub const HOME_CREDENTIALS: &[&str] = &[
    ".ssh",
    ".aws",
    ".azure",
    ".gnupg",
    ".kube",
    ".docker/config.json",
    ".config/gcloud",
    ".config/gh",
    ".config/hub",
    ".config/git/credentials",
    ".git-credentials",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".claude/.credentials.json",
];

/// True for names that carry secrets by convention; such variables are unset for agent
/// commands (the CLI itself keeps them, e.g. the model API key).
pub fn is_credential_var(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    const MARKERS: &[&str] = &[
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "API_KEY",
        "APIKEY",
        "PRIVATE_KEY",
        "ACCESS_KEY",
    ];
    n.starts_with("ANTHROPIC_") && n != "ANTHROPIC_BASE_URL"
        || n.ends_with("_KEY")
        || n.ends_with("_AUTH")
        || MARKERS.iter().any(|m| n.contains(m))
}

/// Where the credential stores of the CLI's environment are (existing or not): its `HOME`'s
/// [`HOME_CREDENTIALS`] and the Claude login of its `CLAUDE_CONFIG_DIR`. Agent commands may not
/// read them (`denyRead`), nor may the CLI's own read tools ([`super::ReadGuard`]).
pub fn credential_stores(cli_env: &[(String, String)]) -> Vec<PathBuf> {
    let home = env_value(cli_env, "HOME").map(PathBuf::from);
    let config_dir = env_value(cli_env, "CLAUDE_CONFIG_DIR").map(PathBuf::from);
    home.iter()
        .flat_map(|h| HOME_CREDENTIALS.iter().map(move |c| h.join(c)))
        .chain(config_dir.map(|d| d.join(".credentials.json")))
        .collect()
}

/// The complete `--settings` value for one session.
pub fn build(
    cfg: &SandboxConfig,
    scope: &SessionScope,
    cli_env: &[(String, String)],
    proxy_port: u16,
) -> Value {
    let deny_read: Vec<PathBuf> = credential_stores(cli_env)
        .into_iter()
        .filter(|p| p.exists())
        .collect();
    let deny_write = match &scope.git {
        Some(git) => worktree_deny_write(git),
        None => read_only_deny_write(&scope.cwd),
    };
    let mut env_deny: Vec<&str> = cli_env
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| is_credential_var(k))
        .collect();
    env_deny.sort_unstable();
    env_deny.dedup();
    json!({ "sandbox": {
        "enabled": true,
        "failIfUnavailable": true,
        "allowUnsandboxedCommands": false,
        "network": {
            "allowedDomains": cfg.allowed_domains,
            "httpProxyPort": proxy_port,
            "socksProxyPort": proxy_port,
        },
        "filesystem": {
            "allowWrite": paths(&cfg.allow_write),
            "denyWrite": paths(&deny_write),
            "denyRead": paths(&deny_read),
        },
        "credentials": {
            "envVars": env_deny.iter().map(|n| json!({"name": n, "mode": "deny"})).collect::<Vec<_>>(),
        },
    }})
}

fn env_value<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
    env.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn paths(p: &[PathBuf]) -> Vec<String> {
    p.iter().map(|p| p.to_string_lossy().into_owned()).collect()
}

/// Planner / Reviewer: the checkout they run in, and its git dir when that lives elsewhere
/// (the CLI would grant a linked worktree's common dir).
fn read_only_deny_write(cwd: &Path) -> Vec<PathBuf> {
    let mut deny = vec![cwd.to_path_buf()];
    if let Ok(repo) = git2::Repository::open(cwd) {
        for dir in [repo.path(), repo.commondir()] {
            if !dir.starts_with(cwd) && !deny.iter().any(|d| d == dir) {
                deny.push(dir.to_path_buf());
            }
        }
    }
    deny
}

/// Implementor: inside the common dir the CLI leaves writable, everything except what a commit
/// on the session's branch writes: the object store, this worktree's admin dir, the branch's
/// loose ref and reflog (and their `.lock` siblings, which live in writable directories).
fn worktree_deny_write(git: &WorktreeGit) -> Vec<PathBuf> {
    let c = &git.common_dir;
    let mut deny: Vec<PathBuf> = [
        "HEAD",
        "index",
        "ORIG_HEAD",
        "FETCH_HEAD",
        "MERGE_HEAD",
        "packed-refs",
        "shallow",
        "logs/HEAD",
    ]
    .iter()
    .map(|f| c.join(f))
    .collect();
    for entry in read_dir(&c.join("refs")) {
        if entry.file_name().is_none_or(|n| n != "heads") {
            deny.push(entry);
        }
    }
    let own_ref = c.join("refs/heads").join(&git.branch);
    let own_log = c.join("logs/refs/heads").join(&git.branch);
    files_under(&c.join("refs/heads"), &mut deny, &own_ref);
    files_under(&c.join("logs/refs"), &mut deny, &own_log);
    for admin in read_dir(&c.join("worktrees")) {
        if !same_path(&admin, &git.admin_dir) {
            deny.push(admin);
        }
    }
    deny.retain(|p| p.exists());
    deny
}

fn read_dir(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|it| it.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Every file below `dir` except `keep`.
fn files_under(dir: &Path, out: &mut Vec<PathBuf>, keep: &Path) {
    for p in read_dir(dir) {
        if p.is_dir() {
            files_under(&p, out, keep);
        } else if p != keep {
            out.push(p);
        }
    }
}

fn same_path(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_credentials_and_conventional_secrets_are_scrubbed_but_not_ordinary_vars() {
        for secret in [
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_AUTH_TOKEN",
            "CLAUDE_CODE_OAUTH_TOKEN",
            "GITHUB_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "NPM_AUTH",
            "DB_PASSWORD",
        ] {
            assert!(is_credential_var(secret), "{secret}");
        }
        for plain in [
            "PATH",
            "HOME",
            "GIT_AUTHOR_NAME",
            "ANTHROPIC_BASE_URL",
            "LANG",
            "KEYBOARD",
            "TMPDIR",
        ] {
            assert!(!is_credential_var(plain), "{plain}");
        }
    }

    #[test]
    fn implementor_denies_other_refs_and_keeps_its_own_branch_writable() {
        let tmp = tempfile::tempdir().unwrap();
        let c = tmp.path().join(".git");
        for f in [
            "HEAD",
            "refs/heads/main",
            "refs/heads/agent/s1",
            "refs/heads/agent/s2",
            "refs/tags/v1",
            "logs/refs/heads/main",
            "logs/refs/heads/agent/s1",
            "worktrees/s1/HEAD",
            "worktrees/s2/HEAD",
        ] {
            let p = c.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "x").unwrap();
        }
        let deny = worktree_deny_write(&WorktreeGit {
            common_dir: c.clone(),
            admin_dir: c.join("worktrees/s1"),
            branch: "agent/s1".into(),
        });
        for d in [
            "HEAD",
            "refs/heads/main",
            "refs/heads/agent/s2",
            "refs/tags",
            "logs/refs/heads/main",
            "worktrees/s2",
        ] {
            assert!(deny.contains(&c.join(d)), "{d} not denied: {deny:?}");
        }
        for w in [
            "refs/heads/agent/s1",
            "logs/refs/heads/agent/s1",
            "worktrees/s1",
            "objects",
            "packed-refs",
        ] {
            assert!(!deny.contains(&c.join(w)), "{w} denied");
        }
    }
}
