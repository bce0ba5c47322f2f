//! The repository's history for a pod, on demand. A pod starts with the tree it works on and
//! nothing older: one commit, packed alone (its size is the tree's, whatever the history's),
//! the checkout shallow at it. The history comes only when the agent's git asks for it: the
//! runtime's `git` (first on the pod's PATH, `image/git-history`) deepens the checkout before a
//! command that reads history (`git log`, `show`, `blame`, a diff against `main~5`), by a
//! `git fetch --unshallow` whose transport is the session's stream to a [`HistoryServer`] here.
//!
//! The server runs `git upload-pack` on a repository of its own that borrows the repository's
//! objects and has exactly one ref, `defaultBranch` at the session's commit: protocol v0
//! upload-pack refuses any want it does not advertise, so a pod gets what that commit reaches
//! and nothing else (no other branch, no commit made since), read-only (no receive-pack).
//!
//! That refusal is upload-pack's own, which the engine's git config could lift
//! (`uploadpack.allowAnySHA1InWant`, `allowReachableSHA1InWant`, `allowTipSHA1InWant`: a pod would
//! fetch any object of the repository by its id) or bend (`uploadpack.packObjectsHook` runs a
//! program of that config's choosing). So upload-pack reads no config of the engine's: not the
//! system's or the user's files, not `GIT_CONFIG_*` in the environment; and those three settings
//! are set false on its command line, which outranks any file, the served repository's own
//! config too (`git init` may have copied one from the engine's template directory).
//!
//! A pod starts one upload-pack per connection to its socket, and nothing stops it from opening
//! hundreds. At most [`MAX_UPLOAD_PACKS`] run for a session at once; a connection beyond them is
//! closed at once, not queued. That costs a well-behaved pod nothing: its runtime `git` fetches
//! the history once, by one connection, and a fetch that fails leaves it working, as git does in
//! any shallow clone, on the history that ends at the session's commit.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;

use crate::error::{AdapterError, ErrorCode, Result};
use crate::git::command::{git_command, run_git};
use crate::git::RepoGit;
use crate::scratch::ScratchDir;

/// The socket's name in the pod's socket directory.
pub const SOCKET: &str = "git.sock";
/// The pod's remote: `ext::` runs this (no shell quoting: `% ` is a space) and speaks the
/// pack protocol over its stdio, tunnelled to the engine by the pod agent. The socket directory
/// is the jail's mount point, or where a pod without a jail has it (`CRA_SOCKET_DIR`).
/// socat's default end (half a second after one side closes) ends it when the engine has sent
/// everything: git, which holds its side open, would otherwise wait for it.
pub const REMOTE_URL: &str =
    "ext::sh -c exec% socat% -% UNIX-CONNECT:${CRA_SOCKET_DIR:-/run/claude-runtime-adapter}/git.sock";
/// How many upload-packs one session's pod may have running at once (the module docs).
pub const MAX_UPLOAD_PACKS: usize = 2;
/// Settings that would let upload-pack send an object it does not advertise, as `-c`.
const WANTS_ADVERTISED_ONLY: &[&str] = &[
    "-c",
    "uploadpack.allowAnySHA1InWant=false",
    "-c",
    "uploadpack.allowReachableSHA1InWant=false",
    "-c",
    "uploadpack.allowTipSHA1InWant=false",
];
/// An idle upload-pack ends after this long (seconds): a stuck pod holds no process here.
const UPLOAD_PACK_TIMEOUT_S: &str = "600";

/// One session's history server: its repository and socket in a directory of its own, removed
/// with it; the listener (and any upload-pack still running) ends when this is dropped.
pub struct HistoryServer {
    dir: ScratchDir,
    task: JoinHandle<()>,
}

