//! A Planner's or Reviewer's view of the repository against real git repositories in temp dirs:
//! what it holds, and that nothing of it outlives its session, a stopped provision or a dead
//! engine. (What an agent can read of it through the CLI: `__test__/repo-view.test.mjs`.)

use std::path::{Path, PathBuf};
use std::time::Duration;

use claude_runtime_adapter::git::{RepoGit, SessionRecord, ViewRequest};
use tokio_util::sync::CancellationToken;

mod common;
use common::{configure, git};

/// A repository with two commits on `main`, checked out on another branch with an uncommitted
/// change, a token in its origin URL and an ignored `.env`.
fn repo() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    std::fs::create_dir(&root).unwrap();
    git(&root, &["init", "-q", "-b", "main"]);
    configure(&root);
    std::fs::write(root.join("a.txt"), "one\n").unwrap();
    std::fs::write(root.join(".gitignore"), ".env\n").unwrap();
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-q", "-m", "first"]);
    std::fs::write(root.join("a.txt"), "two\n").unwrap();
    git(&root, &["commit", "-q", "-am", "second"]);
    git(
        &root,
        &[
            "remote",
            "add",
            "origin",
            "https://x-access-token:TOKEN@github.com/o/r.git",
        ],
    );
    std::fs::write(root.join(".env"), "SECRET=1\n").unwrap();
    git(&root, &["checkout", "-q", "-b", "other"]);
    std::fs::write(root.join("a.txt"), "other\n").unwrap();
    git(&root, &["commit", "-q", "-am", "other"]);
    std::fs::write(root.join("a.txt"), "uncommitted\n").unwrap();
    let root = std::fs::canonicalize(root).unwrap();
    (tmp, root)
}

/// A view of `main` for a sandboxed session (as sessions run by default).
fn request() -> ViewRequest {
    ViewRequest {
        default_branch: "main".into(),
        session: SessionRecord {
            session_id: "planner-session".into(),
            transcript: None,
        },
        sandboxed: true,
    }
}

/// What is left once the bases kept for the next session on the tip are released (what
/// `shutdown()` does): every entry of `.worktrees/` and whether the adapter has any record in
/// the git dir.
async fn released(rg: &RepoGit, root: &Path) -> (Vec<String>, bool) {
    rg.release_unused_bases().await;
    leftovers(root)
}

/// The bases (`.base-*`) under `.worktrees/`.
fn bases(root: &Path) -> Vec<String> {
    leftovers(root)
        .0
        .into_iter()
        .filter(|n| n.starts_with(".base-"))
        .collect()
}

