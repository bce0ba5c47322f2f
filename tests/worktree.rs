//! Worktree provisioning, cleanup and sweep against real git repositories in temp dirs.
// Executable hooks and git wrappers are shell scripts with unix modes; crashes are SIGKILLs.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use claude_runtime_adapter::error::ErrorCode;
use claude_runtime_adapter::git::{RepoGit, Worktree};
use claude_runtime_adapter::process::Owner;
use claude_runtime_adapter::sandbox::GitJails;
use tokio_util::sync::CancellationToken;

mod common;
use common::{configure, git, request, EXTRACTION_TIMEOUT};

/// A repository with a few files committed on `main`.
fn repo() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    std::fs::create_dir(&root).unwrap();
    git(&root, &["init", "-q", "-b", "main"]);
    configure(&root);
    std::fs::write(root.join("README.md"), "hello\n").unwrap();
    std::fs::create_dir(root.join("src")).unwrap();
    std::fs::write(root.join("src/lib.rs"), "pub fn f() {}\n").unwrap();
    std::fs::write(root.join(".gitattributes"), "*.txt text eol=crlf\n").unwrap();
    std::fs::write(root.join("notes.txt"), "a\r\nb\r\n").unwrap();
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-q", "-m", "initial"]);
    let root = std::fs::canonicalize(root).unwrap();
    (tmp, root)
}

fn head(dir: &Path, rev: &str) -> String {
    git(dir, &["rev-parse", rev]).trim().to_string()
}

fn branches(root: &Path) -> Vec<String> {
    git(root, &["branch", "--format=%(refname:short)"])
        .lines()
        .map(str::to_string)
        .collect()
}

fn worktree_paths(root: &Path) -> Vec<String> {
    git(root, &["worktree", "list", "--porcelain"])
        .lines()
        .filter_map(|l| l.strip_prefix("worktree ").map(str::to_string))
        .collect()
}

/// Provisions `branch` (with an optional setup argv) and never stops it.
async fn provision(
    rg: &RepoGit,
    branch: &str,
    setup: Option<&[&str]>,
) -> claude_runtime_adapter::error::Result<Worktree> {
    rg.provision(
        &request(branch, setup),
        &GitJails,
        &CancellationToken::new(),
    )
    .await
}

#[tokio::test]
async fn provision_checks_out_branch_at_default_branch_and_records_base_commit() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "feat/one", None).await.unwrap();
    assert_eq!(wt.path, root.join(".worktrees/feat/one"));
    assert_eq!(wt.branch, "feat/one");
    assert_eq!(wt.base_commit, head(&root, "main"));
    assert_eq!(head(&wt.path, "HEAD"), wt.base_commit);
    assert_eq!(
        git(&wt.path, &["symbolic-ref", "HEAD"]).trim(),
        "refs/heads/feat/one"
    );
    // Clean checkout, with .gitattributes conversion applied as `git worktree add` would.
    assert_eq!(git(&wt.path, &["status", "--porcelain"]), "");
    assert_eq!(
        std::fs::read(wt.path.join("notes.txt")).unwrap(),
        b"a\r\nb\r\n"
    );
    assert_eq!(
        std::fs::read(wt.path.join("src/lib.rs")).unwrap(),
        b"pub fn f() {}\n"
    );
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn main_checkout_stays_clean_and_exclude_entry_is_added_once() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let a = provision(&rg, "a", None).await.unwrap();
    let b = provision(&rg, "b", None).await.unwrap();
    assert_eq!(git(&root, &["status", "--porcelain"]), "");
    let exclude = std::fs::read_to_string(root.join(".git/info/exclude")).unwrap();
    assert_eq!(exclude.matches(".worktrees/").count(), 1, "{exclude}");
    a.cleanup().await.unwrap();
    b.cleanup().await.unwrap();
}

#[tokio::test]
async fn for_repo_returns_one_shared_instance_per_canonical_path() {
    let (_t, root) = repo();
    let a = RepoGit::for_repo(&root);
    let b = RepoGit::for_repo(&root.join("src/.."));
    assert!(std::sync::Arc::ptr_eq(&a, &b));
}

#[tokio::test]
async fn cleanup_removes_worktree_and_branch_and_second_call_does_nothing() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "gone", None).await.unwrap();
    std::fs::write(wt.path.join("untracked.txt"), "x").unwrap();
    wt.cleanup().await.unwrap();
    assert!(!wt.path.exists());
    assert_eq!(branches(&root), ["main"]);
    assert_eq!(worktree_paths(&root).len(), 1);
    assert!(
        !root.join(".git/worktrees/gone").exists(),
        "owner record and metadata gone"
    );
    // Recreate a branch of the same name: a second cleanup must not touch it.
    git(&root, &["branch", "gone"]);
    wt.cleanup().await.unwrap();
    assert_eq!(branches(&root), ["gone", "main"]);
}

