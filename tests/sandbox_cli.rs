//! The sandbox settings and egress proxy built by `sandbox::SessionSandbox`, tried through the
//! real Claude Code CLI and real bubblewrap: the fake model runs each boundary with Bash
//! (`__test__/support/sandbox-probe.mjs`). Linux only (bubblewrap); skipped nowhere else.
#![cfg(target_os = "linux")]

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use claude_runtime_adapter::config::SandboxConfig;
use claude_runtime_adapter::sandbox::{
    BranchSnapshot, EgressAttempt, Leftovers, SessionSandbox, SessionScope, WorktreeGit,
};
use common::{configure, git};
use serde_json::Value;

struct Probe {
    results: Vec<(bool, String)>,
    ok: bool,
}

/// Runs `cmds` through the CLI in `cwd` with the sandbox's settings.
fn probe(
    cwd: &Path,
    sandbox: &SessionSandbox,
    env: &[(String, String)],
    cmds: &[&str],
    disable: bool,
) -> Probe {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("__test__/support/sandbox-probe.mjs");
    let env_json: serde_json::Map<String, Value> = env
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let out = std::process::Command::new("node")
        .arg(script)
        .arg(cwd)
        .args(cmds)
        .env("PROBE_SETTINGS", sandbox.settings_arg())
        .env("PROBE_ENV", Value::Object(env_json).to_string())
        .env("PROBE_DISABLE_SANDBOX", if disable { "1" } else { "0" })
        .output()
        .expect("run node");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("probe output: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(v.get("error").is_none(), "probe failed: {v}");
    Probe {
        results: v["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["is_error"].as_bool().unwrap(),
                    r["text"].as_str().unwrap().to_string(),
                )
            })
            .collect(),
        ok: v["result"]["structured_output"]["ok"] == true,
    }
}

/// A repository with a bare local origin and an Implementor worktree on `agent/s1`; `main` is
/// packed (as after a clone) and also has a loose ref, `other` is packed only.
struct Repo {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    origin: PathBuf,
    worktree: PathBuf,
    home: PathBuf,
}

fn repo() -> Repo {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    let (root, origin, home) = (
        base.join("repo"),
        base.join("origin.git"),
        base.join("home"),
    );
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    std::fs::write(
        home.join(".aws/credentials"),
        "aws_secret_access_key=planted\n",
    )
    .unwrap();
    git(&base, &["init", "-q", "--bare", origin.to_str().unwrap()]);
    git(&root, &["init", "-q", "-b", "main"]);
    configure(&root);
    std::fs::write(root.join("README.md"), "r\n").unwrap();
    git(&root, &["add", "."]);
    git(&root, &["commit", "-qm", "init"]);
    git(
        &root,
        &["remote", "add", "origin", origin.to_str().unwrap()],
    );
    git(&root, &["push", "-q", "origin", "main"]);
    git(&root, &["branch", "other"]);
    git(&root, &["pack-refs", "--all"]);
    git(&root, &["update-ref", "refs/heads/main", "HEAD"]);
    git(
        &root,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "agent/s1",
            ".worktrees/agent/s1",
            "main",
        ],
    );
    let worktree = root.join(".worktrees/agent/s1");
    Repo {
        _tmp: tmp,
        root,
        origin,
        worktree,
        home,
    }
}

/// A local HTTP server counting the connections it gets.
fn http_server() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            h.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n",
            );
        }
    });
    (port, hits)
}

fn cli_env(home: &Path) -> Vec<(String, String)> {
    vec![
        ("HOME".into(), home.to_string_lossy().into_owned()),
        ("GITHUB_TOKEN".into(), "ghp_planted_engine_token".into()),
    ]
}

/// The names the CLI gets from `offlineCliEnv` that the settings must know about.
fn settings_env(home: &Path) -> Vec<(String, String)> {
    let mut env = cli_env(home);
    env.push((
        "ANTHROPIC_API_KEY".into(),
        "sk-ant-fake-key-for-tests".into(),
    ));
    env
}

