//! Worktree provisioning, cleanup and sweep against real git repositories in temp dirs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use claude_runtime_adapter::error::ErrorCode;
use claude_runtime_adapter::git::{Owner, RepoGit, Worktree};
use tokio_util::sync::CancellationToken;

mod common;
use common::{configure, git, request};

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
    rg.provision(&request(branch, setup), &CancellationToken::new())
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
async fn a_worktree_the_adapter_did_not_make_at_the_path_is_refused_and_kept() {
    let (_t, root) = repo();
    // Someone's own worktree where the session's would go, with uncommitted work.
    add_worktree(&root, "stale", None);
    std::fs::write(root.join(".worktrees/stale/junk"), "work\n").unwrap();
    let rg = RepoGit::for_repo(&root);
    let err = provision(&rg, "stale", None).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Provision);
    assert!(err.message.contains("did not make"), "{}", err.message);
    assert_eq!(
        std::fs::read(root.join(".worktrees/stale/junk")).unwrap(),
        b"work\n"
    );
    assert!(branches(&root).contains(&"stale".to_string()));
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
async fn existing_branch_is_force_reset_to_default_branch() {
    let (_t, root) = repo();
    let main = head(&root, "main");
    // A leftover branch with a commit of its own.
    git(&root, &["checkout", "-q", "-b", "old"]);
    std::fs::write(root.join("leftover"), "x").unwrap();
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-q", "-m", "leftover"]);
    git(&root, &["checkout", "-q", "main"]);
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "old", None).await.unwrap();
    assert_eq!(head(&root, "old"), main);
    assert!(!wt.path.join("leftover").exists());
    assert_eq!(git(&wt.path, &["status", "--porcelain"]), "");
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn branch_checked_out_in_another_worktree_is_refused_and_left_alone() {
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
    let rg = RepoGit::for_repo(&root);
    let err = provision(&rg, "busy", None).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Provision);
    assert!(
        err.message.contains("checked out in another worktree"),
        "{}",
        err.message
    );
    assert!(other.exists());
    assert!(branches(&root).contains(&"busy".to_string()));
    assert!(!root.join(".worktrees/busy").exists());
    // The main checkout's own branch is refused too.
    let err = provision(&rg, "main", None).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Provision);
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
    let wt = rg.provision(&req, &CancellationToken::new()).await.unwrap();
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
    assert_eq!(worktree_paths(&root).len(), 17);
    for wt in &wts {
        assert_eq!(git(&wt.path, &["status", "--porcelain"]), "");
    }
    futures::future::join_all(wts.iter().map(|w| w.cleanup()))
        .await
        .into_iter()
        .for_each(|r| r.unwrap());
    assert_eq!(worktree_paths(&root).len(), 1);
    assert_eq!(branches(&root), ["main"]);
    assert_eq!(git(&root, &["status", "--porcelain"]), "");
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

#[tokio::test]
async fn provisioning_waits_out_a_ref_lock_it_needs() {
    let (_t, root) = repo();
    // `worktree add -B rl` must lock refs/heads/rl: git fails at once; we retry.
    let holder = hold_lock(&root, "refs/heads/rl.lock", Duration::from_secs(1));
    let rg = RepoGit::for_repo(&root);
    let started = std::time::Instant::now();
    let wt = provision(&rg, "rl", None).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(900));
    holder.join().unwrap();
    wt.cleanup().await.unwrap();
    assert_eq!(branches(&root), ["main"]);
}

#[tokio::test]
async fn cleanup_waits_out_a_packed_refs_lock() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let wt = provision(&rg, "pr", None).await.unwrap();
    git(&root, &["pack-refs", "--all"]);
    let holder = hold_lock(&root, "packed-refs.lock", Duration::from_secs(1));
    wt.cleanup().await.unwrap();
    holder.join().unwrap();
    assert_eq!(branches(&root), ["main"]);
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

    let swept = rg.sweep_stale().await.unwrap();
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
    assert_eq!(branches(&root), ["live", "main", "mine"]);

    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    let swept = rg.sweep_stale().await.unwrap();
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
    let swept = rg.sweep_stale().await.unwrap();
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
