//! Issue 26: an edit that leaves a file's size (and maybe its mtime) as it was is the agent's
//! work like any other. Git judges a file by its index entry's stat data unless the entry is
//! "racily clean"; the adapter's copy of the index once hid that, and a same-size edit in the
//! second of the checkout ended `ERR_EMPTY_PATCH` with the work lost (3 runs in 20). Each
//! timing-dependent case runs 20 times, its edit made at once after provisioning, at the start
//! of a second, so that checkout and edit share their second as they did when the work was lost.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use claude_runtime_adapter::git::{RepoGit, Worktree};
use claude_runtime_adapter::sandbox::GitJails;
use tokio_util::sync::CancellationToken;

mod common;
use common::{configure, git, request};

const RUNS: usize = 20;
/// For a case that loses the edit whatever the timing when stat data is trusted.
const DETERMINISTIC_RUNS: usize = 3;
const OLD: &str = "export const answer = 42;\n";

fn repo() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    std::fs::create_dir_all(root.join("src")).unwrap();
    git(&root, &["init", "-q", "-b", "main"]);
    configure(&root);
    std::fs::write(root.join("src/index.js"), OLD).unwrap();
    std::fs::write(root.join("README.md"), "hello\n").unwrap();
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-q", "-m", "initial"]);
    let root = std::fs::canonicalize(root).unwrap();
    (tmp, root)
}

/// Sleeps until the wall clock has just passed a whole second.
async fn at_the_start_of_a_second() {
    let into = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_millis();
    tokio::time::sleep(Duration::from_millis(u64::from(1000 - into) + 5)).await;
}

/// Extraction comes later than the edit, as it does after a real agent: a copy of the index
/// made in the edit's own second would be racy itself and hide the fault.
async fn past_the_second() {
    tokio::time::sleep(Duration::from_millis(1100)).await;
}

async fn provision(root: &Path, branch: &str) -> Worktree {
    RepoGit::for_repo(root)
        .provision(&request(branch, None), &GitJails, &CancellationToken::new())
        .await
        .unwrap()
}

