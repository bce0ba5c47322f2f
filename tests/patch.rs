//! Patch extraction against real git repositories: every patch is applied with
//! `git apply --index` to a fresh clone checked out at the base commit and the files compared
//! byte for byte (modes too).
// Unix file modes and raw-byte paths throughout (the executable bit, non-UTF-8 names).
#![cfg(unix)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use claude_runtime_adapter::git::{RepoGit, Worktree};
use claude_runtime_adapter::sandbox::GitJails;
use proptest::prelude::*;
use tokio_util::sync::CancellationToken;

mod common;
use common::{configure, git, request};

const ATTRIBUTES: &str = "*.txt text eol=crlf\n*.bin binary\n";
const IGNORE: &str = "*.log\nignored/\n";

/// A repository whose `main` holds `files` plus `.gitattributes` and `.gitignore`.
fn repo_with(files: &[(&str, &[u8])]) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    std::fs::create_dir(&root).unwrap();
    git(&root, &["init", "-q", "-b", "main"]);
    configure(&root);
    write(&root, ".gitattributes", ATTRIBUTES.as_bytes());
    write(&root, ".gitignore", IGNORE.as_bytes());
    for (p, c) in files {
        write(&root, p, c);
    }
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-q", "-m", "base"]);
    let root = std::fs::canonicalize(root).unwrap();
    (tmp, root)
}

fn write(dir: &Path, rel: &str, content: &[u8]) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