/// Every entry of `.worktrees/` and whether the adapter has any record in the git dir.
fn leftovers(root: &Path) -> (Vec<String>, bool) {
    let mut entries: Vec<String> = std::fs::read_dir(root.join(".worktrees"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    entries.sort();
    (entries, root.join(".git/claude-runtime-adapter").exists())
}

#[tokio::test]
async fn a_view_is_main_checked_out_with_its_history_and_no_remote_config_or_ignored_file() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let view = rg
        .provision_view(&request(), &CancellationToken::new())
        .await
        .unwrap();
    assert!(view.path.starts_with(root.join(".worktrees")));
    assert_eq!(
        view.commit,
        git(&root, &["rev-parse", "main"]).trim().to_string()
    );
    assert_eq!(std::fs::read(view.path.join("a.txt")).unwrap(), b"two\n");
    assert!(!view.path.join(".env").exists());
    assert_eq!(git(&view.path, &["log", "--format=%s"]), "second\nfirst\n");
    assert_eq!(
        git(&view.path, &["branch", "--show-current"]).trim(),
        "main"
    );
    assert_eq!(
        git(&view.path, &["for-each-ref", "--format=%(refname)"]),
        "refs/heads/main\n"
    );
    assert_eq!(git(&view.path, &["status", "--porcelain"]), "");
    let config = std::fs::read_to_string(view.path.join(".git/config")).unwrap();
    assert!(
        !config.contains("remote") && !config.contains("TOKEN"),
        "{config}"
    );
    // The engine's checkout is as it was.
    assert_eq!(std::fs::read(root.join("a.txt")).unwrap(), b"uncommitted\n");
    assert_eq!(git(&root, &["status", "--porcelain"]), " M a.txt\n");

    view.cleanup().await.unwrap();
    view.cleanup().await.unwrap();
    // Kept for the next session while main is there.
    assert_eq!(bases(&root).len(), 1);
    assert_eq!(released(&rg, &root).await, (vec![], false));
}

#[tokio::test]
async fn a_view_of_a_revision_that_is_no_branch_has_a_detached_head_there() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let mut req = request();
    req.default_branch = "main~1".into();
    let view = rg
        .provision_view(&req, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(std::fs::read(view.path.join("a.txt")).unwrap(), b"one\n");
    assert_eq!(git(&view.path, &["log", "--format=%s"]), "first\n");
    assert_eq!(git(&view.path, &["branch", "--show-current"]), "");
    view.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_view_of_a_shallow_repository_has_its_history_as_far_as_it_goes() {
    let (t, root) = repo();
    let shallow = t.path().join("shallow");
    let url = format!("file://{}", root.display());
    git(
        t.path(),
        &[
            "clone",
            "-q",
            "--depth",
            "1",
            "--branch",
            "main",
            &url,
            shallow.to_str().unwrap(),
        ],
    );
    let rg = RepoGit::for_repo(&shallow);
    let view = rg
        .provision_view(&request(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(git(&view.path, &["log", "--format=%s"]), "second\n");
    view.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_view_dropped_by_its_session_stays_live_for_the_next_and_goes_once_released() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let view = rg
        .provision_view(&request(), &CancellationToken::new())
        .await
        .unwrap();
    let path = view.path.clone();
    // Live while its session holds it.
    assert!(common::sweep(&rg).await.is_empty());
    assert!(path.exists());
    // Dropped without cleanup: released in the background, kept (the tip's), still live.
    drop(view);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(common::sweep(&rg).await.is_empty());
    let again = rg
        .provision_view(&request(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(again.path, path);
    again.cleanup().await.unwrap();
    assert_eq!(released(&rg, &root).await, (vec![], false));
}

#[tokio::test]
async fn a_stopped_or_dropped_view_provision_leaves_nothing() {
    let (_t, root) = repo();
    // Enough files that the checkout outlasts the 30 ms below even on an idle machine (300
    // were checked out within it once, on an idle CI run).
    for i in 0..3000 {
        let dir = root.join(format!("d{}", i % 10));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i}")), "x\n".repeat(1000)).unwrap();
    }
    git(&root, &["checkout", "-q", "-f", "main"]);
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-q", "-m", "many files"]);
    let rg = RepoGit::for_repo(&root);
    let stop = CancellationToken::new();
    stop.cancel();
    let err = rg.provision_view(&request(), &stop).await.unwrap_err();
    assert_eq!(
        err.code,
        claude_runtime_adapter::error::ErrorCode::Cancelled
    );
    // Dropped part-way through the checkout: the rollback runs in the background.
    let dropped = tokio::time::timeout(
        Duration::from_millis(30),
        rg.provision_view(&request(), &CancellationToken::new()),
    )
    .await;
    assert!(dropped.is_err(), "the provision finished within 30 ms");
    for _ in 0..200 {
        if leftovers(&root) == (vec![], false) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(leftovers(&root), (vec![], false));
}

#[tokio::test]
async fn concurrent_sandboxed_sessions_on_one_commit_share_one_view_kept_while_it_is_the_tip() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let go = CancellationToken::new();
    let req = request();
    let (a, b) = tokio::join!(rg.provision_view(&req, &go), rg.provision_view(&req, &go));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.path, b.path);
    let c = rg.provision_view(&request(), &go).await.unwrap();
    assert_eq!(c.path, a.path);
    let path = a.path.clone();
    a.cleanup().await.unwrap();
    a.cleanup().await.unwrap();
    assert!(path.join("a.txt").exists());
    // A share dropped without cleanup: the others still hold the view, so it stays live.
    drop(b);
    assert!(common::sweep(&rg).await.is_empty());
    assert!(path.join("a.txt").exists());
    c.cleanup().await.unwrap();
    // Its commit is the tip: kept, and the next session reads the same one.
    assert!(path.join("a.txt").exists());
    let d = rg.provision_view(&request(), &go).await.unwrap();
    assert_eq!(d.path, path);
    d.cleanup().await.unwrap();
    // Once main moves on, the unused view of the old tip goes with the next release.
    git(&root, &["branch", "-f", "main", "main~1"]);
    let e = rg.provision_view(&request(), &go).await.unwrap();
    assert_ne!(e.path, path);
    // A newer base removes the unused older one (in the background).
    for _ in 0..200 {
        if !path.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(!path.exists(), "a newer base removes the unused older one");
    e.cleanup().await.unwrap();
    assert_eq!(released(&rg, &root).await, (vec![], false));
}

#[tokio::test]
async fn unsandboxed_sessions_and_other_commits_get_views_of_their_own() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let go = CancellationToken::new();
    let mut unsandboxed = request();
    unsandboxed.sandboxed = false;
    let a = rg.provision_view(&unsandboxed, &go).await.unwrap();
    let b = rg.provision_view(&unsandboxed, &go).await.unwrap();
    assert_ne!(a.path, b.path);
    let c = rg.provision_view(&request(), &go).await.unwrap();
    let mut older = request();
    older.default_branch = "main~1".into();
    let d = rg.provision_view(&older, &go).await.unwrap();
    assert_ne!(c.path, d.path);
    assert_eq!(std::fs::read(d.path.join("a.txt")).unwrap(), b"one\n");
    for v in [&a, &b, &c, &d] {
        v.cleanup().await.unwrap();
    }
    // The unsandboxed ones went with their sessions; `main`'s and `main~1`'s are each what
    // their defaultBranch names now, so both are kept.
    let mut kept = [c.path.clone(), d.path.clone()];
    kept.sort();
    let kept: Vec<String> = kept
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(bases(&root), kept);
    assert_eq!(released(&rg, &root).await, (vec![], false));
}

#[tokio::test]
async fn a_sha256_repository_gets_a_view_with_its_history() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    std::fs::create_dir(&root).unwrap();
    git(
        &root,
        &["init", "-q", "--object-format=sha256", "-b", "main"],
    );
    configure(&root);
    std::fs::write(root.join("a.txt"), "one\n").unwrap();
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-q", "-m", "first"]);
    let root = std::fs::canonicalize(root).unwrap();
    let rg = RepoGit::for_repo(&root);
    let view = rg
        .provision_view(&request(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(view.commit.len(), 64, "a SHA-256 object name");
    assert_eq!(std::fs::read(view.path.join("a.txt")).unwrap(), b"one\n");
    assert_eq!(git(&view.path, &["log", "--format=%s"]), "first\n");
    assert_eq!(
        git(&view.path, &["rev-parse", "--show-object-format"]).trim(),
        "sha256"
    );
    view.cleanup().await.unwrap();
    assert_eq!(released(&rg, &root).await, (vec![], false));
}
