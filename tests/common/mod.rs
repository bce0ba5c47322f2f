//! Helpers shared by the git integration tests: running git in a test repository.

use std::path::Path;
use std::process::Command;

/// Run git in `dir`, fail the test with git's stderr if it fails, return its stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A committer identity and byte-exact checkouts for a test repository.
pub fn configure(dir: &Path) {
    for (k, v) in [
        ("user.name", "Test"),
        ("user.email", "test@example.com"),
        ("core.autocrlf", "false"),
        ("commit.gpgsign", "false"),
    ] {
        git(dir, &["config", k, v]);
    }
}

/// What tests bound extraction and salvage with: far beyond what any of them needs.
#[allow(dead_code)]
pub const EXTRACTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// A provision request for `branch` on `main`, the test process's environment, a generous setup
/// limit, and a session record without a transcript. (Each test crate compiles this module on
/// its own; the sandbox tests do not provision through it.)
#[allow(dead_code)]
pub fn request(
    branch: &str,
    setup: Option<&[&str]>,
) -> claude_runtime_adapter::git::ProvisionRequest {
    claude_runtime_adapter::git::ProvisionRequest {
        branch: branch.to_string(),
        default_branch: "main".to_string(),
        setup: setup.map(|a| a.iter().map(|s| s.to_string()).collect()),
        env: std::env::vars().collect(),
        setup_timeout: std::time::Duration::from_secs(120),
        session: claude_runtime_adapter::git::SessionRecord {
            session_id: format!("session-{}", branch.replace('/', "-")),
            transcript: None,
        },
        extraction_timeout: EXTRACTION_TIMEOUT,
        // These tests play the agent by writing into the checkout from the host, which only a
        // full clone lets them do (a layered checkout exists inside its sandbox alone; the
        // JavaScript suite runs the patch cases through the real CLI on both).
        layered: false,
        continue_within: None,
        model: None,
    }
}

/// A sweep of `rg`'s stale checkouts as a new adapter runs it (interrupted sessions are not
/// left for a continuation here).
#[allow(dead_code)] // not every test binary sweeps
pub async fn sweep(
    rg: &claude_runtime_adapter::git::RepoGit,
) -> Vec<claude_runtime_adapter::git::Swept> {
    rg.sweep_stale(
        EXTRACTION_TIMEOUT,
        None,
        &claude_runtime_adapter::sandbox::GitJails,
        &tokio_util::sync::CancellationToken::new(),
    )
    .await
    .unwrap()
}
