//! A checkout's base kept once per node (`backend.kubernetes.nodeCache`), and each session's
//! copy-on-write layer over it: the repository at O(1) per session in a pod.
//!
//! A base is the default branch's commit checked out, its setup run and its snapshot taken,
//! for one [`key`] (commit, setup, image, git config) in `<nodeCache>/bases` on the node. The
//! first sandboxed pod on a node to need it makes it there as today's checkout is made
//! ([`Holder::find`] answers `Miss`), then publishes it; every later pod of that key on the
//! node finds it (`Hit`), receives no pack and checks nothing out: its checkout is an overlay
//! of its own layer (an `emptyDir`) on the base, mounted only inside the pod's jail
//! (`cra-pod layer`, run by image/cra-jail when [`LAYER_FILE`] exists), which never shows the
//! node's directory itself. The pod holds its base (a shared lock, `cra-pod base`) while it
//! lives, so no other pod's eviction removes it underneath.
//!
//! Everything after is unchanged: the agent, the extraction and the patch see the checkout at
//! `WORKDIR` as without a base, so the patch is the same by construction. Where the node or
//! the cluster refuses it (the cache not writable by the pod's user, overlayfs refused in the
//! pod), the session takes today's path and the engine says why once.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::cluster::NODE_BASES_MOUNT;
use super::layout::{MUX, WORKDIR};
use super::steps::{
    confined, not_confined, provision_error, sh_quote, PodSnapshot, Steps, STEP_TIMEOUT,
};
use crate::environment::remote::RemoteCommand;
use crate::environment::Exec;
use crate::error::{AdapterError, Result};
use crate::git::command::neutral_git_sh;

/// The layer file image/cra-jail reads (`$STATE/layer`): where the checkout's parts are.
pub(super) const LAYER_FILE: &str = "/var/lib/cra/layer";
/// The session's own layer, on the pod's `workspace` volume.
const LAYER_DIR: &str = "/workspace/.layer";
/// Bumped when what a base holds changes, so that a node's older bases are not taken (2: its
/// record says whether the base was verified for a layered end).
const FORMAT: &str = "cra-node-base-2";

/// Warned once per process: only the operator can change the node or the cluster.
static WARNED: AtomicBool = AtomicBool::new(false);

fn bases() -> String {
    format!("{NODE_BASES_MOUNT}/bases")
}

/// The base's name on the node: what its files are made of. The image as the pod names it (a
/// tag may move: the base records the id of the image it was made in, and a pod of another
/// does not use it, `Found::Hit`); the git config, which decides line endings; the setup and
/// its arguments.
pub(super) fn key(commit: &str, setup: Option<&[String]>, image: &str, gitconfig: &str) -> String {
    let inputs = serde_json::json!([FORMAT, commit, setup, image, gitconfig]).to_string();
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, inputs.as_bytes())
        .simple()
        .to_string()
}

/// Logs, once per process, why a pod's checkout was made without the node's base.
pub(super) fn without_base(pod: &str, node: &str, why: &str) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            pod = %pod,
            node = %node,
            "the checkout was made in the pod, not kept once on node {node} \
             (backend.kubernetes.nodeCache): {why}"
        );
    } else {
        tracing::debug!(pod = %pod, node = %node, "the checkout made in the pod: {why}");
    }
}

/// What the node has of a key.
pub(super) enum Found {
    /// The base, held: its tree's directory, its snapshot, whether it was verified for a
    /// layered end ([`super::steps::Steps::verify_base`]), and the id of the image it was made
    /// in (which the key, made before the pod's status names it, cannot hold).
    Hit {
        tree: String,
        snapshot: PodSnapshot,
        verified: bool,
        image_id: String,
    },
    /// None yet: this pod makes it in `tree` and then [`Holder::publish`]es it.
    Miss { tree: String },
}

/// The pod's `cra-pod base` process: it holds the base for as long as it runs (the session's
/// environment keeps it), and publishes the one this pod made.
pub(super) struct Holder {
    exec: Exec,
    out: BufReader<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    /// `cra-pod layer FILE --hold`, once the layer is used: the session's one overlay mount,
    /// which every jailed step joins ([`Holder::hold_mount`]).
    mount: Option<Exec>,
}

impl Holder {
    /// Asks the node for `key`'s base.
    pub(super) async fn find(step: &Steps<'_>, key: &str) -> Result<(Holder, Found)> {
        let name = format!(".b-{}", uuid::Uuid::new_v4().simple());
        let mut exec = step
            .shell
            .spawn(RemoteCommand {
                argv: vec![MUX[0].into(), "base".into(), bases(), key.into(), name],
                env: step.env.to_vec(),
                cwd: "/".into(),
            })
            .await?;
        let stdout = std::mem::replace(&mut exec.stdout, Box::new(tokio::io::empty()));
        let mut holder = Holder {
            exec,
            out: BufReader::new(stdout),
            mount: None,
        };
        let found = match holder.answer().await? {
            Answer::Hit(base) => Found::Hit {
                tree: base.tree,
                snapshot: base.snapshot,
                verified: base.verified,
                image_id: base.image_id,
            },
            Answer::Miss(name) => Found::Miss {
                tree: format!("{}/{name}/tree", bases()),
            },
        };
        Ok((holder, found))
    }

