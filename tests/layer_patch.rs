//! Issue 37: on a layer the patch is read from what the layer changed, and is byte-identical
//! to the full staging's. Every case of the patch suite (and more that the layer's own reading
//! must refuse) is played by an "agent" — a shell in the checkout's own jail, where the
//! overlay is — on a layered checkout over a base whose setup changed a tracked file and left
//! untracked and ignored output; then both extractions run on the same checkout and must give
//! the same bytes. Cases the layer's reading cannot prove fall back, and say so (`None`).
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use claude_runtime_adapter::git::{CloneMounts, Confiner, RepoGit, Worktree};
use claude_runtime_adapter::sandbox::GitJails;
use tokio_util::sync::CancellationToken;

mod common;
use common::{configure, git, request};

const SETUP: &[&str] = &[
    "sh",
    "-c",
    "echo installed > install-state.txt; echo '<!-- installed -->' >> README.md; \
     mkdir -p ignored && echo i > ignored/x && echo l > setup.log",
];

fn repo() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    std::fs::create_dir_all(root.join("src/deep/er")).unwrap();
    git(&root, &["init", "-q", "-b", "main"]);
    configure(&root);
    let files: &[(&str, &[u8])] = &[
        (".gitattributes", b"*.txt text eol=crlf\n*.bin binary\n"),
        (".gitignore", b"*.log\nignored/\n"),
        ("README.md", b"hello\n"),
        ("a.txt", b"a\n"),
        ("b.txt", b"b\n"),
        ("c.txt", b"c\n"),
        ("d.txt", b"d\nd\nd\nd\nd\nd\n"),
        ("run.sh", b"#!/bin/sh\necho run\n"),
        ("src/index.js", b"export const answer = 42;\n"),
        ("src/deep/er/f.rs", b"fn f() {}\n"),
        ("data.bin", b"\x00\x01\x02\x03"),
    ];
    for (p, c) in files {
        std::fs::write(root.join(p), c).unwrap();
    }
    git(&root, &["add", "-A"]);
    // A tracked directory whose name an ignore rule matches.
    std::fs::create_dir_all(root.join("trace.log")).unwrap();
    std::fs::write(root.join("trace.log/kept.txt"), b"kept\n").unwrap();
    git(&root, &["add", "-f", "trace.log/kept.txt"]);
    git(&root, &["commit", "-q", "-m", "base"]);
    let root = std::fs::canonicalize(root).unwrap();
    (tmp, root)
}

async fn provision(root: &Path, branch: &str) -> Worktree {
    provision_with(root, branch, SETUP).await
}

async fn provision_with(root: &Path, branch: &str, setup: &[&str]) -> Worktree {
    let mut req = request(branch, Some(setup));
    req.layered = true;
    let wt = RepoGit::for_repo(root)
        .provision(&req, &GitJails, &CancellationToken::new())
        .await
        .unwrap();
    assert!(wt.layer.is_some(), "a layered checkout");
    wt
}

