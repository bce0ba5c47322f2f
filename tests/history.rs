//! A pod's history server (`environment::kubernetes::history`) against real git, reached the
//! way a pod reaches it: `git fetch` over the pod's `ext::` remote (socat to the socket), or a
//! bare connection reading upload-pack's first bytes.
//!
//! Its own test binary: the engine's git config is played by this process's environment
//! (`GIT_CONFIG_GLOBAL`, `GIT_CONFIG_COUNT`/`KEY`/`VALUE`), which every git started here
//! inherits once it is set, so only tests that do not care about it share the process.
#![cfg(unix)]

use std::path::Path;
use std::time::Duration;

use claude_runtime_adapter::environment::kubernetes::history::{
    HistoryServer, MAX_UPLOAD_PACKS, REMOTE_URL,
};
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;

mod common;
use common::{configure, git};

/// A repository whose `main` has three commits, and a branch `other` with a commit `main` does
/// not reach: (root, main's tip, other's tip).
fn repo() -> (tempfile::TempDir, std::path::PathBuf, String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    std::fs::create_dir(&root).unwrap();
    git(&root, &["init", "-q", "-b", "main"]);
    configure(&root);
    for i in 0..3 {
        std::fs::write(root.join("f"), format!("{i}\n")).unwrap();
        git(&root, &["add", "f"]);
        git(&root, &["commit", "-qm", &format!("c{i}")]);
    }
    let main = git(&root, &["rev-parse", "main"]).trim().to_string();
    git(&root, &["checkout", "-qb", "other"]);
    std::fs::write(root.join("secret"), "not for the pod\n").unwrap();
    git(&root, &["add", "secret"]);
    git(&root, &["commit", "-qm", "other"]);
    let other = git(&root, &["rev-parse", "other"]).trim().to_string();
    git(&root, &["checkout", "-q", "main"]);
    (tmp, root, main, other)
}

/// `git fetch <the pod's remote> <what>` into `client`, as the pod's runtime git does it.
async fn fetch(client: &Path, server: &HistoryServer, what: &str) -> std::process::Output {
    tokio::process::Command::new("git")
        .args([
            "-c",
            "protocol.ext.allow=always",
            "fetch",
            "-q",
            REMOTE_URL,
            what,
        ])
        .current_dir(client)
        .env("CRA_SOCKET_DIR", server.socket().parent().unwrap())
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .await
        .unwrap()
}

/// The engine's git allows any object id in a want, in its global config and in the config
/// its environment carries; the pod still gets only what the served commit reaches.
#[tokio::test]
async fn a_pod_fetches_only_what_the_commit_reaches_whatever_the_engines_git_config_allows() {
    let (t, root, main, other) = repo();
    let global = t.path().join("engine-gitconfig");
    std::fs::write(
        &global,
        "[uploadpack]\n\tallowAnySHA1InWant = true\n\tallowReachableSHA1InWant = true\n",
    )
    .unwrap();
    // std's environment lock keeps this safe against the processes other tests start.
    std::env::set_var("GIT_CONFIG_GLOBAL", &global);
    std::env::set_var("GIT_CONFIG_COUNT", "1");
    std::env::set_var("GIT_CONFIG_KEY_0", "uploadpack.allowAnySHA1InWant");
    std::env::set_var("GIT_CONFIG_VALUE_0", "true");

    let server = HistoryServer::start(&root, "main", &main).await.unwrap();
    let client = t.path().join("client");
    git(t.path(), &["init", "-q", "client"]);

    let refused = fetch(&client, &server, &other).await;
    assert!(
        !refused.status.success(),
        "a commit main does not reach was served"
    );
    let listed = git(
        &client,
        &["cat-file", "--batch-all-objects", "--batch-check"],
    );
    assert!(!listed.contains(&other), "{listed}");

    let served = fetch(&client, &server, "main").await;
    assert!(
        served.status.success(),
        "{}",
        String::from_utf8_lossy(&served.stderr)
    );
    assert_eq!(git(&client, &["rev-parse", "FETCH_HEAD"]).trim(), main);
    assert_eq!(
        git(&client, &["rev-list", "--count", "FETCH_HEAD"]).trim(),
        "3"
    );
}

/// What a connection gets first: upload-pack's advertisement (a pkt-line: four hex digits), or
/// the end of the stream when it was refused.
async fn first_bytes(conn: &mut UnixStream) -> Option<Vec<u8>> {
    let mut buf = vec![0; 4];
    match tokio::time::timeout(Duration::from_secs(20), conn.read(&mut buf)).await {
        Ok(Ok(0)) => None,
        Ok(Ok(n)) => Some(buf[..n].to_vec()),
        Ok(Err(e)) => panic!("reading the history server: {e}"),
        Err(_) => panic!("the history server neither answered nor closed a connection"),
    }
}

/// Ten connections at once: the first few get an upload-pack, the rest are closed at once
/// rather than queued; once those end, a new connection is served again.
#[tokio::test]
async fn a_pod_gets_at_most_a_few_upload_packs_at_once_and_more_once_they_end() {
    let (_t, root, main, _) = repo();
    let server = HistoryServer::start(&root, "main", &main).await.unwrap();
    let mut conns = Vec::new();
    for _ in 0..10 {
        conns.push(UnixStream::connect(server.socket()).await.unwrap());
    }
    let mut answered = Vec::new();
    for conn in &mut conns {
        answered.push(first_bytes(conn).await);
    }
    let served = answered.iter().filter(|a| a.is_some()).count();
    assert_eq!(served, MAX_UPLOAD_PACKS, "{answered:?}");
    assert!(answered[..MAX_UPLOAD_PACKS].iter().all(|a| a
        .as_ref()
        .is_some_and(|b| b.iter().all(u8::is_ascii_hexdigit))));

    drop(conns);
    // The ended upload-packs are let go as soon as git sees its input end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut conn = UnixStream::connect(server.socket()).await.unwrap();
        if first_bytes(&mut conn).await.is_some() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no connection was served after the earlier ones ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