    /// Publishes the base this pod made in image `image_id` with its `snapshot` and whether it
    /// was `verified` (or takes the one another pod published first): the base to use then.
    pub(super) async fn publish(
        &mut self,
        snapshot: &PodSnapshot,
        verified: bool,
        image_id: &str,
    ) -> Result<Published> {
        let image_id: String = image_id.split_whitespace().collect();
        let check = if verified { "verified" } else { "unverified" };
        let line = format!(
            "publish {} {} {check} {image_id}\n",
            snapshot.commit, snapshot.trust_before
        );
        self.exec
            .stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| provision_error("cannot publish the node's base").with_cause(e))?;
        match self.answer().await? {
            Answer::Hit(base) => Ok(base),
            Answer::Miss(_) => Err(provision_error(
                "the node's base was not published: `cra-pod base` answered `miss` again",
            )),
        }
    }

    /// Takes the held base off the node's list: it was made in another image than this pod's
    /// (its tag moved), so the next pod makes a new one. Best effort: the base stays right for
    /// the image it names, and pods of this image do not use it.
    pub(super) async fn unpublish(&mut self) {
        let _ = self.exec.stdin.write_all(b"unpublish\n").await;
        let _ = self.exec.stdin.flush().await;
    }

    /// Mounts the checkout's layer once for the rest of the session (`cra-pod layer FILE
    /// --hold`): every jailed step after joins that mount, so the agent's walks of the tree
    /// warm it for the extraction's (a fresh overlay mount's first walk of 100,000 paths took
    /// ~1 s; docs/benchmarks.md). Best effort: without it each step mounts its own, as
    /// before, and sees the same files.
    pub(super) async fn hold_mount(&mut self, step: &Steps<'_>) {
        let started = step.shell.spawn(RemoteCommand {
            argv: vec![
                MUX[0].into(),
                "layer".into(),
                LAYER_FILE.into(),
                "--hold".into(),
            ],
            env: step.env.to_vec(),
            cwd: "/".into(),
        });
        let held = async {
            let mut exec = started.await.map_err(|e| e.message)?;
            let mut line = String::new();
            BufReader::new(&mut exec.stdout)
                .read_line(&mut line)
                .await
                .map_err(|e| e.to_string())?;
            match line.trim() {
                "held" => Ok(exec),
                _ => {
                    let mut said = Vec::new();
                    let mut stderr = tokio::io::AsyncReadExt::take(&mut exec.stderr, 4096);
                    let _ = tokio::io::AsyncReadExt::read_to_end(&mut stderr, &mut said).await;
                    Err(String::from_utf8_lossy(&said).trim().to_string())
                }
            }
        };
        match tokio::time::timeout(STEP_TIMEOUT, held).await {
            Ok(Ok(exec)) => self.mount = Some(exec),
            Ok(Err(why)) => {
                tracing::debug!("the layer is mounted by each step: `cra-pod layer --hold`: {why}")
            }
            Err(_) => tracing::debug!(
                "the layer is mounted by each step: `cra-pod layer --hold` did not answer"
            ),
        }
    }

    /// Its next line, bounded.
    async fn answer(&mut self) -> Result<Answer> {
        let mut line = String::new();
        let read = tokio::time::timeout(STEP_TIMEOUT * 2, self.out.read_line(&mut line)).await;
        match read {
            Ok(Ok(n)) if n > 0 => Answer::read(&line).ok_or_else(|| {
                provision_error(format!("`cra-pod base` answered {:?}", line.trim()))
            }),
            Ok(_) => {
                let mut said = Vec::new();
                let _ = tokio::time::timeout(
                    std::time::Duration::from_secs(2),
                    tokio::io::AsyncReadExt::read_to_end(&mut self.exec.stderr, &mut said),
                )
                .await;
                Err(provision_error(format!(
                    "`cra-pod base` ended: {}",
                    String::from_utf8_lossy(&said).trim()
                )))
            }
            Err(_) => Err(provision_error(format!(
                "`cra-pod base` did not answer within {}s",
                (STEP_TIMEOUT * 2).as_secs()
            ))),
        }
    }
}

/// A published base, held (see [`Found::Hit`]).
pub(super) struct Published {
    pub tree: String,
    pub snapshot: PodSnapshot,
    pub verified: bool,
    pub image_id: String,
}

enum Answer {
    Hit(Published),
    Miss(String),
}

impl Answer {
    /// `hit TREE COMMIT LIMIT verified|unverified IMAGE` or `miss NAME`.
    fn read(line: &str) -> Option<Answer> {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("miss ") {
            return Some(Answer::Miss(name.to_string()));
        }
        let rest = line.strip_prefix("hit ")?;
        let (tree, rest) = rest.split_once(' ')?;
        let (rest, image_id) = rest.rsplit_once(' ')?;
        let (snapshot, check) = rest.rsplit_once(' ')?;
        let verified = match check {
            "verified" => true,
            "unverified" => false,
            _ => return None,
        };
        Some(Answer::Hit(Published {
            tree: tree.to_string(),
            snapshot: PodSnapshot::read(snapshot)?,
            verified,
            image_id: image_id.to_string(),
        }))
    }
}

