//! The repository into the pod and the agent's work out of it: [`send_repository`] packs the
//! default branch's commit alone and checks it out in the pod; [`EXTRACT_SCRIPT`] stages the
//! work there and streams it back as a bundle, which a [`Scratch`] repository on the engine
//! turns into the patch with the local backend's own `patch_of_trees`: the same bytes by
//! construction.

use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::history;
use super::layout::WORKDIR;
use super::steps::{provision_error, sh_quote, Steps, MAX_STEP_OUTPUT, STEP_TIMEOUT};
use crate::environment::remote::RemoteCommand;
use crate::error::{AdapterError, Result};
use crate::git::command::{git_command, run_git, At};
use crate::git::patch::patch_of_trees;
use crate::git::RepoGit;
use crate::scratch::ScratchDir;

/// The largest bundle of the agent's work read back (a checkout's whole new content).
pub(super) const MAX_WORK_BUNDLE: u64 = 4 << 30;

/// Extraction in the jail: stage everything into a temporary index (the agent's index copied
/// only when it is a regular file, its mtime capped at `$3` so that git compares by content
/// every entry recorded since the snapshot: `git::patch`'s module docs), commit the final
/// tree, and write a bundle of the snapshot and final commits to stdout. `$1` base, `$2`
/// snapshot commit, `$3` the snapshot's trust limit (Unix seconds).
pub(super) const EXTRACT_SCRIPT: &str = r#"set -e
i=/tmp/cra-final.index
if [ -f .git/index ] && [ ! -L .git/index ]; then
  cp -p .git/index "$i"
  [ "$(stat -c %Y "$i")" -le "$3" ] || touch -m -d "@$3" "$i"
fi
GIT_INDEX_FILE=$i $G update-index -q --really-refresh
GIT_INDEX_FILE=$i $G add -A
t=$(GIT_INDEX_FILE=$i $G write-tree)
c=$(eval "$C $G commit-tree $t -p $1 -m final")
$G update-ref refs/cra/snapshot "$2"
$G update-ref refs/cra/final "$c"
$G bundle create - refs/cra/snapshot refs/cra/final "^$1" 2>/dev/null
"#;

/// The commit `default_branch` names, packed alone (its tree, no history: [`history`]) into a
/// scratch file of the engine's: made while the session's pod starts ([`pack_repository`]), sent
/// once it runs ([`send_repository`]).
pub(super) struct Packed {
    /// The commit.
    pub base: String,
    file: std::path::PathBuf,
    _dir: ScratchDir,
}

impl Packed {
    /// The pack's size (0 where it cannot be read: only the log reports it).
    pub fn bytes(&self) -> u64 {
        std::fs::metadata(&self.file).map_or(0, |m| m.len())
    }
}

pub(super) async fn pack_repository(repo_root: &Path, default_branch: &str) -> Result<Packed> {
    let base = run_git(
        repo_root,
        &[
            "rev-parse",
            "--verify",
            &format!("{default_branch}^{{commit}}"),
        ],
    )
    .await
    .map_err(|e| provision_error(format!("cannot resolve {default_branch}")).with_cause(e))?;
    let base = String::from_utf8_lossy(&base.stdout).trim().to_string();
    let objects = run_git(repo_root, &["rev-list", "--objects", "--no-walk", &base])
        .await
        .map_err(|e| provision_error(format!("cannot list the tree of {base}")).with_cause(e))?;
    let dir = ScratchDir::create("pack").map_err(|e| {
        provision_error("cannot make a scratch directory for the pack").with_cause(e)
    })?;
    let file = dir.path().join("tree.pack");
    let out = std::fs::File::create(&file)
        .map_err(|e| provision_error("cannot write the pack").with_cause(e))?;
    let mut pack = git_command(repo_root, &["pack-objects", "--stdout", "-q"])
        .stdin(std::process::Stdio::piped())
        .stdout(out)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| provision_error("cannot run git pack-objects").with_cause(e))?;
    let (Some(mut list), Some(mut stderr)) = (pack.stdin.take(), pack.stderr.take()) else {
        return Err(provision_error("git pack-objects has no stdio"));
    };
    let limit = STEP_TIMEOUT * 10;
    let packed = tokio::time::timeout(limit, async {
        // Moved in, so that the pipe closes (EOF: pack-objects starts) once the list is in.
        let write = async move { list.write_all(&objects.stdout).await };
        let mut said = String::new();
        let mut diagnostics = (&mut stderr).take(MAX_STEP_OUTPUT as u64);
        let read = diagnostics.read_to_string(&mut said);
        let (written, _) = tokio::join!(write, read);
        (written, pack.wait().await, said)
    })
    .await;
    match packed {
        Ok((Ok(()), Ok(status), _)) if status.success() => Ok(Packed {
            base,
            file,
            _dir: dir,
        }),
        Ok((written, status, said)) => Err(provision_error(format!(
            "cannot pack {default_branch} for the session's pod (git pack-objects {status:?}, \
             its input {written:?}): {}",
            said.trim()
        ))),
        Err(_) => Err(provision_error(format!(
            "cannot pack {default_branch} for the session's pod: not within {}s",
            limit.as_secs()
        ))),
    }
}

