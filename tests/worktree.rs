//! Worktree provisioning, cleanup and sweep against real git repositories in temp dirs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use claude_runtime_adapter::error::ErrorCode;
use claude_runtime_adapter::git::{Owner, RepoGit};

mod common;
use common::{configure, git};

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

fn env() -> Vec<(String, String)> {
    std::env::vars().collect()
}

fn argv(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn provision_checks_out_branch_at_default_branch_and_records_base_commit() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let wt = rg
        .provision("feat/one", "main", None, &env())
        .await
        .unwrap();
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
    let a = rg.provision("a", "main", None, &env()).await.unwrap();
    let b = rg.provision("b", "main", None, &env()).await.unwrap();
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
    let wt = rg.provision("gone", "main", None, &env()).await.unwrap();
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
async fn stale_worktree_at_the_path_is_replaced() {
    let (_t, root) = repo();
    // A previous interrupted run: a worktree (no owner record) with uncommitted junk.
    git(
        &root,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "stale",
            ".worktrees/stale",
            "main",
        ],
    );
    std::fs::write(root.join(".worktrees/stale/README.md"), "junk\n").unwrap();
    std::fs::write(root.join(".worktrees/stale/junk"), "junk\n").unwrap();
    let rg = RepoGit::for_repo(&root);
    let wt = rg.provision("stale", "main", None, &env()).await.unwrap();
    assert_eq!(git(&wt.path, &["status", "--porcelain"]), "");
    assert_eq!(
        std::fs::read(wt.path.join("README.md")).unwrap(),
        b"hello\n"
    );
    assert_eq!(worktree_paths(&root).len(), 2);
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn stale_worktree_of_a_dead_owner_is_replaced() {
    let (_t, root) = repo();
    let dead = dead_owner();
    git(
        &root,
        &[
            "worktree",
            "add",
            "-q",
            "--lock",
            "--reason",
            &dead.to_record(),
            "-b",
            "x",
            ".worktrees/x",
            "main",
        ],
    );
    let rg = RepoGit::for_repo(&root);
    let wt = rg.provision("x", "main", None, &env()).await.unwrap();
    wt.cleanup().await.unwrap();
    assert_eq!(branches(&root), ["main"]);
}

#[tokio::test]
async fn provisioning_a_branch_in_use_by_a_live_session_of_this_process_is_refused() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let wt = rg.provision("dup", "main", None, &env()).await.unwrap();
    std::fs::write(wt.path.join("work"), "precious").unwrap();
    let err = rg.provision("dup", "main", None, &env()).await.unwrap_err();
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
    let wt = rg.provision("old", "main", None, &env()).await.unwrap();
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
    let err = rg
        .provision("busy", "main", None, &env())
        .await
        .unwrap_err();
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
    let err = rg
        .provision("main", "main", None, &env())
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Provision);
}

#[tokio::test]
async fn unknown_default_branch_is_a_provision_error() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let err = rg.provision("b", "nope", None, &env()).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Provision);
    assert_eq!(branches(&root), ["main"]);
}

#[tokio::test]
async fn setup_runs_in_the_worktree_with_the_given_env() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let mut e = env();
    e.push(("SETUP_MARK".into(), "from-config".into()));
    let setup = argv(&[
        "sh",
        "-c",
        "pwd > .setup-cwd; printf %s \"$SETUP_MARK\" > .setup-env",
    ]);
    let wt = rg.provision("s", "main", Some(&setup), &e).await.unwrap();
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
    let setup = argv(&[
        "sh",
        "-c",
        "echo installing; echo 'boom: missing dep' >&2; exit 1",
    ]);
    let err = rg
        .provision("fails", "main", Some(&setup), &env())
        .await
        .unwrap_err();
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
    let setup = argv(&["definitely-not-a-command-7f3a", "install"]);
    let err = rg
        .provision("nf", "main", Some(&setup), &env())
        .await
        .unwrap_err();
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
    let setup = argv(&["sh", "-c", script]);
    let err = rg
        .provision("chatty", "main", Some(&setup), &env())
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
    let setup = argv(&["sleep", "30"]);
    let r = tokio::time::timeout(
        Duration::from_millis(1500),
        rg.provision("cancelled", "main", Some(&setup), &env()),
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
    let e = env();
    let setup = argv(&["sh", "-c", "echo ok"]);
    let results = futures::future::join_all((0..16).map(|i| {
        let rg = rg.clone();
        let (e, setup) = (e.clone(), setup.clone());
        async move {
            rg.provision(&format!("par/{i}"), "main", Some(&setup), &e)
                .await
        }
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
    let wt = rg.provision("il", "main", None, &env()).await.unwrap();
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
    let wt = rg.provision("rl", "main", None, &env()).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(900));
    holder.join().unwrap();
    wt.cleanup().await.unwrap();
    assert_eq!(branches(&root), ["main"]);
}

#[tokio::test]
async fn cleanup_waits_out_a_packed_refs_lock() {
    let (_t, root) = repo();
    let rg = RepoGit::for_repo(&root);
    let wt = rg.provision("pr", "main", None, &env()).await.unwrap();
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
    let dead = dead_owner();
    let add = |branch: &str, reason: Option<String>| {
        let path = format!(".worktrees/{branch}");
        let mut args = vec!["worktree", "add", "-q"];
        if let Some(r) = reason.as_deref() {
            args.extend(["--lock", "--reason", r]);
        }
        args.extend(["-b", branch, &path, "main"]);
        git(&root, &args);
    };
    add("live", Some(live.to_record()));
    add("dead", Some(dead.to_record()));
    add("reused", Some(reused.to_record()));
    add("ownerless", None);
    let rg = RepoGit::for_repo(&root);
    let mine = rg.provision("mine", "main", None, &env()).await.unwrap();
    // Provisioned by this process, then dropped without cleanup: leaked, hence stale.
    let leaked = rg.provision("leaked", "main", None, &env()).await.unwrap();
    drop(leaked);

    let mut removed = rg.sweep_stale().await.unwrap();
    removed.sort();
    let expect: Vec<PathBuf> = ["dead", "leaked", "ownerless", "reused"]
        .iter()
        .map(|b| root.join(".worktrees").join(b))
        .collect();
    assert_eq!(removed, expect);
    assert!(root.join(".worktrees/live").exists());
    assert!(mine.path.exists());
    // Branches of swept owned worktrees go; an ownerless worktree's branch may hold someone's
    // work and is kept.
    assert_eq!(branches(&root), ["live", "main", "mine", "ownerless"]);

    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    let removed = rg.sweep_stale().await.unwrap();
    assert_eq!(removed, [root.join(".worktrees/live")]);
    mine.cleanup().await.unwrap();
}

#[test]
fn owner_records_round_trip_and_detect_liveness() {
    let me = Owner::current();
    assert!(me.is_alive());
    assert_eq!(Owner::parse(&me.to_record()), Some(me.clone()));
    assert_eq!(Owner::parse("locked by alice"), None);
    assert!(!dead_owner().is_alive());
}