/// Runs `script` as the agent would: in the checkout's own jail, through its overlay.
async fn agent(root: &Path, wt: &Worktree, script: &str) {
    let jail = GitJails.confine(&CloneMounts {
        clone: wt.path.clone(),
        objects: vec![root.join(".git/objects")],
        layer: Some(wt.layer.as_ref().unwrap().mounts(&wt.path)),
    });
    let out = jail
        .command("sh".as_ref(), &["-c".into(), script.into()])
        .current_dir(&wt.path)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Both extractions of `wt`: from the layer (None: it fell back) and the full staging (its
/// error as text when it fails, as it does for a nested repository without a commit).
async fn both(wt: &Worktree) -> (Option<String>, Result<String, String>) {
    assert!(
        wt.layer_verified(Duration::from_secs(120)).await,
        "base verified"
    );
    let fast = wt.extract_patch_from_layer().await.unwrap();
    let full = wt
        .extract_patch_walking_the_tree()
        .await
        .map_err(|e| e.to_string());
    let chosen = wt.extract_patch().await.map_err(|e| e.to_string());
    assert_eq!(chosen, full);
    (fast, full)
}

/// (what the agent does, whether the layer's reading handles it without falling back)
const CASES: &[(&str, bool)] = &[
    ("true", true),
    // The patch suite's session: commits, staged, unstaged, untracked, deletions, renames,
    // modes, binaries, symlinks.
    (
        "echo x >> a.txt && git add -A && git commit -q -m one && echo y >> b.txt && git add \
         b.txt && echo z > new.txt && rm c.txt && git mv d.txt e.txt && chmod +x a.txt && \
         chmod -x run.sh && printf '\\000\\001\\377' > data.bin && ln -s a.txt link && \
         printf 'bin\\000' > new.bin",
        true,
    ),
    // Non-UTF-8 content and names.
    (
        "printf 'caf\\351\\n' > latin.txt && printf x > \"$(printf 'n\\351e')\" && printf y > \
         'sp ace*?.txt'",
        true,
    ),
    // The setup's changed file edited again; the setup's untracked output deleted; the
    // setup's ignored output written to.
    (
        "echo agent >> README.md && rm install-state.txt && echo more > ignored/x && echo n \
         > ignored/new && echo l > agent.log && rm setup.log",
        true,
    ),
    // Committed, then reverted; committed and reset; stashed.
    (
        "echo x >> a.txt && git commit -q -am c && git revert --no-edit HEAD >/dev/null && echo \
         y >> b.txt && git commit -q -am d && git reset -q --hard HEAD~1 && echo s >> c.txt && \
         git stash -q && echo kept > kept.txt",
        true,
    ),
    // The index alone: removed from it, its mode changed, another oid staged.
    (
        "git rm -q --cached a.txt && git update-index --chmod=+x b.txt && echo other > o && git \
         update-index --add --cacheinfo 100644,$(git hash-object -w o),c.txt && rm o",
        true,
    ),
    // New directories, deep files, a file where a new directory was.
    (
        "mkdir -p newdir/sub && echo a > newdir/sub/f && echo b > src/deep/er/g.rs && rm \
         src/deep/er/f.rs && rm c.txt && mkdir -p n2/d && echo x > n2/d/f && rm -r n2/d && echo \
         f > n2/d",
        true,
    ),
    // Directories of the base: removed (a whiteout), one whose name an ignore rule matches
    // among them; made anew (opaque); moved (copied, then removed); a file where one was, one
    // where a file was.
    ("rm -r src/deep && rm -r trace.log", true),
    (
        "rm -r src/deep && mkdir -p src/deep/er && echo new > src/deep/er/f.rs && echo n > \
         src/deep/n.rs",
        true,
    ),
    ("mv src/deep src/moved", true),
    ("rm -r src/deep && echo f > src/deep", true),
    ("rm a.txt && mkdir a.txt && echo x > a.txt/f", true),
    // A same-size edit, and one back-dated.
    (
        "printf 'export const answer = 43;\\n' > src/index.js && m=$(stat -c %Y a.txt) && printf \
         'A\\n' > a.txt && touch -m -d @$m a.txt",
        true,
    ),
    // What the layer's reading refuses: rules that reach beyond their path, assume-unchanged,
    // intent-to-add, the config, a nested repository, a directory's mode.
    ("echo '*.txt' >> .gitignore", false),
    ("echo '*.rs binary' > src/.gitattributes", false),
    (
        "git update-index --assume-unchanged a.txt && printf 'b\\n' > a.txt",
        false,
    ),
    ("echo n > ita.txt && git add -N ita.txt", false),
    ("git config core.autocrlf true", false),
    (
        "git init -q src/deep/nested && echo x > src/deep/nested/f",
        false,
    ),
    ("chmod 700 src/deep", false),
    (
        "echo '*.js' >> \"$(git rev-parse --git-dir)/info/exclude\"",
        false,
    ),
];

#[tokio::test]
async fn every_patch_case_read_from_the_layer_is_byte_identical_to_the_full_staging() {
    let (_t, root) = repo();
    for (i, (script, fast)) in CASES.iter().enumerate() {
        let wt = provision(&root, &format!("case-{i}")).await;
        agent(&root, &wt, script).await;
        let (from_layer, full) = both(&wt).await;
        match from_layer {
            Some(p) => assert_eq!(Ok(p), full, "case {i} {script:?}: the two patches differ"),
            None => assert!(!fast, "case {i} {script:?} fell back"),
        }
        let full = full.unwrap_or_default();
        // (Some cases change only what the full staging restores, e.g. the index alone: their
        // patch is empty either way.)
        if script.contains("new.bin") {
            assert!(full.contains("new.bin") && full.contains("e.txt"), "{full}");
        }
        if script.contains("rm -r trace.log") {
            assert!(full.contains("deleted file mode 100644\nindex "), "{full}");
            assert!(full.contains("trace.log/kept.txt"), "{full}");
        }
        wt.cleanup().await.unwrap();
    }
    RepoGit::for_repo(&root).release_unused_bases().await;
}

/// A setup that staged into the base's index (then changed the file again) leaves it other
/// than the commit's tree: a path the agent does not touch would end as that index has it,
/// where the full staging ends it as the snapshot has it. Not verified, so every layer takes
/// the full path, and the patch holds the agent's work alone.
#[tokio::test]
async fn a_base_whose_setup_staged_into_its_index_is_not_verified_and_its_patch_holds_only_the_agents_work(
) {
    let (_t, root) = repo();
    let setup = &[
        "sh",
        "-c",
        "echo one > staged.txt && git add staged.txt && echo two >> staged.txt",
    ];
    let wt = provision_with(&root, "staged", setup).await;
    agent(&root, &wt, "echo work > work.txt").await;
    assert!(!wt.layer_verified(Duration::from_secs(120)).await);
    let patch = wt.extract_patch().await.unwrap();
    assert!(patch.contains("+++ b/work.txt"), "{patch}");
    assert!(!patch.contains("staged.txt"), "{patch}");
    wt.cleanup().await.unwrap();
    RepoGit::for_repo(&root).release_unused_bases().await;
}

const RUNS: usize = 20;

/// Sleeps until the wall clock has just passed a whole second.
async fn at_the_start_of_a_second() {
    let into = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_millis();
    tokio::time::sleep(Duration::from_millis(u64::from(1000 - into) + 5)).await;
}

/// The racy cases of `tests/racy_edit.rs` on layers, 20 times each: the edit made in the
/// second of the checkout, the patch read from the layer holds it and equals the full one.
#[tokio::test]
async fn a_same_size_edit_in_the_second_of_the_checkout_read_from_the_layer_is_in_the_patch_20_of_20(
) {
    let same = "printf 'export const answer = 43;\\n' > src/index.js";
    let edits = [
        same.to_string(),
        format!("m=$(stat -c %Y src/index.js) && {same} && touch -m -d @$m src/index.js"),
        format!("{same} && git add src/index.js"),
    ];
    let repos: Vec<_> = edits.iter().map(|_| repo()).collect();
    // The bases first, verified: the runs measure the layers, not the base's first second.
    for (_, root) in &repos {
        let wt = provision(root, "warm").await;
        assert!(wt.layer_verified(Duration::from_secs(120)).await);
        wt.cleanup().await.unwrap();
    }
    for run in 0..RUNS {
        at_the_start_of_a_second().await;
        let branch = format!("racy-{run}");
        let worktrees =
            futures::future::join_all(repos.iter().map(|(_, root)| provision(root, &branch))).await;
        for ((_, root), (wt, edit)) in repos.iter().zip(worktrees.iter().zip(&edits)) {
            agent(root, wt, edit).await;
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
        for (wt, edit) in worktrees.into_iter().zip(&edits) {
            let (fast, full) = both(&wt).await;
            let fast = fast.unwrap_or_else(|| panic!("run {run} of {edit:?} fell back"));
            assert_eq!(Ok(fast.clone()), full, "run {run} of {edit:?}");
            assert!(
                fast.contains("-export const answer = 42;\n+export const answer = 43;\n"),
                "run {run} of {edit:?}: the edit is missing: {fast:?}"
            );
            wt.cleanup().await.unwrap();
        }
    }
    for (_, root) in &repos {
        RepoGit::for_repo(root).release_unused_bases().await;
    }
}