fn set_exec(dir: &Path, rel: &str, exec: bool) {
    let p = dir.join(rel);
    let mode = if exec { 0o755 } else { 0o644 };
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

async fn provision(root: &Path, branch: &str) -> Worktree {
    provision_with(root, branch, None).await
}

async fn provision_with(root: &Path, branch: &str, setup: Option<&[&str]>) -> Worktree {
    RepoGit::for_repo(root)
        .provision(
            &request(branch, setup),
            &GitJails,
            &CancellationToken::new(),
        )
        .await
        .unwrap()
}

/// Non-ignored files under `dir` (path → (bytes, executable)), `.git` excluded.
fn snapshot(dir: &Path) -> BTreeMap<String, (Vec<u8>, bool)> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, (Vec<u8>, bool)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if name == ".git" || name == "ignored" || name.ends_with(".log") {
                continue;
            }
            let p = e.path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            if md.is_dir() {
                walk(base, &p, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
                let exec = md.permissions().mode() & 0o111 != 0;
                out.insert(rel, (std::fs::read(&p).unwrap(), exec));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Applies `patch` with `git apply --index` to a fresh clone of `root` at `onto` and returns
/// the clone's files.
fn apply_in_fresh_clone(root: &Path, onto: &str, patch: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let clone = tmp.path().join("clone");
    git(
        tmp.path(),
        &[
            "clone",
            "-q",
            "--no-checkout",
            root.to_str().unwrap(),
            "clone",
        ],
    );
    configure(&clone);
    git(&clone, &["checkout", "-q", "--detach", onto]);
    let pf = tmp.path().join("p.diff");
    std::fs::write(&pf, patch).unwrap();
    if !patch.is_empty() {
        git(&clone, &["apply", "--index", pf.to_str().unwrap()]);
    }
    (tmp, clone)
}

fn assert_round_trip(root: &Path, wt: &Worktree, patch: &str) {
    let (_tmp, clone) = apply_in_fresh_clone(root, &wt.base_commit, patch);
    let want = snapshot(&wt.path);
    let got = snapshot(&clone);
    let want_keys: Vec<_> = want.keys().collect();
    let got_keys: Vec<_> = got.keys().collect();
    assert_eq!(got_keys, want_keys, "file sets differ\n{patch}");
    for (k, v) in &want {
        assert!(got[k] == *v, "{k} differs (content or mode)\n{patch}");
    }
}

#[tokio::test]
async fn nothing_changed_gives_an_empty_patch() {
    let (_t, root) = repo_with(&[("a.rs", b"fn a() {}\n")]);
    let wt = provision(&root, "empty").await;
    // Ignored files alone are not a change.
    write(&wt.path, "build.log", b"noise");
    write(&wt.path, "ignored/x", b"noise");
    assert_eq!(wt.extract_patch().await.unwrap(), "");
    wt.cleanup().await.unwrap();
}

/// A setup step like an install: writes a marker file and touches a tracked file.
const SETUP: &[&str] = &[
    "sh",
    "-c",
    "echo installed > install-state.txt; echo '<!-- installed -->' >> README.md",
];

#[tokio::test]
async fn setup_output_is_not_in_the_patch_and_the_agents_change_is_and_applies_on_base() {
    let (_t, root) = repo_with(&[("README.md", b"hello\n"), ("src/a.rs", b"fn a() {}\n")]);
    let wt = provision_with(&root, "agent", Some(SETUP)).await;
    assert!(wt.path.join("install-state.txt").exists(), "setup ran");
    // The agent's work: an edit, a new file, a deletion.
    write(&wt.path, "src/a.rs", b"fn a() { todo!() }\n");
    write(&wt.path, "src/b.rs", b"fn b() {}\n");
    std::fs::remove_file(wt.path.join(".gitignore")).unwrap();
    let patch = wt.extract_patch().await.unwrap();
    assert!(
        patch.contains("src/a.rs") && patch.contains("src/b.rs"),
        "{patch}"
    );
    assert!(patch.contains("deleted file mode"), "{patch}");
    assert!(
        !patch.contains("install-state.txt"),
        "setup output leaked:\n{patch}"
    );
    assert!(
        !patch.contains("README.md"),
        "setup's touch leaked:\n{patch}"
    );
    let (_c, clone) = apply_in_fresh_clone(&root, &wt.base_commit, &patch);
    assert_eq!(
        std::fs::read(clone.join("src/a.rs")).unwrap(),
        b"fn a() { todo!() }\n"
    );
    assert_eq!(
        std::fs::read(clone.join("src/b.rs")).unwrap(),
        b"fn b() {}\n"
    );
    assert_eq!(std::fs::read(clone.join("README.md")).unwrap(), b"hello\n");
    assert!(!clone.join("install-state.txt").exists());
    assert!(!clone.join(".gitignore").exists());
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn an_agent_that_changed_nothing_after_setup_gets_an_empty_patch() {
    let (_t, root) = repo_with(&[("README.md", b"hello\n")]);
    let wt = provision_with(&root, "idle", Some(SETUP)).await;
    assert_eq!(wt.extract_patch().await.unwrap(), "");
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_path_both_setup_and_agent_changed_is_in_the_patch_from_the_base_commit() {
    let (_t, root) = repo_with(&[("README.md", b"hello\n")]);
    let wt = provision_with(&root, "both", Some(SETUP)).await;
    let mut readme = std::fs::read(wt.path.join("README.md")).unwrap();
    readme.extend_from_slice(b"agent line\n");
    write(&wt.path, "README.md", &readme);
    // The agent renames the setup's marker: the new path is the agent's, the marker never was
    // in the base commit, so the patch adds the new path and nothing else.
    std::fs::rename(wt.path.join("install-state.txt"), wt.path.join("state.out")).unwrap();
    let patch = wt.extract_patch().await.unwrap();
    assert!(!patch.contains("install-state.txt"), "{patch}");
    let (_c, clone) = apply_in_fresh_clone(&root, &wt.base_commit, &patch);
    assert_eq!(std::fs::read(clone.join("README.md")).unwrap(), readme);
    assert_eq!(
        std::fs::read(clone.join("state.out")).unwrap(),
        b"installed\n"
    );
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn patch_holds_commits_staged_unstaged_untracked_deletions_renames_modes_and_binaries() {
    let big: String = (0..200).map(|i| format!("line {i}\n")).collect();
    let (_t, root) = repo_with(&[
        ("committed.rs", b"old\n"),
        ("staged.rs", b"old\n"),
        ("unstaged.rs", b"old\n"),
        ("deleted.rs", b"bye\n"),
        ("renamed_from.rs", big.as_bytes()),
        ("script.sh", b"#!/bin/sh\necho hi\n"),
        ("data.bin", b"\x00\x01\x02"),
        ("notes.txt", b"one\r\ntwo\r\n"),
    ]);
    let wt = provision(&root, "all").await;
    let p = &wt.path;
    write(p, "committed.rs", b"new\n");
    git(p, &["commit", "-q", "-am", "agent commit"]);
    write(p, "staged.rs", b"new\n");
    git(p, &["add", "staged.rs"]);
    write(p, "unstaged.rs", b"new\n");
    write(p, "untracked/new.rs", b"brand new\n");
    std::fs::remove_file(p.join("deleted.rs")).unwrap();
    std::fs::rename(p.join("renamed_from.rs"), p.join("moved/renamed_to.rs")).unwrap_or_else(
        |_| {
            std::fs::create_dir_all(p.join("moved")).unwrap();
            std::fs::rename(p.join("renamed_from.rs"), p.join("moved/renamed_to.rs")).unwrap();
        },
    );
    set_exec(p, "script.sh", true);
    write(p, "data.bin", b"\x00\xff\xfe\x00 changed");
    write(p, "new.bin", &[0u8, 159, 146, 150, 0, 1]);
    write(p, "notes.txt", b"one\r\ntwo\r\nthree\r\n");
    write(p, "debug.log", b"ignored");

    let patch = wt.extract_patch().await.unwrap();
    for needle in [
        "diff --git a/committed.rs b/committed.rs",
        "diff --git a/staged.rs b/staged.rs",
        "diff --git a/unstaged.rs b/unstaged.rs",
        "diff --git a/untracked/new.rs b/untracked/new.rs",
        "deleted file mode 100644",
        "rename from renamed_from.rs",
        "rename to moved/renamed_to.rs",
        "new mode 100755",
        "GIT binary patch",
    ] {
        assert!(patch.contains(needle), "missing {needle:?}:\n{patch}");
    }
    assert!(
        !patch.contains("Binary files"),
        "binary diffs must be applicable"
    );
    assert!(!patch.contains("debug.log"));
    assert_round_trip(&root, &wt, &patch);
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn extraction_does_not_disturb_the_agents_index() {
    let (_t, root) = repo_with(&[("a.rs", b"a\n"), ("b.rs", b"b\n")]);
    let wt = provision(&root, "idx").await;
    write(&wt.path, "a.rs", b"staged\n");
    git(&wt.path, &["add", "a.rs"]);
    write(&wt.path, "b.rs", b"unstaged\n");
    write(&wt.path, "c.rs", b"untracked\n");
    // Relative to the worktree unless absolute (`--path-format` needs git 2.31).
    let index = wt
        .path
        .join(git(&wt.path, &["rev-parse", "--git-path", "index"]).trim());
    let before = std::fs::read(&index).unwrap();
    let status = git(&wt.path, &["status", "--porcelain"]);
    let patch = wt.extract_patch().await.unwrap();
    assert!(patch.contains("c.rs"));
    assert_eq!(std::fs::read(&index).unwrap(), before);
    assert_eq!(git(&wt.path, &["status", "--porcelain"]), status);
    let admin = index.parent().unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(admin)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("index.patch"))
        .collect();
    assert!(leftovers.is_empty(), "temporary index removed");
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn default_branch_advancing_mid_session_does_not_leak_into_the_patch() {
    let (_t, root) = repo_with(&[("shared.rs", b"v1\n")]);
    let wt = provision(&root, "moving").await;
    write(&wt.path, "agent.rs", b"agent work\n");
    // Meanwhile someone lands commits on main.
    write(&root, "upstream.rs", b"landed on main\n");
    write(&root, "shared.rs", b"v2\n");
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-q", "-m", "upstream"]);

    let patch = wt.extract_patch().await.unwrap();
    assert!(!patch.contains("upstream.rs"), "{patch}");
    assert!(!patch.contains("shared.rs"), "{patch}");
    assert_round_trip(&root, &wt, &patch);
    // And it applies on top of the new main without undoing it.
    let (_tmp, clone) = apply_in_fresh_clone(&root, "main", &patch);
    assert_eq!(
        std::fs::read(clone.join("upstream.rs")).unwrap(),
        b"landed on main\n"
    );
    assert_eq!(std::fs::read(clone.join("shared.rs")).unwrap(), b"v2\n");
    assert_eq!(
        std::fs::read(clone.join("agent.rs")).unwrap(),
        b"agent work\n"
    );
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn non_utf8_text_becomes_a_binary_patch_and_still_round_trips() {
    let (_t, root) = repo_with(&[("latin1.rs", b"caf\xe9\n")]);
    let wt = provision(&root, "latin1").await;
    write(&wt.path, "latin1.rs", b"caf\xe9 cr\xe8me\nna\xefve\n");
    write(&wt.path, "new_latin1.rs", b"\xa9 2024\n");
    write(&wt.path, "plain.rs", b"ok \xc3\xa9\n");
    let patch = wt.extract_patch().await.unwrap();
    assert!(patch.contains("diff --git a/latin1.rs b/latin1.rs\nindex "));
    assert!(
        patch.contains("+ok é"),
        "valid UTF-8 text stays a text hunk"
    );
    assert_eq!(patch.matches("GIT binary patch").count(), 2, "{patch}");
    assert_round_trip(&root, &wt, &patch);
    wt.cleanup().await.unwrap();
}

#[tokio::test]
async fn non_utf8_and_unusual_paths_are_quoted_ascii() {
    let (_t, root) = repo_with(&[("a.rs", b"a\n")]);
    let wt = provision(&root, "paths").await;
    write(&wt.path, "caf\u{e9} dir/fichier \u{e9}t\u{e9}.rs", b"x\n");
    let raw = std::ffi::OsStr::from_encoded_bytes_unchecked_safe(b"raw\xff.rs");
    std::fs::write(wt.path.join(raw), b"y\n").unwrap();
    let patch = wt.extract_patch().await.unwrap();
    assert!(patch.is_ascii(), "{patch}");
    assert_round_trip(&root, &wt, &patch);
    wt.cleanup().await.unwrap();
}

/// `OsStr::from_bytes` under a name that reads well in the test above.
trait FromBytes {
    fn from_encoded_bytes_unchecked_safe(b: &[u8]) -> &std::ffi::OsStr;
}
impl FromBytes for std::ffi::OsStr {
    fn from_encoded_bytes_unchecked_safe(b: &[u8]) -> &std::ffi::OsStr {
        std::os::unix::ffi::OsStrExt::from_bytes(b)
    }
}

#[tokio::test]
async fn a_two_hundred_megabyte_diff_is_extracted_whole() {
    let (_t, root) = repo_with(&[("a.rs", b"a\n")]);
    let wt = provision(&root, "huge").await;
    // 200 MiB of distinct text lines, written in one go.
    let mut big = Vec::with_capacity(210 << 20);
    let mut i = 0u64;
    while big.len() < 200 << 20 {
        big.extend_from_slice(
            format!("{i:016x} the quick brown fox jumps over the lazy dog\n").as_bytes(),
        );
        i += 1;
    }
    let lines = i;
    std::fs::write(wt.path.join("huge.txt.rs"), &big).unwrap();
    drop(big);
    let patch = wt.extract_patch().await.unwrap();
    assert!(patch.len() > 200 << 20, "{}", patch.len());
    assert_eq!(
        patch.matches('\n').count() as u64,
        lines + 6,
        "6 header lines + one per line"
    );
    assert!(patch.ends_with(&format!(
        "+{:016x} the quick brown fox jumps over the lazy dog\n",
        lines - 1
    )));
    drop(patch);
    wt.cleanup().await.unwrap();
}

/// Small deterministic RNG so a failing seed reproduces.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Content for a file, in the form an editor following `.gitattributes` would write it.
fn content(rng: &mut Rng, path: &str) -> Vec<u8> {
    let lines = rng.below(12);
    if path.ends_with(".bin") || path.ends_with(".dat") {
        let mut v: Vec<u8> = (0..rng.below(300)).map(|_| rng.next() as u8).collect();
        if path.ends_with(".dat") {
            v.push(0); // NUL: git detects binary without an attribute
        }
        return v;
    }
    let mut out = Vec::new();
    for i in 0..lines {
        let mut line = format!("line {} {}", i, rng.below(5)).into_bytes();
        if path.ends_with(".rs") && rng.chance(10) {
            line.extend_from_slice(b" caf\xe9"); // Latin-1: not UTF-8
        }
        out.extend_from_slice(&line);
        if path.ends_with(".txt") {
            out.extend_from_slice(b"\r\n"); // eol=crlf files are CRLF in the worktree
        } else if rng.chance(15) {
            out.extend_from_slice(b"\r\n"); // no attribute: CRLF kept verbatim
        } else {
            out.push(b'\n');
        }
    }
    if path.ends_with(".md") && !out.is_empty() && rng.chance(50) {
        out.pop(); // no newline at end of file
    }
    out
}

fn random_path(rng: &mut Rng) -> String {
    let dirs = ["", "src/", "src/deep/", "docs/"];
    let exts = ["rs", "txt", "bin", "dat", "md"];
    format!(
        "{}f{}.{}",
        dirs[rng.below(dirs.len() as u64) as usize],
        rng.below(1000),
        exts[rng.below(exts.len() as u64) as usize]
    )
}

async fn random_session(seed: u64) {
    let mut rng = Rng(seed | 1);
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for _ in 0..(3 + rng.below(10)) {
        let p = random_path(&mut rng);
        let c = content(&mut rng, &p);
        files.push((p, c));
    }
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_slice()))
        .collect();
    let (_t, root) = repo_with(&refs);
    for (p, _) in &files {
        if rng.chance(20) {
            set_exec(&root, p, true);
        }
    }
    git(&root, &["commit", "-q", "-am", "modes", "--allow-empty"]);
    let wt = provision(&root, &format!("prop{seed}")).await;
    let w = &wt.path;
    let tracked = |w: &Path| -> Vec<String> {
        snapshot(w)
            .into_keys()
            .filter(|k| !k.starts_with(".git"))
            .collect()
    };
    for step in 0..(4 + rng.below(12)) {
        let existing = tracked(w);
        let pick = |rng: &mut Rng| {
            existing
                .get(rng.below(existing.len().max(1) as u64) as usize)
                .cloned()
        };
        match rng.below(10) {
            0 | 1 => {
                if let Some(p) = pick(&mut rng) {
                    let c = content(&mut rng, &p);
                    write(w, &p, &c);
                }
            }
            2 => {
                let p = random_path(&mut rng);
                let c = content(&mut rng, &p);
                write(w, &p, &c);
            }
            3 => {
                if let Some(p) = pick(&mut rng) {
                    std::fs::remove_file(w.join(p)).unwrap();
                }
            }
            4 => {
                if let Some(p) = pick(&mut rng) {
                    // Keep the extension so attributes (and thus the bytes) stay the same.
                    let ext = p.rsplit('.').next().unwrap().to_string();
                    let to = format!("moved/r{}.{ext}", rng.below(1000));
                    std::fs::create_dir_all(w.join("moved")).unwrap();
                    std::fs::rename(w.join(&p), w.join(to)).unwrap();
                }
            }
            5 => {
                if let Some(p) = pick(&mut rng) {
                    let exec =
                        std::fs::metadata(w.join(&p)).unwrap().permissions().mode() & 0o111 != 0;
                    set_exec(w, &p, !exec);
                }
            }
            6 => {
                git(w, &["add", "-A"]);
                git(w, &["commit", "-q", "-m", "agent", "--allow-empty"]);
            }
            7 => {
                if let Some(p) = pick(&mut rng) {
                    git(w, &["add", "-A", "--", &p]);
                }
            }
            8 => write(w, &format!("ignored/x{}.rs", rng.below(9)), b"ignored"),
            _ => {
                // main moves on meanwhile; the step in the content makes every such commit
                // change something even when the random name repeats (else "nothing to commit").
                write(
                    &root,
                    &format!("upstream{}.md", rng.below(1000)),
                    format!("upstream {step}\n").as_bytes(),
                );
                git(&root, &["add", "-A"]);
                git(&root, &["commit", "-q", "-m", "upstream"]);
            }
        }
    }
    let patch = wt.extract_patch().await.unwrap();
    assert_round_trip(&root, &wt, &patch);
    wt.cleanup().await.unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        max_shrink_iters: 0,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_sessions_round_trip_through_git_apply_index(seed in any::<u64>()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(random_session(seed));
    }
}

/// What the agent wrote into its clone's git config (`core.fsmonitor`, a clean filter, hooks)
/// runs when git stages the clone, which the adapter does for the patch: it can touch nothing
/// outside the clone, whatever the provision's settings (the clone may be swept later by a
/// `sandbox: false` adapter). Plain git on the host in the same clone is shown to run it, so
/// the check can fail.
#[tokio::test]
async fn the_agents_git_config_in_its_clone_never_runs_outside_the_sandbox_during_extraction() {
    let (t, root) = repo_with(&[("README.md", b"hello\n")]);
    let marker = t.path().join("pwned");
    let wt = RepoGit::for_repo(&root)
        .provision(&request("cfg", None), &GitJails, &CancellationToken::new())
        .await
        .unwrap();
    let touch = format!("touch {}", marker.display());
    git(&wt.path, &["config", "core.fsmonitor", &touch]);
    git(
        &wt.path,
        &["config", "filter.x.clean", &format!("sh -c '{touch}; cat'")],
    );
    write(&wt.path, ".gitattributes", b"*.txt filter=x\n");
    write(&wt.path, "a.txt", b"work\n");
    let control = std::process::Command::new("git")
        .args(["diff-files", "--quiet"])
        .current_dir(&wt.path)
        .status()
        .unwrap();
    assert!(control.code().is_some());
    assert!(marker.exists(), "host git in the clone runs its config");
    std::fs::remove_file(&marker).unwrap();
    let patch = wt.extract_patch().await.unwrap();
    assert!(patch.contains("a.txt"), "{patch}");
    assert!(!marker.exists());
    wt.cleanup().await.unwrap();
}

/// The seed CI once drew: main's side wrote the same upstream file twice, which must still
/// move main (it made "nothing to commit" and failed the run, not the adapter).
#[tokio::test]
async fn random_session_where_main_rewrites_the_same_upstream_file() {
    random_session(6697906693330502820).await;
}

/// The agent's clone can name any host path as an object store it borrows. Reading a non-UTF-8
/// file's blobs for its binary patch must not follow that on the host, outside the clone's jail
/// and past `extractionTimeout`: here the store named holds an `info/alternates` that is a
/// FIFO, which blocks whoever opens it. The extraction finishes, with the right patch, well
/// within the bound; if it does not, the FIFO is unblocked so that the failure ends the test.
#[tokio::test]
async fn a_non_utf8_patch_is_read_without_opening_what_the_agents_alternates_name_on_the_host() {
    let (t, root) = repo_with(&[("latin1.rs", b"caf\xe9\n")]);
    let wt = provision(&root, "alt-fifo").await;
    write(&wt.path, "latin1.rs", b"caf\xe9 cr\xe8me\n");
    let elsewhere = t.path().join("elsewhere");
    std::fs::create_dir_all(elsewhere.join("info")).unwrap();
    let fifo = elsewhere.join("info/alternates");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let alternates = wt.path.join(".git/objects/info/alternates");
    let mut listed = std::fs::read(&alternates).unwrap();
    listed.extend_from_slice(format!("{}\n", elsewhere.display()).as_bytes());
    std::fs::write(&alternates, listed).unwrap();

    let read = tokio::time::timeout(std::time::Duration::from_secs(20), wt.extract_patch()).await;
    let Ok(patch) = read else {
        // A reader blocked in open(2) gets end of file once a writer has come and gone.
        let mut open = std::fs::OpenOptions::new();
        std::os::unix::fs::OpenOptionsExt::custom_flags(open.write(true), libc::O_NONBLOCK);
        drop(open.open(&fifo));
        panic!("the extraction blocked on {}", fifo.display());
    };
    let patch = patch.unwrap();
    assert_eq!(patch.matches("GIT binary patch").count(), 1, "{patch}");
    assert_round_trip(&root, &wt, &patch);
    wt.cleanup().await.unwrap();
}