/// `sh -c script` in `dir`, which must succeed.
fn sh(dir: &Path, script: &str) {
    let out = Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The patch holds exactly the agent's one-line change of `src/index.js`.
fn assert_holds_the_edit(patch: &str, run: &str) {
    assert!(
        patch.contains("-export const answer = 42;\n+export const answer = 43;\n"),
        "{run}: the same-size edit is missing from the patch {patch:?}"
    );
    assert_eq!(patch.matches("\n+++ ").count(), 1, "{run}: {patch}");
}

/// Provisions `runs` sessions one after another per edit; in each, `edit` runs in the checkout
/// at once and the extracted patch must hold the edit. The edits run side by side, each in its
/// own repository, so every run of every edit shares the second of its checkout (the sleeps
/// that place them there are the cost, paid once per run instead of once per edit).
async fn every_run_keeps(edits: &[&str], runs: usize) {
    let repos: Vec<_> = edits.iter().map(|_| repo()).collect();
    for run in 0..runs {
        at_the_start_of_a_second().await;
        let branch = format!("racy-{run}");
        let worktrees =
            futures::future::join_all(repos.iter().map(|(_, root)| provision(root, &branch))).await;
        for (wt, edit) in worktrees.iter().zip(edits) {
            sh(&wt.path, edit);
        }
        past_the_second().await;
        for (wt, edit) in worktrees.into_iter().zip(edits) {
            let patch = wt.extract_patch().await.unwrap();
            assert_holds_the_edit(&patch, &format!("run {run} of {edit:?}"));
            wt.cleanup().await.unwrap();
        }
    }
}

const SAME_SIZE: &str = "printf 'export const answer = 43;\\n' > src/index.js";

/// A same-size edit in the checkout's second by `printf`, the same back-dated with `touch -d`
/// to the old mtime, and the same staged with `git add` and not committed.
#[tokio::test]
async fn a_same_size_edit_plain_back_dated_or_staged_in_the_second_of_the_checkout_is_in_the_patch_20_of_20(
) {
    every_run_keeps(
        &[
            SAME_SIZE,
            &format!("m=$(stat -c %Y src/index.js) && {SAME_SIZE} && touch -m -d @$m src/index.js"),
            &format!("{SAME_SIZE} && git add src/index.js"),
        ],
        RUNS,
    )
    .await;
}

#[tokio::test]
async fn a_same_size_edit_the_agents_config_would_let_git_trust_by_stat_is_in_the_patch() {
    // `core.trustctime=false` and `core.checkStat=minimal` leave git only size and mtime; the
    // edit keeps both. The adapter's git overrides them, whenever the edit happens.
    every_run_keeps(
        &[&format!(
            "git config core.trustctime false && git config core.checkStat minimal && \
         git config core.ignoreStat true && m=$(stat -c %Y src/index.js) && {SAME_SIZE} && \
         touch -m -d @$m src/index.js"
        )],
        DETERMINISTIC_RUNS,
    )
    .await;
}

#[tokio::test]
async fn an_edit_of_a_file_marked_assume_unchanged_is_in_the_patch() {
    // `git add -A` never looks at an "assume unchanged" file: its edit is only found when the
    // adapter clears the bit in its copy of the index.
    every_run_keeps(
        &[&format!(
            "git update-index --assume-unchanged src/index.js && {SAME_SIZE}"
        )],
        DETERMINISTIC_RUNS,
    )
    .await;
}

#[tokio::test]
async fn extraction_leaves_the_agents_index_and_its_assume_unchanged_bit_as_they_were() {
    let (_t, root) = repo();
    let wt = provision(&root, "bits").await;
    sh(
        &wt.path,
        &format!("git update-index --assume-unchanged src/index.js && {SAME_SIZE}"),
    );
    let index = wt.path.join(".git/index");
    let before = std::fs::read(&index).unwrap();
    assert_holds_the_edit(&wt.extract_patch().await.unwrap(), "the one run");
    assert_eq!(std::fs::read(&index).unwrap(), before);
    assert_eq!(
        git(&wt.path, &["ls-files", "-v", "src/index.js"]),
        "h src/index.js\n"
    );
    wt.cleanup().await.unwrap();
}

/// The patches the sweep saved for dead sessions.
fn salvaged(root: &Path) -> Vec<String> {
    let dir = root.join(".git/claude-runtime-adapter/salvaged");
    match std::fs::read_dir(dir) {
        Ok(d) => d
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The session records of the repository's clones.
fn records(root: &Path) -> Vec<PathBuf> {
    let dir = root.join(".git/claude-runtime-adapter/clones");
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path().join("claude-runtime-adapter.json"))
        .filter(|p| p.exists())
        .collect()
}

/// A session whose engine died right after its agent's same-size edit (its checkout was never
/// cleaned up), once per `record` (which may rewrite its session record first), each in its own
/// repository and side by side in every run as in `every_run_keeps`. The sweep must save the edit.
async fn the_sweep_saves_a_dead_sessions_same_size_edit(records_as: &[fn(&Path)]) {
    let repos: Vec<_> = records_as.iter().map(|_| repo()).collect();
    for run in 0..RUNS {
        at_the_start_of_a_second().await;
        let branch = format!("dead-{run}");
        let worktrees =
            futures::future::join_all(repos.iter().map(|(_, root)| provision(root, &branch))).await;
        for wt in &worktrees {
            sh(&wt.path, SAME_SIZE);
        }
        past_the_second().await;
        drop(worktrees);
        for (variant, ((_, root), record)) in repos.iter().zip(records_as).enumerate() {
            for r in records(root) {
                record(&r);
            }
            let swept = common::sweep(&RepoGit::for_repo(root)).await;
            let at = format!("run {run} of record variant {variant}");
            assert_eq!(swept.len(), 1, "{at}");
            assert!(swept[0].patch.is_some(), "{at}: nothing was saved");
            let saved = salvaged(root);
            assert_eq!(saved.len(), run + 1, "{at}");
            assert!(
                saved
                    .iter()
                    .all(|p| p.contains("+export const answer = 43;")),
                "{at}: {saved:?}"
            );
        }
    }
}

/// The record as this version writes it, and one written before `snapshotTaken` existed (by
/// which nothing is judged by stat data).
#[tokio::test]
async fn the_sweep_saves_a_dead_sessions_same_size_edit_from_this_or_an_older_versions_record_20_of_20(
) {
    the_sweep_saves_a_dead_sessions_same_size_edit(&[
        |_| {},
        |record| {
            let mut json: serde_json::Value =
                serde_json::from_slice(&std::fs::read(record).unwrap()).unwrap();
            json.as_object_mut().unwrap().remove("snapshotTaken");
            std::fs::write(record, serde_json::to_vec(&json).unwrap()).unwrap();
        },
    ])
    .await;
}