#[tokio::test]
async fn another_tools_stale_worktree_at_the_path_is_saved_as_a_patch_then_replaced_with_its_branch(
) {
    let (_t, root) = repo();
    // What the TypeScript adapter or the v1 agent manager leaves: an unlocked worktree on the
    // branch, with a commit and uncommitted work.
    add_worktree(&root, "stale", None);
    let old = root.join(".worktrees/stale");
    std::fs::write(old.join("committed.rs"), "one\n").unwrap();
    git(&old, &["add", "-A"]);
    git(&old, &["commit", "-q", "-m", "old work"]);
    std::fs::write(old.join("junk"), "work\n").unwrap();
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "stale", None).await.unwrap();
    assert!(!wt.path.join("junk").exists() && !wt.path.join("committed.rs").exists());
    let saved = salvaged(&root);
    assert_eq!(saved.len(), 1, "{saved:?}");
    let text = std::fs::read_to_string(&saved[0]).unwrap();
    assert!(
        text.contains("committed.rs") && text.contains("junk"),
        "{text}"
    );
    // Its branch is the session's branchName (spec 000 resets and deletes it); its commit is
    // in the saved patch.
    assert_eq!(branches(&root), ["main"]);
    assert_eq!(worktree_paths(&root).len(), 1);
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_stale_worktrees_branch_whose_commits_the_patch_cannot_hold_is_kept() {
    let (_t, root) = repo();
    // A branch with no history in common with main: its patch is measured from its own HEAD,
    // so its commit is not in it.
    let old = root.join(".worktrees/unrelated");
    git(
        &root,
        &[
            "worktree",
            "add",
            "-q",
            "--detach",
            old.to_str().unwrap(),
            "main",
        ],
    );
    git(&old, &["checkout", "-q", "--orphan", "unrelated"]);
    std::fs::write(old.join("own.rs"), "own\n").unwrap();
    git(&old, &["add", "-A"]);
    git(&old, &["commit", "-q", "-m", "own history"]);
    let tip = head(&root, "unrelated");
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "unrelated", None).await.unwrap();
    assert_eq!(head(&root, "unrelated"), tip);
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_stale_worktree_whose_directory_is_gone_keeps_its_branch_with_the_unsaved_commit() {
    let (_t, root) = repo();
    add_worktree(&root, "gone-dir", None);
    let old = root.join(".worktrees/gone-dir");
    std::fs::write(old.join("only-here.rs"), "x\n").unwrap();
    git(&old, &["add", "-A"]);
    git(&old, &["commit", "-q", "-m", "only in the branch"]);
    let tip = head(&root, "gone-dir");
    // Deleted by hand: git still lists it, there is nothing to save a patch from.
    std::fs::remove_dir_all(&old).unwrap();
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "gone-dir", None).await.unwrap();
    assert!(salvaged(&root).is_empty());
    assert_eq!(head(&root, "gone-dir"), tip);
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_stale_worktree_on_another_branch_is_replaced_and_that_branch_kept() {
    let (_t, root) = repo();
    // At the session's path, but on a branch that is not the session's.
    let old = root.join(".worktrees/mine");
    git(
        &root,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "theirs",
            old.to_str().unwrap(),
            "main",
        ],
    );
    std::fs::write(old.join("theirs.rs"), "x\n").unwrap();
    git(&old, &["add", "-A"]);
    git(&old, &["commit", "-q", "-m", "theirs"]);
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "mine", None).await.unwrap();
    assert_eq!(salvaged(&root).len(), 1);
    assert_eq!(branches(&root), ["main", "theirs"]);
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_locked_worktree_at_the_path_is_refused_and_untouched() {
    let (_t, root) = repo();
    add_worktree(&root, "held", Some("a person is using this"));
    std::fs::write(root.join(".worktrees/held/junk"), "work\n").unwrap();
    let rg = RepoGit::for_repo(&root);
    let err = provision(&rg, "held", None).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Provision);
    assert!(
        err.message.contains("git worktree unlock"),
        "{}",
        err.message
    );
    assert!(err.message.contains(".worktrees/held"), "{}", err.message);
    assert_eq!(
        std::fs::read(root.join(".worktrees/held/junk")).unwrap(),
        b"work\n"
    );
    assert_eq!(worktree_paths(&root).len(), 2);
    assert!(salvaged(&root).is_empty());
}

#[tokio::test]
async fn a_directory_at_the_path_that_is_no_worktree_is_refused_and_never_deleted() {
    let (_t, root) = repo();
    let dir = root.join(".worktrees/plain");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes"), "mine\n").unwrap();
    let rg = RepoGit::for_repo(&root);
    let err = provision(&rg, "plain", None).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Provision);
    assert!(err.message.contains("is left alone"), "{}", err.message);
    assert_eq!(std::fs::read(dir.join("notes")).unwrap(), b"mine\n");
}

#[tokio::test]
async fn stale_worktree_of_a_dead_owner_is_replaced_after_its_work_is_saved() {
    let (_t, root) = repo();
    add_worktree(&root, "x", Some(&dead_owner().to_record()));
    std::fs::write(root.join(".worktrees/x/unsaved.rs"), "work\n").unwrap();
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "x", None).await.unwrap();
    assert!(!wt.path.join("unsaved.rs").exists());
    let saved = salvaged(&root);
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert!(std::fs::read_to_string(&saved[0])
        .unwrap()
        .contains("unsaved.rs"));
    wt.cleanup().await.unwrap();
    assert_eq!(branches(&root), ["main"]);
}