/// From now on the pod's jail shows the base's `tree` itself at `WORKDIR`, writable: where
/// the base's setup and snapshot run, so that what they write names the checkout's own path.
pub(super) async fn bind_base(step: &Steps<'_>, tree: &str) -> Result<()> {
    let layer = format!("lower={tree}\ntarget={WORKDIR}\n");
    step.write_file(LAYER_FILE, layer.as_bytes(), "0644").await
}

/// The jail shows `WORKDIR` itself again (today's path, after a layer that is not used).
pub(super) async fn drop_layer(step: &Steps<'_>) {
    let _ = step
        .run(
            "removing the layer file",
            vec!["rm".into(), "-f".into(), LAYER_FILE.into()],
            &[],
            STEP_TIMEOUT,
            "/",
        )
        .await;
}

/// Why the layer could not be used, when the pod refused the mount itself (fall back), or
/// the session's error.
pub(super) enum LayerError {
    Refused(String),
    Failed(AdapterError),
}

/// From now on the pod's jail shows an overlay of the session's own layer on the base's
/// `tree` at `WORKDIR`; on `branch` (the Implementor's), made there. Its one step runs in the
/// jail: it is the jail's probe as well.
pub(super) async fn use_layer(
    step: &Steps<'_>,
    tree: &str,
    branch: Option<&str>,
) -> std::result::Result<(), LayerError> {
    let layer =
        format!("lower={tree}\nupper={LAYER_DIR}/upper\nwork={LAYER_DIR}/work\ntarget={WORKDIR}\n");
    let g = neutral_git_sh();
    let inside = match branch {
        Some(b) => format!(
            "{g} update-ref refs/heads/{b} HEAD && {g} symbolic-ref HEAD refs/heads/{b}",
            b = sh_quote(b)
        ),
        None => "true".into(),
    };
    let mode = if branch.is_some() { "rw" } else { "ro" };
    let jailed = confined(Some(mode), vec!["sh".into(), "-c".into(), inside]);
    let script = format!(
        "set -e; mkdir -p {LAYER_DIR}/upper {LAYER_DIR}/work; cat > {LAYER_FILE}; exec \"$@\""
    );
    let argv = ["sh", "-c", &script, "sh"]
        .into_iter()
        .map(String::from)
        .chain(jailed)
        .collect();
    match step
        .run(
            "the checkout's layer",
            argv,
            layer.as_bytes(),
            STEP_TIMEOUT,
            "/",
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.message.contains("layer cannot be mounted") => {
            // Today's path from here.
            drop_layer(step).await;
            Err(LayerError::Refused(e.message))
        }
        Err(e) => Err(LayerError::Failed(not_confined(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answers_of_cra_pod_base_are_read_and_anything_else_is_not() {
        for (check, verified) in [("verified", true), ("unverified", false)] {
            let line = format!(
                "hit /workspace/.node/bases/.b-1/tree abc 42 {check} docker.io/x@sha256:1\n"
            );
            match Answer::read(&line) {
                Some(Answer::Hit(base)) => {
                    assert_eq!(base.tree, "/workspace/.node/bases/.b-1/tree");
                    let s = &base.snapshot;
                    assert_eq!((s.commit.as_str(), s.trust_before), ("abc", 42));
                    assert_eq!(base.verified, verified);
                    assert_eq!(base.image_id, "docker.io/x@sha256:1");
                }
                _ => panic!("not a hit"),
            }
        }
        assert!(matches!(Answer::read("miss .b-2"), Some(Answer::Miss(n)) if n == ".b-2"));
        for nonsense in [
            "",
            "hit",
            "hit /t",
            "hit /t abc",
            "hit /t abc 1",
            "hit /t abc x i",
            "hit /t a 1 2 i",
            "hit /t abc 1 i",
            "hit /t abc 1 checked i",
            "ok",
        ] {
            assert!(Answer::read(nonsense).is_none(), "{nonsense:?}");
        }
    }

    #[test]
    fn a_base_is_named_by_everything_its_files_come_from() {
        let setup = ["npm".to_string(), "ci".to_string()];
        let k = key("c1", Some(&setup), "sha256:1", "[core]\n");
        assert_eq!(k.len(), 32);
        assert!(k.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(k, key("c1", Some(&setup), "sha256:1", "[core]\n"));
        for other in [
            key("c2", Some(&setup), "sha256:1", "[core]\n"),
            key("c1", None, "sha256:1", "[core]\n"),
            key("c1", Some(&setup[..1]), "sha256:1", "[core]\n"),
            key("c1", Some(&setup), "sha256:2", "[core]\n"),
            key(
                "c1",
                Some(&setup),
                "sha256:1",
                "[core]\n\tautocrlf = true\n",
            ),
        ] {
            assert_ne!(k, other);
        }
    }
}