/// The repository goes in: `packed` streamed into the pod and checked out at [`WORKDIR`],
/// shallow at its commit, with `origin` the session's history server. Returns the commit.
pub(super) async fn send_repository(
    step: &Steps<'_>,
    packed: &Packed,
    default_branch: &str,
) -> Result<String> {
    let base = &packed.base;
    let mut pack = tokio::fs::File::open(&packed.file)
        .await
        .map_err(|e| provision_error("cannot read the pack").with_cause(e))?;
    let branch = sh_quote(default_branch);
    // The pack goes straight into index-pack; the checkout is shallow at the commit, and the
    // marker says its history can be fetched ([`history`]; image/git-history).
    let receive = format!(
        "set -e; mkdir -p {WORKDIR}; cd {WORKDIR}; git init -q; git index-pack --stdin >/dev/null; \
         echo {base} > .git/shallow; git update-ref refs/heads/{branch} {base}; \
         git symbolic-ref HEAD refs/heads/{branch}; git config remote.origin.url {url}; \
         : > .git/cra-history; git reset -q --hard",
        url = sh_quote(history::REMOTE_URL),
    );
    let receiver = step
        .shell
        .spawn(RemoteCommand {
            argv: vec!["sh".into(), "-c".into(), receive],
            env: step.env.to_vec(),
            cwd: "/".into(),
        })
        .await?;
    let (mut stdin, mut control) = (receiver.stdin, receiver.control);
    let mut stderr = receiver.stderr;
    let limit = STEP_TIMEOUT * 10;
    let sent = tokio::time::timeout(limit, async {
        let copy = async {
            tokio::io::copy(&mut pack, &mut stdin).await?;
            stdin.shutdown().await
        };
        let mut said = Vec::new();
        let mut diagnostics = (&mut stderr).take(MAX_STEP_OUTPUT as u64);
        let (c, _) = tokio::join!(copy, diagnostics.read_to_end(&mut said));
        (c, said)
    })
    .await;
    let received = tokio::time::timeout(STEP_TIMEOUT, control.wait()).await;
    match (sent, received) {
        (Ok((Ok(()), _)), Ok(Some(r))) if r.success() => Ok(base.clone()),
        (sent, r) => {
            let said = match &sent {
                Ok((_, said)) => String::from_utf8_lossy(said).trim().to_string(),
                Err(_) => format!("not within {}s", limit.as_secs()),
            };
            Err(provision_error(format!(
                "cannot send {default_branch} to the session's pod (the pod's checkout {r:?}): {said}"
            )))
        }
    }
}

/// A scratch repository on the engine borrowing the repository's objects, where the work's
/// bundle is fetched and the patch computed; removed when dropped.
pub(super) struct Scratch {
    pub dir: ScratchDir,
}

impl Scratch {
    pub(super) async fn create(repo_root: &Path) -> Result<Scratch> {
        let dir = ScratchDir::create("extract").map_err(|e| {
            AdapterError::extract("cannot make a scratch directory for the patch").with_cause(e)
        })?;
        let scratch = Scratch { dir };
        RepoGit::for_repo(repo_root)
            .init_borrowing(scratch.dir.path())
            .await
            .map_err(|e| {
                AdapterError::extract("cannot make a scratch repository for the patch")
                    .with_cause(e)
            })?;
        Ok(scratch)
    }

    pub(super) async fn patch(&self, bundle: &Path, base: &str) -> Result<String> {
        let fail = |what: &str| {
            let what = what.to_string();
            move |e| AdapterError::extract(what).with_cause(e)
        };
        let bundle = bundle.display().to_string();
        run_git(
            self.dir.path(),
            &[
                "fetch",
                "-q",
                &bundle,
                "refs/cra/snapshot:refs/cra/snapshot",
                "refs/cra/final:refs/cra/final",
            ],
        )
        .await
        .map_err(fail("cannot read the bundle of the agent's work"))?;
        let trees = run_git(
            self.dir.path(),
            &[
                "rev-parse",
                "refs/cra/snapshot^{tree}",
                "refs/cra/final^{tree}",
            ],
        )
        .await
        .map_err(fail("the bundle of the agent's work lacks its trees"))?;
        let trees = String::from_utf8_lossy(&trees.stdout);
        let mut trees = trees.split_whitespace();
        let (Some(snapshot), Some(final_tree)) = (trees.next(), trees.next()) else {
            return Err(AdapterError::extract(
                "the bundle of the agent's work lacks its trees",
            ));
        };
        let at = At {
            dir: self.dir.path(),
            jail: None,
        };
        patch_of_trees(
            at,
            &self.dir.path().join(".git/index"),
            base,
            Some(snapshot),
            final_tree,
        )
        .await
    }
}