#[tokio::test]
async fn provisioning_a_branch_in_use_by_a_live_session_of_this_process_is_refused() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "dup", None).await.unwrap();
    std::fs::write(wt.path.join("work"), "precious").unwrap();
    let err = provision(&rg, "dup", None).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Provision);
    assert!(
        wt.path.join("work").exists(),
        "the live session's work survives"
    );
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn the_sessions_branch_starts_at_the_default_branch_whatever_the_repository_has_of_that_name()
{
    let (_t, root) = repo();
    let main = head(&root, "main");
    // A leftover branch with a commit of its own.
    git(&root, &["checkout", "-q", "-b", "old"]);
    std::fs::write(root.join("leftover"), "x").unwrap();
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-q", "-m", "leftover"]);
    git(&root, &["checkout", "-q", "main"]);
    let leftover = head(&root, "old");
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "old", None).await.unwrap();
    // The session's branch is its clone's, at the default branch; the repository's own
    // branch of that name is not the adapter's to reset.
    assert_eq!(head(&wt.path, "old"), main);
    assert_eq!(git(&wt.path, &["branch", "--show-current"]).trim(), "old");
    assert_eq!(
        git(&wt.path, &["branch", "--format=%(refname:short)"]).trim(),
        "old"
    );
    assert!(!wt.path.join("leftover").exists());
    assert_eq!(git(&wt.path, &["status", "--porcelain"]), "");
    assert_eq!(head(&root, "old"), leftover);
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn an_implementors_branch_must_not_be_the_default_branch_or_checked_out_in_the_repository() {
    let (_t, root) = repo();
    let other = root.parent().unwrap().join("elsewhere");
    git(
        &root,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "busy",
            other.to_str().unwrap(),
            "main",
        ],
    );
    git(&root, &["branch", "side"]);
    let rg = RepoGit::for_repo(&root);
    let refused = |err: claude_runtime_adapter::error::AdapterError, branch: &str, why: &str| {
        assert_eq!(err.code, ErrorCode::InvalidParams, "{branch}");
        let named = format!("branchName \"{branch}\"");
        assert!(err.message.contains(&named), "{}", err.message);
        assert!(err.message.contains(why), "{}", err.message);
    };
    for default in ["main", "refs/heads/main"] {
        let err = rg.check_own_branch("main", default).await.unwrap_err();
        refused(err, "main", "is the defaultBranch");
    }
    let err = rg.check_own_branch("busy", "main").await.unwrap_err();
    refused(
        err,
        "busy",
        &format!("checked out in the repository at {}", other.display()),
    );
    // A branch only of the repository's refs is free, and so is the branch of a stale
    // worktree at the session's own path (provisioning replaces it).
    add_worktree(&root, "stale", None);
    for free in ["side", "stale", "new"] {
        rg.check_own_branch(free, "main").await.unwrap();
    }
    // The main checkout's branch, when that is not the default branch.
    git(&root, &["checkout", "-q", "side"]);
    let err = rg.check_own_branch("side", "main").await.unwrap_err();
    refused(
        err,
        "side",
        &format!("checked out in the repository at {}", root.display()),
    );
}

#[tokio::test]
async fn unknown_default_branch_is_a_provision_error() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let err = rg
        .provision(
            &claude_runtime_adapter::git::ProvisionRequest {
                default_branch: "nope".into(),
                ..request("b", None)
            },
            &GitJails,
            &CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Provision);
    assert_eq!(branches(&root), ["main"]);
}

#[tokio::test]
async fn setup_runs_in_the_worktree_with_the_given_env() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let setup = [
        "sh",
        "-c",
        "pwd > .setup-cwd; printf %s \"$SETUP_MARK\" > .setup-env",
    ];
    let mut req = request("s", Some(&setup));
    req.env.push(("SETUP_MARK".into(), "from-config".into()));
    let wt = rg
        .provision(&req, &GitJails, &CancellationToken::new())
        .await
        .unwrap();
    let cwd = std::fs::read_to_string(wt.path.join(".setup-cwd")).unwrap();
    assert_eq!(Path::new(cwd.trim()), wt.path);
    assert_eq!(
        std::fs::read_to_string(wt.path.join(".setup-env")).unwrap(),
        "from-config"
    );
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn setup_failure_removes_worktree_and_branch_and_reports_status_and_output() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let setup = [
        "sh",
        "-c",
        "echo installing; echo 'boom: missing dep' >&2; exit 1",
    ];
    let err = provision(&rg, "fails", Some(&setup)).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Provision);
    assert!(err.message.contains("exit status 1"), "{}", err.message);
    assert!(err.message.contains("boom: missing dep"), "{}", err.message);
    assert!(err.cause.is_some());
    assert!(!root.join(".worktrees/fails").exists());
    assert_eq!(branches(&root), ["main"]);
    assert_eq!(worktree_paths(&root).len(), 1);
}

#[tokio::test]
async fn setup_command_not_found_removes_worktree_and_branch() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let setup = ["definitely-not-a-command-7f3a", "install"];
    let err = provision(&rg, "nf", Some(&setup)).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Provision);
    assert!(err.message.contains("could not start"), "{}", err.message);
    assert!(!root.join(".worktrees/nf").exists());
    assert_eq!(branches(&root), ["main"]);
}

#[tokio::test]
async fn chatty_setup_output_is_drained_and_only_a_bounded_tail_is_kept() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    // ~6 MB on both streams (far past any pipe buffer), then a marker and failure.
    let script = "head -c 3000000 /dev/zero | tr '\\0' a; head -c 3000000 /dev/zero | tr '\\0' b >&2; echo; echo THE-END; exit 3";
    let err = provision(&rg, "chatty", Some(&["sh", "-c", script]))
        .await
        .unwrap_err();
    assert!(err.message.contains("exit status 3"));
    assert!(err.message.contains("THE-END"));
    assert!(
        err.message.len() < 9 * 1024,
        "tail is bounded: {}",
        err.message.len()
    );
    assert!(!root.join(".worktrees/chatty").exists());
}