fn rev(dir: &Path, r: &str) -> String {
    git(dir, &["rev-parse", r]).trim().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn implementor_commits_on_its_branch_and_nothing_else_changes() {
    let r = repo();
    let (main0, other0, origin0) = (
        rev(&r.root, "main"),
        rev(&r.root, "other"),
        rev(&r.origin, "main"),
    );
    let (port, hits) = http_server();
    let attempts: Arc<Mutex<Vec<EgressAttempt>>> = Arc::default();
    let sink_attempts = attempts.clone();
    let git_dirs = WorktreeGit::discover(&r.worktree, "agent/s1").unwrap();
    let scope = SessionScope {
        cwd: r.worktree.clone(),
        git: Some(git_dirs.clone()),
    };
    let snapshot = BranchSnapshot::take(&r.root).await.unwrap();
    let sandbox = SessionSandbox::start(
        &SandboxConfig::default(),
        &scope,
        &settings_env(&r.home),
        Some(Arc::new(move |a: &EgressAttempt| {
            sink_attempts.lock().unwrap().push(a.clone())
        })),
    )
    .await
    .unwrap();
    let readme = r.root.join("README.md");
    let beside = r.root.parent().unwrap().join("beside.txt");
    let cmds = [
        "echo a > a.txt && git add a.txt && git commit -qm a && git log -1 --format=%s".to_string(),
        format!("echo x >> {}", readme.display()),
        format!("echo y > {}", beside.display()),
        "git push origin HEAD:refs/heads/newb".into(),
        "git push -f origin HEAD:main".into(),
        "git update-ref refs/heads/main HEAD".into(),
        "git update-ref refs/heads/other HEAD; git branch -f other HEAD".into(),
        "git checkout -q -b x2 && echo b > b.txt && git add b.txt && git commit -qm b && git checkout -q agent/s1 && echo switched".into(),
        "env".into(),
        format!("curl -sSf -m 5 --noproxy '' http://127.0.0.1:{port}/"),
        format!("git -c http.proxy=$HTTPS_PROXY ls-remote http://127.0.0.1:{port}/r.git"),
        format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"),
        format!("cat {}/.aws/credentials", r.home.display()),
    ];
    let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
    let p = tokio::task::block_in_place(|| {
        probe(&r.worktree, &sandbox, &cli_env(&r.home), &cmds, true)
    });
    assert!(p.ok, "session did not finish: {:?}", p.results);
    let res = &p.results;
    assert_eq!(res[0], (false, "a".to_string()), "commit on own branch");
    for (i, what) in [
        (1, "engine checkout"),
        (2, "beside the repo"),
        (3, "push new branch"),
        (4, "force push main"),
        (5, "update main"),
    ] {
        assert!(res[i].0, "{what} should fail: {:?}", res[i]);
    }
    assert!(res[1].1.contains("Read-only file system"), "{:?}", res[1]);
    assert!(res[7].1.contains("switched"), "{:?}", res[7]);
    assert!(
        !res[8].1.contains("ghp_planted") && !res[8].1.contains("sk-ant-fake"),
        "env leaked: {}",
        res[8].1
    );
    assert!(res[8].1.contains("PATH="), "env ran: {}", res[8].1);
    for i in [9, 10, 11, 12] {
        assert!(res[i].0, "should fail: {:?}", res[i]);
    }
    assert!(!res[12].1.contains("planted"));
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the local server saw a connection"
    );
    assert!(
        attempts
            .lock()
            .unwrap()
            .iter()
            .any(|a| !a.allowed && a.port == port),
        "{:?}",
        attempts.lock().unwrap()
    );
    assert_eq!(std::fs::read_to_string(&readme).unwrap(), "r\n");
    assert!(!beside.exists());
    assert_eq!(
        (
            rev(&r.root, "main"),
            rev(&r.root, "other"),
            rev(&r.origin, "main")
        ),
        (main0, other0, origin0)
    );
    assert_eq!(
        git(&r.origin, &["for-each-ref", "--format=%(refname)"]).trim(),
        "refs/heads/main"
    );
    assert_ne!(
        rev(&r.root, "agent/s1"),
        rev(&r.root, "main"),
        "the branch has the agent's commit"
    );
    let removed = snapshot.remove_agent_branches(&git_dirs).await.unwrap();
    assert_eq!(removed, vec!["x2".to_string()]);
    let left = git(
        &r.root,
        &["for-each-ref", "--format=%(refname:strip=2)", "refs/heads"],
    );
    assert_eq!(
        left.split_whitespace().collect::<Vec<_>>(),
        ["agent/s1", "main", "other"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allowed_host_is_reached_through_the_egress_proxy() {
    let r = repo();
    let (port, hits) = http_server();
    let cfg = SandboxConfig {
        allowed_domains: vec!["127.0.0.1".into()],
        allow_write: vec![],
    };
    let scope = SessionScope {
        cwd: r.root.clone(),
        git: None,
    };
    let sandbox = SessionSandbox::start(&cfg, &scope, &settings_env(&r.home), None)
        .await
        .unwrap();
    let cmd = format!("curl -sSf -m 5 --noproxy '' http://127.0.0.1:{port}/");
    let p =
        tokio::task::block_in_place(|| probe(&r.root, &sandbox, &cli_env(&r.home), &[&cmd], false));
    assert_eq!(p.results[0], (false, "hello".to_string()));
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn planner_or_reviewer_cannot_write_into_the_repository() {
    let r = repo();
    let main0 = rev(&r.root, "main");
    let scope = SessionScope {
        cwd: r.root.clone(),
        git: None,
    };
    let sandbox = SessionSandbox::start(
        &SandboxConfig::default(),
        &scope,
        &settings_env(&r.home),
        None,
    )
    .await
    .unwrap();
    let cmds = [
        "echo x >> README.md",
        "git branch newp",
        "touch .git/planted",
        "echo t > .worktrees/agent/s1/t.txt",
        "echo ok > $TMPDIR/scratch && cat $TMPDIR/scratch",
    ];
    let leftovers = Leftovers::record(&scope);
    let p =
        tokio::task::block_in_place(|| probe(&r.root, &sandbox, &cli_env(&r.home), &cmds, true));
    for (cmd, res) in cmds.iter().zip(&p.results).take(4) {
        assert!(res.0, "{cmd} should fail: {res:?}");
    }
    assert_eq!(
        p.results[4],
        (false, "ok".to_string()),
        "temp dirs stay writable"
    );
    assert_eq!(
        std::fs::read_to_string(r.root.join("README.md")).unwrap(),
        "r\n"
    );
    assert!(!r.root.join(".git/planted").exists() && !r.worktree.join("t.txt").exists());
    assert_eq!(rev(&r.root, "main"), main0);
    assert!(git(&r.root, &["branch", "--list", "newp"])
        .trim()
        .is_empty());
    leftovers.remove();
    for p in [
        ".claude",
        ".git/glab-cli",
        ".git/config.worktree",
        ".git/objects/info/alternates",
    ] {
        assert!(!r.root.join(p).exists(), "{p} left in the repository");
    }
}