impl HistoryServer {
    /// Serves `commit` as `refs/heads/<branch>` of `repo_root`'s objects.
    pub async fn start(repo_root: &Path, branch: &str, commit: &str) -> Result<HistoryServer> {
        let fail = |what: &str| {
            let what = what.to_string();
            move |e| AdapterError::new(ErrorCode::Provision, what).with_cause(e)
        };
        // Removed on every failure below as on drop.
        let mut server = HistoryServer {
            dir: ScratchDir::create("history").map_err(|e| {
                AdapterError::new(
                    ErrorCode::Provision,
                    "cannot make the directory of a pod's history server",
                )
                .with_cause(e)
            })?,
            task: tokio::spawn(async {}),
        };
        let served = server.dir.path().join("repo");
        RepoGit::for_repo(repo_root)
            .init_borrowing(&served)
            .await
            .map_err(fail(
                "cannot make the repository a pod's history is served from",
            ))?;
        let head = format!("refs/heads/{branch}");
        for args in [
            vec!["update-ref", head.as_str(), commit],
            vec!["symbolic-ref", "HEAD", head.as_str()],
        ] {
            run_git(&served, &args)
                .await
                .map_err(fail("cannot set the served repository's branch"))?;
        }
        let socket = server.socket();
        let listener = UnixListener::bind(&socket).map_err(|e| {
            AdapterError::new(
                ErrorCode::Provision,
                format!("cannot listen on {}", socket.display()),
            )
            .with_cause(e)
        })?;
        server.task = tokio::spawn(serve(listener, served));
        Ok(server)
    }

    /// The engine-side socket the pod's `git.sock` is tunnelled to.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join(SOCKET)
    }
}

impl Drop for HistoryServer {
    fn drop(&mut self) {
        // The directory goes with `dir`, after the listener.
        self.task.abort();
    }
}

/// Each connection: one `git upload-pack` of `served`, killed when the connection or the
/// server ends; beyond [`MAX_UPLOAD_PACKS`] running, the connection is closed.
async fn serve(listener: UnixListener, served: PathBuf) {
    let mut running = tokio::task::JoinSet::new();
    while let Ok((conn, _)) = listener.accept().await {
        while running.try_join_next().is_some() {}
        if running.len() >= MAX_UPLOAD_PACKS {
            drop(conn);
            continue;
        }
        running.spawn(upload_pack(conn, served.clone()));
    }
}

async fn upload_pack(conn: UnixStream, served: PathBuf) {
    let timeout = format!("--timeout={UPLOAD_PACK_TIMEOUT_S}");
    let args = WANTS_ADVERTISED_ONLY.iter().copied().chain([
        "upload-pack",
        "--strict",
        &timeout,
        // --strict: exactly this git dir (the served repository is not bare).
        ".git",
    ]);
    let mut cmd = git_command(&served, &args.collect::<Vec<_>>());
    // No config of the engine's (module docs): the system's and the user's files, and any the
    // environment carries (`GIT_CONFIG_PARAMETERS`, `GIT_CONFIG_COUNT` and its keys and values).
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("GIT_CONFIG") {
            cmd.env_remove(name);
        }
    }
    cmd.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null");
    // Protocol v0 (no GIT_PROTOCOL): it refuses wants it did not advertise.
    cmd.env_remove("GIT_PROTOCOL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let Ok(mut child) = cmd.spawn() else {
        tracing::warn!(repo = %served.display(), "cannot start git upload-pack for a pod's history");
        return;
    };
    let (Some(mut stdin), Some(mut stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return;
    };
    let (mut rd, mut wr) = conn.into_split();
    let to_git = async {
        let _ = tokio::io::copy(&mut rd, &mut stdin).await;
        drop(stdin);
    };
    let from_git = async {
        let _ = tokio::io::copy(&mut stdout, &mut wr).await;
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut wr).await;
    };
    // upload-pack ends the exchange: once its output is all sent, so is the connection (the
    // pod may keep its side open); a pod that closes first still gets what git writes.
    tokio::pin!(to_git, from_git);
    tokio::select! {
        _ = &mut to_git => from_git.await,
        _ = &mut from_git => {}
    }
    let _ = child.kill().await;
}