#[tokio::test]
async fn dropping_a_provision_during_setup_rolls_the_worktree_back() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let r = tokio::time::timeout(
        Duration::from_millis(1500),
        provision(&rg, "cancelled", Some(&["sleep", "30"])),
    )
    .await;
    assert!(r.is_err(), "setup was still running");
    for _ in 0..100 {
        if branches(&root) == ["main"] && !root.join(".worktrees/cancelled").exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("worktree not rolled back: {:?}", worktree_paths(&root));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_provisions_all_succeed_and_all_clean_up() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let results = futures::future::join_all((0..16).map(|i| {
        let rg = rg.clone();
        async move { provision(&rg, &format!("par/{i}"), Some(&["sh", "-c", "echo ok"])).await }
    }))
    .await;
    let wts: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(clone_records(&root), 16);
    for (i, wt) in wts.iter().enumerate() {
        assert_eq!(git(&wt.path, &["status", "--porcelain"]), "");
        let branch = git(&wt.path, &["branch", "--show-current"]);
        assert_eq!(branch.trim(), format!("par/{i}"));
    }
    futures::future::join_all(wts.iter().map(|w| w.cleanup()))
        .await
        .into_iter()
        .for_each(|r| r.unwrap());
    assert_eq!(clone_records(&root), 0);
    assert_eq!(worktree_paths(&root).len(), 1);
    assert_eq!(branches(&root), ["main"]);
    assert_eq!(git(&root, &["status", "--porcelain"]), "");
}

/// How many clones the adapter has on record for `root`.
fn clone_records(root: &Path) -> usize {
    std::fs::read_dir(root.join(".git/claude-runtime-adapter/clones")).map_or(0, |d| d.count())
}

/// Holds `lock` (relative to `.git`) for `hold`, as a competing git process would.
fn hold_lock(root: &Path, lock: &str, hold: Duration) -> std::thread::JoinHandle<()> {
    let path = root.join(".git").join(lock);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, "").unwrap();
    std::thread::spawn(move || {
        std::thread::sleep(hold);
        std::fs::remove_file(&path).unwrap();
    })
}

#[tokio::test]
async fn provisioning_waits_out_an_index_lock_held_by_another_git_process() {
    let (_t, root) = repo();
    let holder = hold_lock(&root, "index.lock", Duration::from_secs(1));
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "il", None).await.unwrap();
    holder.join().unwrap();
    wt.cleanup().await.unwrap();
}

/// An owner record for a process that has exited (its pid is then stale).
fn dead_owner() -> Owner {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    let owner = Owner::of_pid(pid).unwrap_or(Owner {
        pid,
        start_time: 1,
        host: Owner::current().host,
    });
    child.wait().unwrap();
    owner
}

#[tokio::test]
async fn sweep_removes_worktrees_of_dead_owners_and_keeps_live_ones() {
    let (_t, root) = repo();
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let live = Owner::of_pid(sleeper.id()).unwrap();
    // Same pid, different start time: the pid was reused by an unrelated process.
    let reused = Owner {
        start_time: live.start_time + 1,
        ..live.clone()
    };
    add_worktree(&root, "live", Some(&live.to_record()));
    add_worktree(&root, "dead", Some(&dead_owner().to_record()));
    add_worktree(&root, "reused", Some(&reused.to_record()));
    let rg = RepoGit::for_repo(&root);
    let mine = provision(&rg, "mine", None).await.unwrap();
    // Provisioned by this process, then dropped without cleanup: leaked, hence stale.
    let leaked = provision(&rg, "leaked", None).await.unwrap();
    drop(leaked);

    let swept = common::sweep(&rg).await;
    let mut removed: Vec<PathBuf> = swept.iter().map(|s| s.path.clone()).collect();
    removed.sort();
    let expect: Vec<PathBuf> = ["dead", "leaked", "reused"]
        .iter()
        .map(|b| root.join(".worktrees").join(b))
        .collect();
    assert_eq!(removed, expect);
    assert!(swept.iter().all(|s| s.patch.is_none()), "nothing to save");
    assert!(root.join(".worktrees/live").exists());
    assert!(mine.path.exists());
    assert_eq!(branches(&root), ["live", "main"]);

    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    let swept = common::sweep(&rg).await;
    assert_eq!(swept.len(), 1);
    assert_eq!(swept[0].path, root.join(".worktrees/live"));
    assert_eq!(swept[0].branch.as_deref(), Some("live"));
    mine.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_persons_worktree_with_an_uncommitted_file_survives_a_sweep() {
    let (_t, root) = repo();
    // `git worktree add .worktrees/my-work -b manual`, then work not yet committed.
    git(
        &root,
        &[
            "worktree",
            "add",
            "-q",
            ".worktrees/my-work",
            "-b",
            "manual",
        ],
    );
    std::fs::write(root.join(".worktrees/my-work/draft.md"), "mine\n").unwrap();
    // Locked by a person, and one of our records outside .worktrees/: not ours to touch either.
    add_worktree(&root, "held", Some("on a USB disk"));
    let outside = root.parent().unwrap().join("outside");
    git(
        &root,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "outside",
            outside.to_str().unwrap(),
        ],
    );
    lock_with(&outside, &dead_owner().to_record());
    let rg = RepoGit::for_repo(&root);
    let swept = common::sweep(&rg).await;
    assert_eq!(swept, []);
    assert_eq!(
        std::fs::read(root.join(".worktrees/my-work/draft.md")).unwrap(),
        b"mine\n"
    );
    assert!(root.join(".worktrees/held").exists() && outside.exists());
    assert_eq!(branches(&root), ["held", "main", "manual", "outside"]);
    assert_eq!(worktree_paths(&root).len(), 4);
}

/// Adds a worktree at `.worktrees/<branch>` on a new branch, locked with `reason` if given —
/// the way git 2.30 can: `--lock`, then the reason written into the admin dir's `locked` file.
fn add_worktree(root: &Path, branch: &str, reason: Option<&str>) {
    let path = format!(".worktrees/{branch}");
    let mut args = vec!["worktree", "add", "-q"];
    if reason.is_some() {
        args.push("--lock");
    }
    args.extend(["-b", branch, &path, "main"]);
    git(root, &args);
    if let Some(r) = reason {
        lock_with(&root.join(&path), r);
    }
}

/// Writes `reason` as the lock reason of the worktree at `worktree`.
fn lock_with(worktree: &Path, reason: &str) {
    let dot_git = std::fs::read_to_string(worktree.join(".git")).unwrap();
    let admin = PathBuf::from(dot_git.trim().strip_prefix("gitdir: ").unwrap());
    std::fs::write(admin.join("locked"), format!("{reason}\n")).unwrap();
}

/// The patches a sweep saved in the repository's git dir.
fn salvaged(root: &Path) -> Vec<PathBuf> {
    let dir = root.join(".git/claude-runtime-adapter/salvaged");
    match std::fs::read_dir(dir) {
        Ok(d) => d.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn owner_records_round_trip_and_detect_liveness() {
    let me = Owner::current();
    assert!(me.is_alive());
    assert_eq!(Owner::parse(&me.to_record()), Some(me.clone()));
    assert_eq!(Owner::parse("locked by alice"), None);
    assert!(!dead_owner().is_alive());
}

/// Whether `pid` is still a running process (a zombie has exited).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat[stat.rfind(')').unwrap() + 1..]
                .split_whitespace()
                .next()
                .unwrap()
                .to_string();
            state != "Z" && state != "X"
        }
        Err(_) => false,
    }
}

/// Waits (bounded) for `path` to exist.
async fn wait_for(path: &Path) {
    for _ in 0..600 {
        if path.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} never appeared", path.display());
}

#[tokio::test]
async fn a_hung_setup_is_cancelled_promptly_with_its_process_tree_dead_and_nothing_left() {
    let (t, root) = repo();
    let pids = t.path().join("pids");
    // The shell, and a child that left its process group and session (`setsid`), both hang.
    let script = format!(
        "echo $$ > {p}.tmp; setsid sleep 41 & echo $! >> {p}.tmp; mv {p}.tmp {p}; sleep 40",
        p = pids.display()
    );
    let rg = RepoGit::for_repo(&root);
    let stop = CancellationToken::new();
    let req = request("hung", Some(&["sh", "-c", &script]));
    let run = {
        let (rg, stop) = (rg.clone(), stop.clone());
        tokio::spawn(async move { rg.provision(&req, &GitJails, &stop).await })
    };
    wait_for(&pids).await;
    let started = std::time::Instant::now();
    stop.cancel();
    let result = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("a cancelled provision returns; it does not wait for the setup")
        .unwrap();
    println!("cancel -> provision returned in {:?}", started.elapsed());
    assert_eq!(result.unwrap_err().code, ErrorCode::Cancelled);
    let pids: Vec<u32> = std::fs::read_to_string(&pids)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2);
    for pid in pids {
        assert!(!alive(pid), "setup process {pid} survived the cancel");
    }
    assert!(!root.join(".worktrees/hung").exists());
    assert_eq!(branches(&root), ["main"]);
    assert_eq!(worktree_paths(&root).len(), 1);
}

#[tokio::test]
async fn a_stop_before_the_lock_is_free_makes_nothing() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let stop = CancellationToken::new();
    stop.cancel();
    let err = rg
        .provision(&request("early", None), &GitJails, &stop)
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Cancelled);
    assert_eq!(branches(&root), ["main"]);
}

#[tokio::test]
async fn a_setup_that_outlives_its_time_limit_is_a_provision_error_naming_the_limit() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let mut req = request("slow", Some(&["sh", "-c", "echo resolving; sleep 40"]));
    req.setup_timeout = Duration::from_secs(1);
    let err = tokio::time::timeout(
        Duration::from_secs(10),
        rg.provision(&req, &GitJails, &CancellationToken::new()),
    )
    .await
    .expect("the setup limit bounds the provision")
    .unwrap_err();
    assert_eq!(err.code, ErrorCode::Provision);
    assert!(
        err.message.contains(
            "setup command `sh -c echo resolving; sleep 40` did not finish within 1 s \
             (config.worktreeSetupTimeout)"
        ),
        "{}",
        err.message
    );
    assert!(
        err.message.contains("resolving"),
        "output tail: {}",
        err.message
    );
    assert!(!root.join(".worktrees/slow").exists());
    assert_eq!(branches(&root), ["main"]);
}

#[tokio::test]
async fn the_post_checkout_hook_runs_in_the_new_worktree_as_git_worktree_add_runs_it() {
    let (_t, root) = repo();
    let hook = root.join(".git/hooks/post-checkout");
    std::fs::write(
        &hook,
        "#!/bin/sh\nprintf '%s %s %s' \"$1\" \"$2\" \"$3\" > hook-args\npwd > hook-cwd\n\
         printf %s \"${GIT_DIR-unset}\" > hook-git-dir\n",
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "hooked", None).await.unwrap();
    let read = |f: &str| std::fs::read_to_string(wt.path.join(f)).unwrap();
    assert_eq!(
        read("hook-args"),
        format!("{} {} 1", "0".repeat(40), wt.base_commit)
    );
    assert_eq!(Path::new(read("hook-cwd").trim()), wt.path);
    assert_eq!(read("hook-git-dir"), "unset");
    // What the hook wrote is part of the starting point, not the agent's work.
    assert_eq!(wt.extract_patch().await.unwrap(), "");
    wt.cleanup().await.unwrap();
}

/// Not a test of its own: the process `crash_*` tests start and SIGKILL. It provisions a
/// worktree (setup included) for a session, changes files as an agent would, says so, and waits
/// to be killed.
#[tokio::test]
#[ignore = "helper run by the crash tests in a child process"]
async fn crash_helper_provisions_then_waits_to_be_killed() {
    let Ok(repo) = std::env::var("CRA_CRASH_REPO") else {
        return;
    };
    let root = PathBuf::from(repo);
    let mut req = request("crashed", Some(&["sh", "-c", "echo x > install-state.txt"]));
    req.session.transcript = std::env::var_os("CRA_CRASH_TRANSCRIPT").map(PathBuf::from);
    let wt = RepoGit::for_repo(&root)
        .provision(&req, &GitJails, &CancellationToken::new())
        .await
        .unwrap();
    std::fs::write(wt.path.join("README.md"), "hello\nfrom the agent\n").unwrap();
    std::fs::write(wt.path.join("feature.rs"), "pub fn feature() {}\n").unwrap();
    std::fs::write(std::env::var("CRA_CRASH_READY").unwrap(), "").unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
}

/// Runs the crash helper for `root`, kills it with SIGKILL once its agent has worked.
async fn provision_then_crash(root: &Path, transcript: Option<&Path>) {
    let ready = root.parent().unwrap().join("ready");
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "crash_helper_provisions_then_waits_to_be_killed",
        "--exact",
        "--ignored",
        "--nocapture",
    ])
    .env("CRA_CRASH_REPO", root)
    .env("CRA_CRASH_READY", &ready);
    if let Some(t) = transcript {
        cmd.env("CRA_CRASH_TRANSCRIPT", t);
    }
    let mut child = cmd.spawn().unwrap();
    wait_for(&ready).await;
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A crashed session's worktree beside a person's: the sweep saves the crashed session's work
/// (returning where), removes its worktree and branch, and leaves the person's alone.
async fn crash_then_sweep(root: &Path, transcript: Option<&Path>) -> PathBuf {
    provision_then_crash(root, transcript).await;
    assert!(root.join(".worktrees/crashed").exists());
    git(
        root,
        &[
            "worktree",
            "add",
            "-q",
            ".worktrees/my-work",
            "-b",
            "manual",
        ],
    );
    std::fs::write(root.join(".worktrees/my-work/draft.md"), "mine\n").unwrap();

    let swept = RepoGit::for_repo(root)
        .sweep_stale(
            EXTRACTION_TIMEOUT,
            None,
            &GitJails,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(swept.len(), 1, "{swept:?}");
    assert_eq!(swept[0].path, root.join(".worktrees/crashed"));
    // Its branch lived in its clone.
    assert_eq!(swept[0].branch, None);
    assert!(!root.join(".worktrees/crashed").exists());
    assert_eq!(clone_records(root), 0);
    assert_eq!(branches(root), ["main", "manual"]);
    assert_eq!(
        std::fs::read(root.join(".worktrees/my-work/draft.md")).unwrap(),
        b"mine\n"
    );
    // The saved patch is the agent's work only and applies on the base commit.
    let patch = swept[0].patch.clone().expect("the work was saved");
    let text = std::fs::read_to_string(&patch).unwrap();
    assert!(!text.contains("install-state.txt"), "{text}");
    git(root, &["apply", "--index", patch.to_str().unwrap()]);
    assert_eq!(
        std::fs::read(root.join("README.md")).unwrap(),
        b"hello\nfrom the agent\n"
    );
    assert!(root.join("feature.rs").exists());
    patch
}

#[tokio::test]
async fn a_crashed_sessions_work_is_saved_beside_its_transcript_before_its_worktree_is_swept() {
    let (t, root) = repo();
    let transcript = t.path().join("1700000000000-implementor-s1.log");
    std::fs::write(&transcript, "transcript\n").unwrap();
    let patch = crash_then_sweep(&root, Some(&transcript)).await;
    assert_eq!(patch, t.path().join("1700000000000-implementor-s1.patch"));
}

#[tokio::test]
async fn a_crashed_sessions_work_without_a_transcript_is_saved_in_the_git_dir() {
    let (_t, root) = repo();
    let patch = crash_then_sweep(&root, None).await;
    assert_eq!(
        patch.parent().unwrap(),
        root.join(".git/claude-runtime-adapter/salvaged")
    );
    let name = patch.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("session-crashed-"), "{name}");
}

/// A `git` that says it is `version` and refuses, the way git 2.30 does (usage error, exit 129;
/// `hook` is not a command there), what git 2.30 does not have; everything else goes to the real
/// git. Every refused call is appended to `<dir>/refused`.
fn old_git(dir: &Path, version: &str) -> PathBuf {
    let real = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join("git"))
        .find(|p| p.is_file())
        .expect("git on PATH");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = format!(
        r#"#!/bin/sh
refused() {{ printf '%s\n' "$*" >> '{log}'; echo "error: unknown option (git 2.30): $*" >&2; exit 129; }}
[ "$1" = "--version" ] && {{ echo "git version {version}"; exit 0; }}
sub=""; skip=0
for a in "$@"; do
  if [ $skip = 1 ]; then skip=0; continue; fi
  case "$a" in -c|-C) skip=1 ;; -*) ;; *) sub="$a"; break ;; esac
done
if [ "$sub" = hook ]; then
  printf '%s\n' "$*" >> '{log}'
  echo "git: 'hook' is not a git command. See 'git --help'." >&2; exit 1
fi
for a in "$@"; do
  case "$sub:$a" in
    worktree:--reason|worktree:--reason=*|worktree:-z|worktree:--orphan) refused "$@" ;;
    *:--path-format*) refused "$@" ;;
    rev-parse:--end-of-options) refused "$@" ;;
  esac
done
exec '{real}' "$@"
"#,
        log = dir.join("refused").display(),
        real = real.display(),
    );
    let git = bin.join("git");
    std::fs::write(&git, script).unwrap();
    std::fs::set_permissions(&git, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    bin
}

/// Runs `old_git_helper` in a child process whose PATH starts with an [`old_git`] of `version`.
fn run_under_old_git(case: &str, version: &str) -> PathBuf {
    let tmp = tempfile::tempdir().unwrap().keep();
    let bin = old_git(&tmp, version);
    let mut path = vec![bin.clone()];
    path.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap()));
    // The wrapper is in effect: the 2.36 listing is refused as 2.30 would.
    let probe = Command::new(bin.join("git"))
        .args(["worktree", "list", "--porcelain", "-z"])
        .output()
        .unwrap();
    assert_eq!(probe.status.code(), Some(129));
    std::fs::remove_file(tmp.join("refused")).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["old_git_helper", "--exact", "--ignored", "--nocapture"])
        .env("PATH", std::env::join_paths(path).unwrap())
        .env("CRA_OLD_GIT_CASE", case)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("test old_git_helper ... ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tmp
}

#[test]
fn provisioning_patch_and_sweep_work_with_git_2_30() {
    let tmp = run_under_old_git("works", "2.30.2");
    let refused = std::fs::read_to_string(tmp.join("refused")).unwrap_or_default();
    assert_eq!(refused, "", "called git with options 2.30 does not have");
    std::fs::remove_dir_all(tmp).unwrap();
}

#[test]
fn a_git_older_than_2_30_is_refused_with_the_minimum_named() {
    let tmp = run_under_old_git("too-old", "2.29.2");
    std::fs::remove_dir_all(tmp).unwrap();
}

/// Not a test of its own: what [`run_under_old_git`] runs with the wrapper first on PATH.
#[tokio::test]
#[ignore = "helper run under a git 2.30 wrapper in a child process"]
async fn old_git_helper() {
    match std::env::var("CRA_OLD_GIT_CASE").as_deref() {
        Ok("works") => old_git_works().await,
        Ok("too-old") => {
            let err = claude_runtime_adapter::git::check_git_version()
                .await
                .unwrap_err();
            assert_eq!(err.code, ErrorCode::Provision);
            assert!(err.message.contains("git 2.30 or newer"), "{}", err.message);
            assert!(err.message.contains("2.29.2"), "{}", err.message);
        }
        _ => {}
    }
}

async fn old_git_works() {
    claude_runtime_adapter::git::check_git_version()
        .await
        .unwrap();
    let (_t, root) = repo();
    let hook = root.join(".git/hooks/post-checkout");
    std::fs::write(&hook, "#!/bin/sh\necho \"$2\" > hook-ran\n").unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    add_worktree(&root, "dead", Some(&dead_owner().to_record()));
    std::fs::write(root.join(".worktrees/dead/lost.rs"), "work\n").unwrap();
    git(
        &root,
        &[
            "worktree",
            "add",
            "-q",
            ".worktrees/my-work",
            "-b",
            "manual",
        ],
    );
    let rg = RepoGit::for_repo(&root);
    let setup = ["sh", "-c", "echo x > install-state.txt"];
    let wt = provision(&rg, "old", Some(&setup)).await.unwrap();
    assert!(wt.path.join("hook-ran").exists());
    std::fs::write(wt.path.join("README.md"), "changed\n").unwrap();
    let patch = wt.extract_patch().await.unwrap();
    assert!(
        patch.contains("README.md") && !patch.contains("install-state"),
        "{patch}"
    );
    let swept = common::sweep(&rg).await;
    assert_eq!(swept.len(), 1, "{swept:?}");
    assert!(swept[0].patch.is_some());
    assert!(root.join(".worktrees/my-work").exists() && wt.path.exists());
    wt.cleanup().await.unwrap();
    assert_eq!(branches(&root), ["main", "manual"]);
}

/// Runs the `#[ignore]`d test `helper` of this binary in a process that is not root — as
/// `nobody` (uid and gid 65534, no groups) when this one is root — on a directory of that
/// user's, and asserts it passed: root ignores file modes, so what an agent's `chmod 000` does
/// to the engine's removal only shows for an engine that is not root. `setup` runs first, in
/// that directory; what it makes there is handed to that user too.
fn as_nobody(helper: &str, setup: impl FnOnce(&Path)) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().canonicalize().unwrap();
    setup(&dir);
    // SAFETY: geteuid has no preconditions.
    let mut cmd = if unsafe { libc::geteuid() } == 0 {
        for p in std::iter::once(dir.clone())
            .chain(std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()))
        {
            std::os::unix::fs::lchown(&p, Some(65534), Some(65534)).unwrap();
        }
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(std::env::current_exe().unwrap());
        c
    } else {
        Command::new(std::env::current_exe().unwrap())
    };
    let out = cmd
        .args([helper, "--exact", "--ignored", "--nocapture"])
        .env("CRA_NOBODY_DIR", &dir)
        .env("HOME", &dir)
        .env("TMPDIR", &dir)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

/// The directory [`as_nobody`] hands its helper, or `None` when run otherwise.
fn nobody_dir() -> Option<PathBuf> {
    std::env::var_os("CRA_NOBODY_DIR").map(PathBuf::from)
}

/// A repository like `repo()`'s in `dir`.
fn repo_in(dir: &Path) -> PathBuf {
    let root = dir.join("repo");
    std::fs::create_dir(&root).unwrap();
    git(&root, &["init", "-q", "-b", "main"]);
    configure(&root);
    std::fs::write(root.join("README.md"), "hello\n").unwrap();
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-q", "-m", "initial"]);
    root
}

/// Makes `d/e` in `checkout` and takes every permission from `d`, as an agent can.
fn make_unremovable(checkout: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(checkout.join("d/e")).unwrap();
    std::fs::write(checkout.join("d/e/f"), "x\n").unwrap();
    std::fs::set_permissions(checkout.join("d"), std::fs::Permissions::from_mode(0o000)).unwrap();
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_checkout_the_agent_made_unremovable_is_removed_by_a_non_root_engine_and_a_directory_it_links_to_is_untouched(
) {
    as_nobody(
        "nobody_removes_a_checkout_with_a_mode_000_directory_and_a_link_outside",
        |dir| {
            use std::os::unix::fs::PermissionsExt;
            // Outside the checkout, and the engine's user's (a chmod through a link would
            // succeed): a link to it must be neither followed nor changed.
            let outside = dir.join("outside");
            std::fs::create_dir_all(outside.join("inner")).unwrap();
            std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o000)).unwrap();
        },
    );
}

#[tokio::test]
#[ignore = "helper run as nobody by a_checkout_the_agent_made_unremovable_is_removed_by_a_non_root_engine_and_a_directory_it_links_to_is_untouched"]
async fn nobody_removes_a_checkout_with_a_mode_000_directory_and_a_link_outside() {
    let Some(dir) = nobody_dir() else { return };
    let root = repo_in(&dir);
    let outside = dir.join("outside");
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "stuck", None).await.unwrap();
    // Links to the directory outside, beside the locked directory and inside it.
    std::fs::create_dir_all(wt.path.join("d/e")).unwrap();
    std::os::unix::fs::symlink(&outside, wt.path.join("out")).unwrap();
    std::os::unix::fs::symlink(&outside, wt.path.join("d/e/out")).unwrap();
    make_unremovable(&wt.path);
    wt.cleanup().await.unwrap();
    assert!(!wt.path.exists());
    assert_eq!(clone_records(&root), 0);
    assert_eq!(mode(&outside), 0o000);
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        2,
        "repo and outside"
    );
}

#[test]
fn a_dead_sessions_unremovable_checkout_swept_twice_has_its_work_saved_once() {
    as_nobody("nobody_sweeps_an_unremovable_checkout_twice", |_| {});
}

#[tokio::test]
#[ignore = "helper run as nobody by a_dead_sessions_unremovable_checkout_swept_twice_has_its_work_saved_once"]
async fn nobody_sweeps_an_unremovable_checkout_twice() {
    let Some(dir) = nobody_dir() else { return };
    let root = repo_in(&dir);
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "stuck", None).await.unwrap();
    std::fs::write(wt.path.join("feature.rs"), "pub fn feature() {}\n").unwrap();
    make_unremovable(&wt.path);
    let path = wt.path.clone();
    // Dropped without cleanup: leaked, so the sweep takes it for a dead session's.
    drop(wt);
    for _ in 0..2 {
        common::sweep(&rg).await;
    }
    let saved = salvaged(&root);
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert!(std::fs::read_to_string(&saved[0])
        .unwrap()
        .contains("feature.rs"));
    assert!(!path.exists());
    assert_eq!(clone_records(&root), 0);
}

/// The snapshot a checkout's patch is measured from is the commit's tree only where git wrote
/// the files unchanged (no setup, no hook, no attributes: `prepare.rs`). Here an attribute
/// added after a file was committed with CRLF makes `git add` store it otherwise: taken for
/// the commit's tree, the snapshot would put that file in every patch.
#[tokio::test]
async fn a_file_git_would_stage_otherwise_than_its_commit_is_not_in_the_patch() {
    let (_t, root) = repo();
    std::fs::write(root.join("legacy.dat"), "x\r\ny\r\n").unwrap();
    git(&root, &["add", "legacy.dat"]);
    git(&root, &["commit", "-q", "-m", "legacy, with CRLF"]);
    std::fs::write(
        root.join(".gitattributes"),
        "*.txt text eol=crlf\n*.dat text\n",
    )
    .unwrap();
    git(&root, &["add", ".gitattributes"]);
    git(&root, &["commit", "-q", "-m", "*.dat is text"]);
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "attrs", None).await.unwrap();
    assert_eq!(
        std::fs::read(wt.path.join("legacy.dat")).unwrap(),
        b"x\r\ny\r\n"
    );
    std::fs::write(wt.path.join("README.md"), "changed\n").unwrap();
    let patch = wt.extract_patch().await.unwrap();
    assert!(
        patch.contains("+++ b/README.md") && !patch.contains("legacy.dat"),
        "{patch}"
    );
    wt.cleanup().await.unwrap();
}
