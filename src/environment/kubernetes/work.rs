//! The repository into the pod and the agent's work out of it: [`send_repository`] packs the
//! default branch's commit alone and checks it out in the pod; [`EXTRACT_SCRIPT`] stages the
//! work there and streams it back as a bundle, which a [`Scratch`] repository on the engine
//! turns into the patch with the local backend's own `patch_of_trees`: the same bytes by
//! construction.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::history;
use super::layout::{MUX, WORKDIR};
use super::node_base::LAYER_FILE;
use super::steps::{
    confined, provision_error, sh_quote, snapshot_sh, trust_limit_sh, PodSnapshot, Steps,
    COMMIT_ENV, MAX_STEP_OUTPUT, STEP_TIMEOUT,
};
use crate::environment::remote::{RemoteCommand, RemoteShell};
use crate::error::{AdapterError, Result};
use crate::git::command::{git_command, neutral_git_sh, run_git, At};
use crate::git::patch::patch_of_trees;
use crate::git::RepoGit;
use crate::scratch::ScratchDir;

/// The largest bundle of the agent's work read back (a checkout's whole new content).
const MAX_WORK_BUNDLE: u64 = 4 << 30;

/// Extraction in the jail: stage the work into a temporary index, commit the final tree, and
/// write a bundle of the snapshot and final commits to stdout. `$1` base, `$2` snapshot
/// commit, `$3` the snapshot's trust limit (Unix seconds).
///
/// On a layer of a verified node's base (`$P` set: the runtime's `cra-pod`, the candidates on
/// stdin from `cra-pod candidates` run outside the jail; its module docs) only the candidates
/// are staged, into the agent's index as it prepared it: `git add -A` limited to them, the
/// untracked ones that `git check-ignore` says are ignored left out (`git add` refuses them,
/// and the whole `git add -A` does not stage them either), as a local layer's end does. Where
/// the candidates say `full`, or a step of theirs fails, the whole checkout is staged:
///
/// The whole checkout: the agent's index copied only when it is a regular file, its mtime
/// capped at `$3` so that git compares by content every entry recorded since the snapshot
/// (`git::patch`'s module docs). `update-index --really-refresh` runs only when an entry is
/// marked "assume unchanged" (a lowercase tag in `ls-files -v`): it is there to clear that
/// mark, which `git add -A` would obey whatever the file holds. Otherwise `git add -A` decides
/// every entry as the refresh would (a racily clean or changed one by content), so the tree is
/// the same, and the walk of the whole tree it costs (~0.4 s at 100,000 files) is spared. The
/// list is NUL-separated (at 100,000 paths 0.03 s, where lines took 0.1 s), and a grep that
/// cannot read it (exit 2: a user's image's grep without `-z`) refreshes: only "no such entry"
/// spares it.
pub(super) const EXTRACT_SCRIPT: &str = r#"set -e
layered() {
  "$P" receive /tmp/cra-c || return 2
  i=/tmp/cra-c/index
  if [ -s /tmp/cra-c/untracked ]; then
    $G check-ignore --no-index -z --stdin </tmp/cra-c/untracked >/tmp/cra-c/ignored || [ $? -eq 1 ] || return 1
  fi
  "$P" pathspecs /tmp/cra-c >/tmp/cra-c/paths || return 1
  if [ -s /tmp/cra-c/paths ]; then
    GIT_INDEX_FILE=$i $G -c index.skipHash=true --literal-pathspecs add -A --pathspec-from-file=/tmp/cra-c/paths --pathspec-file-nul || return 1
  fi
}
s=2
if [ -n "${P:-}" ]; then
  s=0; layered || s=$?
  [ "$s" -ne 1 ] || echo "cra-pod: staging the candidates failed: the whole checkout is staged" >&2
fi
if [ "$s" -ne 0 ]; then
  i=/tmp/cra-final.index
  if [ -f .git/index ] && [ ! -L .git/index ]; then
    cp -p .git/index "$i"
    [ "$(stat -c %Y "$i")" -le "$3" ] || touch -m -d "@$3" "$i"
  fi
  if GIT_INDEX_FILE=$i $G ls-files -v -z | { grep -qz '^[a-z]'; [ $? -ne 1 ]; }; then
    GIT_INDEX_FILE=$i $G update-index -q --really-refresh
  fi
  GIT_INDEX_FILE=$i $G -c index.skipHash=true add -A
fi
t=$(GIT_INDEX_FILE=$i $G -c index.skipHash=true write-tree)
c=$(eval "$C $G commit-tree $t -p $1 -m final")
$G update-ref refs/cra/snapshot "$2"
$G update-ref refs/cra/final "$c"
$G bundle create - refs/cra/snapshot refs/cra/final "^$1" 2>/dev/null
"#;

/// Runs `cra-pod candidates` (`$1`, the layer file `$2`, the trust limit `$3`) outside the
/// jail, where the layer's `upper/` is, into the jailed extraction (the rest of the words).
pub(super) const CANDIDATES_INTO: &str =
    r#"p=$1 l=$2 t=$3; shift 3; "$p" candidates "$l" "$t" | "$@""#;

/// The commit `default_branch` names, packed alone (its tree, no history: [`history`]) into a
/// scratch file of the engine's ([`Pack`]), sent once the pod runs ([`send_repository`]).
pub(super) struct Packed {
    file: std::path::PathBuf,
    _dir: ScratchDir,
}

/// The session's commit and its pack, made in the background once started and awaited only
/// by a step that sends it: a pod whose checkout layers on the node's base needs none, and a
/// warm pod runs before a pack of cargo's tree is made (0.65 s). Dropped, the packing ends.
pub(super) struct Pack {
    repo_root: std::path::PathBuf,
    /// The commit.
    pub base: String,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<Result<Packed>>>>,
    made: tokio::sync::OnceCell<Packed>,
}

impl Pack {
    /// The commit `default_branch` names now, not packed yet.
    pub async fn of(repo_root: &Path, default_branch: &str) -> Result<Pack> {
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
        Ok(Pack {
            repo_root: repo_root.to_path_buf(),
            base: String::from_utf8_lossy(&base.stdout).trim().to_string(),
            task: std::sync::Mutex::default(),
            made: tokio::sync::OnceCell::new(),
        })
    }

    fn spawn(&self) -> tokio::task::JoinHandle<Result<Packed>> {
        let (root, base) = (self.repo_root.clone(), self.base.clone());
        tokio::spawn(async move { pack_commit(&root, &base).await })
    }

    /// Starts packing in the background, unless it is started or made.
    pub fn start(&self) {
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.is_none() && !self.made.initialized() {
            *task = Some(self.spawn());
        }
    }

    /// The pack, started now if it was not.
    pub async fn get(&self) -> Result<&Packed> {
        self.made
            .get_or_try_init(|| async {
                let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
                task.unwrap_or_else(|| self.spawn()).await.map_err(|e| {
                    provision_error(format!(
                        "packing {} for the session's pod failed: {e}",
                        self.base
                    ))
                })?
            })
            .await
    }

    /// The pack's size in KiB, if it was made (only the log reports it).
    pub fn kib(&self) -> Option<u64> {
        self.made.get().map(|p| p.bytes() / 1024)
    }
}

impl Drop for Pack {
    fn drop(&mut self) {
        // Its `git pack-objects` is killed with the task (kill_on_drop).
        if let Some(t) = self
            .task
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            t.abort();
        }
    }
}

impl Packed {
    /// The pack's size (0 where it cannot be read: only the log reports it).
    pub fn bytes(&self) -> u64 {
        std::fs::metadata(&self.file).map_or(0, |m| m.len())
    }
}

async fn pack_commit(repo_root: &Path, base: &str) -> Result<Packed> {
    let objects = run_git(repo_root, &["rev-list", "--objects", "--no-walk", base])
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
        Ok((Ok(()), Ok(status), _)) if status.success() => Ok(Packed { file, _dir: dir }),
        Ok((written, status, said)) => Err(provision_error(format!(
            "cannot pack {base} for the session's pod (git pack-objects {status:?}, \
             its input {written:?}): {}",
            said.trim()
        ))),
        Err(_) => Err(provision_error(format!(
            "cannot pack {base} for the session's pod: not within {}s",
            limit.as_secs()
        ))),
    }
}

/// What the Implementor's checkout is made as, in the same step as the repository.
#[derive(Clone, Copy)]
pub(super) struct CheckoutAs<'a> {
    /// Its branch, made at the commit and checked out.
    pub branch: &'a str,
    /// No setup command runs: where the checked-out files are the commit's own (no attributes,
    /// no `core.autocrlf`), the commit's tree is the snapshot, taken here.
    pub snapshot_if_plain: bool,
}

/// The repository in the pod: the Implementor's snapshot when it was taken with it.
pub(super) struct Received {
    pub snapshot: Option<PodSnapshot>,
}

/// The repository goes in: `packed` streamed into the pod and checked out at `into` ([`super::layout::WORKDIR`],
/// or a base's tree on the node: `node_base`), shallow at its commit, with `origin` the
/// session's history server; on the Implementor's branch when `checkout` says so (one step
/// less: each is a round trip through the API server).
pub(super) async fn send_repository(
    step: &Steps<'_>,
    pack: &Pack,
    default_branch: &str,
    into: &str,
    checkout: Option<CheckoutAs<'_>>,
) -> Result<Received> {
    let base = &pack.base;
    let packed = pack.get().await?;
    let mut pack = tokio::fs::File::open(&packed.file)
        .await
        .map_err(|e| provision_error("cannot read the pack").with_cause(e))?;
    let head = sh_quote(checkout.as_ref().map_or(default_branch, |c| c.branch));
    let session_branch = match &checkout {
        Some(c) => format!("git update-ref refs/heads/{} {base}; ", sh_quote(c.branch)),
        None => String::new(),
    };
    let snapshot = match &checkout {
        Some(c) if c.snapshot_if_plain => plain_snapshot(base),
        _ => String::new(),
    };
    // The pack goes straight into index-pack; the checkout is shallow at the commit, and the
    // marker says its history can be fetched ([`history`]; image/git-history).
    let receive = format!(
        "set -e; mkdir -p {into}; cd {into}; git init -q; git index-pack --stdin >/dev/null; \
         echo {base} > .git/shallow; git update-ref refs/heads/{branch} {base}; {session_branch}\
         git symbolic-ref HEAD refs/heads/{head}; git config remote.origin.url {url}; \
         : > .git/cra-history; git reset -q --hard{snapshot}",
        into = sh_quote(into),
        branch = sh_quote(default_branch),
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
    let (mut stdout, mut stderr) = (receiver.stdout, receiver.stderr);
    let limit = STEP_TIMEOUT * 10;
    let sent = tokio::time::timeout(limit, async {
        let copy = async {
            tokio::io::copy(&mut pack, &mut stdin).await?;
            stdin.shutdown().await
        };
        let (mut said, mut out) = (Vec::new(), Vec::new());
        let mut diagnostics = (&mut stderr).take(MAX_STEP_OUTPUT as u64);
        let mut answer = (&mut stdout).take(MAX_STEP_OUTPUT as u64);
        let (c, _, _) = tokio::join!(
            copy,
            diagnostics.read_to_end(&mut said),
            answer.read_to_end(&mut out)
        );
        (c, said, out)
    })
    .await;
    let received = tokio::time::timeout(STEP_TIMEOUT, control.wait()).await;
    match (sent, received) {
        (Ok((Ok(()), _, out)), Ok(Some(r))) if r.success() => Ok(Received {
            snapshot: read_plain_snapshot(&out)?,
        }),
        (sent, r) => {
            let said = match &sent {
                Ok((_, said, _)) => String::from_utf8_lossy(said).trim().to_string(),
                Err(_) => format!("not within {}s", limit.as_secs()),
            };
            Err(provision_error(format!(
                "cannot send {default_branch} to the session's pod (the pod's checkout {r:?}): {said}"
            )))
        }
    }
}

/// The end of the receiving script where no setup runs: if git applies no attribute to any
/// file and `core.autocrlf` is off, every file is checked out byte for byte as the commit has
/// it (as `git::prepare`'s `files_are_commit` reasons locally; here `check-attr` asks git
/// itself, whatever file the attributes would come from), so the snapshot is the commit's
/// tree and `git add -A` of every file is skipped. Its only output is then the snapshot's; the
/// trust limit is taken after the checkout, before the agent can change anything (see
/// [`Steps::snapshot`]).
fn plain_snapshot(base: &str) -> String {
    format!(
        "; a=$(git config --get core.autocrlf || :); \
         case \"$a\" in ''|[Ff][Aa][Ll][Ss][Ee]|0|[Nn][Oo]|[Oo][Ff][Ff]) ;; *) exit 0;; esac; \
         [ -z \"$(git ls-files -z | git check-attr -z --stdin -a | head -c 1)\" ] || exit 0; \
         {}; {}",
        trust_limit_sh(),
        snapshot_sh("git", &format!("{base}^{{tree}}"), base)
    )
}

/// The receiving script's output: nothing, or the snapshot [`plain_snapshot`] took.
fn read_plain_snapshot(out: &[u8]) -> Result<Option<PodSnapshot>> {
    let out = String::from_utf8_lossy(out);
    let out = out.trim();
    if out.is_empty() {
        return Ok(None);
    }
    PodSnapshot::read(out).map(Some).ok_or_else(|| {
        provision_error(format!(
            "the repository's step in the session's pod answered {out:?}, not a snapshot"
        ))
    })
}

/// An Implementor's work in its pod ([`read_work`]): the session's record, and the stream and
/// environment to read it with.
pub(super) struct WorkAt<'a> {
    pub shell: &'a RemoteShell,
    /// The environment of the pod's processes (its PATH, HOME, git).
    pub env: &'a [(String, String)],
    pub record: &'a WorkRecord,
    /// The pod's name, for the log.
    pub pod: &'a str,
}

/// What [`read_work`] needs that only the session knew, kept on its pod
/// ([`super::cluster::ANNOTATION_WORK`], JSON) once the snapshot is taken: a dead engine's pod
/// is read by it ([`super::sweep`]). Names nothing secret: the repository's path on the engine's
/// host (which the pod's processes cannot read: no service account token is mounted), commits
/// and flags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WorkRecord {
    pub repository: PathBuf,
    /// The commit the checkout was made at.
    pub base: String,
    /// The post-setup snapshot's commit, and the index timestamp extraction caps the agent's
    /// index at ([`PodSnapshot`]).
    pub snapshot: String,
    pub trust_before: u64,
    /// The session ran in the pod's jail: its work is read there too.
    pub sandboxed: bool,
    /// The checkout is a layer on a node's base verified for it ([`EXTRACT_SCRIPT`]).
    pub layered_end: bool,
    /// The key of the node's base the checkout is layered on: a continuation holds it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_base: Option<String>,
}

/// The agent's work in the pod as a patch against `at.base`: [`EXTRACT_SCRIPT`] in the jail
/// (through `cra-pod candidates` on a layer) streams the bundle into a [`Scratch`] repository,
/// which computes the patch.
pub(super) async fn read_work(at: &WorkAt<'_>) -> Result<String> {
    let record = at.record;
    let trust = record.trust_before.to_string();
    let jailed = confined(
        record.sandboxed.then_some("rw"),
        vec![
            "sh".to_string(),
            "-c".into(),
            EXTRACT_SCRIPT.into(),
            "sh".into(),
            record.base.clone(),
            record.snapshot.clone(),
            trust.clone(),
        ],
    );
    let mut env = at.env.to_vec();
    env.push(("G".into(), neutral_git_sh()));
    env.push(("C".into(), COMMIT_ENV.into()));
    let argv = match record.layered_end {
        true => {
            env.push(("P".into(), MUX[0].into()));
            let outer = [
                "sh",
                "-c",
                CANDIDATES_INTO,
                "sh",
                MUX[0],
                LAYER_FILE,
                &trust,
            ];
            outer.into_iter().map(String::from).chain(jailed).collect()
        }
        false => jailed,
    };
    let mut exec = at
        .shell
        .spawn(RemoteCommand {
            argv,
            env,
            cwd: WORKDIR.into(),
        })
        .await?;
    let scratch = Scratch::create(&record.repository).await?;
    let bundle_path = scratch.dir.path().join("work.bundle");
    let mut file = tokio::fs::File::create(&bundle_path)
        .await
        .map_err(|e| AdapterError::extract("cannot write the work's bundle").with_cause(e))?;
    let mut stderr = Vec::new();
    let mut bundle = (&mut exec.stdout).take(MAX_WORK_BUNDLE);
    let mut diagnostics = (&mut exec.stderr).take(MAX_STEP_OUTPUT as u64);
    let (copied, _) = tokio::join!(
        tokio::io::copy(&mut bundle, &mut file),
        diagnostics.read_to_end(&mut stderr)
    );
    let copied = copied
        .map_err(|e| AdapterError::extract("cannot read the work out of the pod").with_cause(e))?;
    file.flush().await.ok();
    let status = exec.control.wait().await;
    if copied >= MAX_WORK_BUNDLE {
        return Err(AdapterError::extract(format!(
            "the work in the pod is more than {MAX_WORK_BUNDLE} bytes"
        )));
    }
    if !status.is_some_and(|s| s.success()) {
        return Err(AdapterError::extract(format!(
            "reading the work out of the pod failed ({status:?}): {}",
            String::from_utf8_lossy(&stderr).trim()
        )));
    }
    let said = String::from_utf8_lossy(&stderr);
    if !said.trim().is_empty() {
        tracing::debug!(pod = %at.pod, "the work read out of the pod: {}", said.trim());
    }
    scratch.patch(&bundle_path, &record.base).await
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `git` arguments committing the index, whoever runs the test.
    const COMMIT: &[&str] = &[
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-qm",
        "c",
    ];

    /// `program args` in `dir` with no user or system git config and `env` added; its stdout.
    fn run_in(dir: &Path, env: &[(&str, &str)], program: &str, args: &[&str]) -> Vec<u8> {
        let out = std::process::Command::new(program)
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{program} {args:?}: {out:?}");
        out.stdout
    }

    /// A repository of one commit holding `files`, checked out as the pod's receive does
    /// (`reset --hard`, `core.autocrlf` as given), then the plain snapshot's script run in it:
    /// its answer read as the engine reads it, and the checkout's own `git add -A` tree.
    fn received(files: &[(&str, &[u8])], autocrlf: Option<&str>) -> (Option<PodSnapshot>, bool) {
        let dir = tempfile::tempdir().unwrap();
        let run = |program: &str, args: &[&str]| run_in(dir.path(), &[], program, args);
        let git = |args: &[&str]| {
            String::from_utf8(run("git", args))
                .unwrap()
                .trim()
                .to_string()
        };
        git(&["init", "-q"]);
        // Stored as they are, as a repository that gained its attributes later holds them.
        for (name, content) in files {
            std::fs::write(dir.path().join(name), content).unwrap();
            let blob = git(&["hash-object", "-w", "--no-filters", name]);
            let entry = format!("100644,{blob},{name}");
            git(&["update-index", "--add", "--cacheinfo", &entry]);
        }
        git(COMMIT);
        let base = git(&["rev-parse", "HEAD"]);
        if let Some(v) = autocrlf {
            git(&["config", "core.autocrlf", v]);
        }
        for (name, _) in files {
            std::fs::remove_file(dir.path().join(name)).unwrap();
        }
        let script = format!("set -e; git reset -q --hard{}", plain_snapshot(&base));
        let snapshot = read_plain_snapshot(&run("sh", &["-c", &script])).unwrap();
        if let Some(s) = &snapshot {
            assert_eq!(
                git(&["rev-parse", "refs/cra/snapshot"]),
                s.commit,
                "kept under its ref"
            );
            assert_eq!(git(&["rev-parse", &format!("{}^", s.commit)]), base);
        }
        // Every file staged afresh (not only those git's stat data calls changed, which in a
        // real checkout depends on its timing): what the file would be as the agent's work.
        git(&["add", "--renormalize", "-A", "."]);
        let staged = git(&["write-tree"]);
        let snapshot_tree = snapshot
            .as_ref()
            .map(|s| git(&["rev-parse", &format!("{}^{{tree}}", s.commit)]));
        if let Some(tree) = snapshot_tree {
            assert_eq!(
                tree, staged,
                "the snapshot is what staging every file gives"
            );
        }
        let same = staged == git(&["rev-parse", &format!("{base}^{{tree}}")]);
        (snapshot, same)
    }

    #[test]
    fn a_checkout_without_attributes_or_autocrlf_is_its_commits_tree_and_the_snapshot_is_taken_with_it(
    ) {
        let (snapshot, same) = received(&[("a.txt", b"one\r\ntwo\n"), ("b.bin", &[0, 1, 2])], None);
        assert!(same && snapshot.is_some_and(|s| s.trust_before > 1));
        let (snapshot, _) = received(&[("a.txt", b"one\n")], Some("false"));
        assert!(snapshot.is_some());
    }

    #[test]
    fn attributes_or_autocrlf_leave_the_snapshot_to_its_own_step() {
        // Staging would renormalise this checkout: its tree is not the commit's.
        let files: &[(&str, &[u8])] = &[(".gitattributes", b"* text\n"), ("a.txt", b"one\r\n")];
        let (snapshot, same) = received(files, None);
        assert!(
            !same,
            "staging renormalises: the commit's tree would be a wrong snapshot"
        );
        assert!(snapshot.is_none());
        let (snapshot, same) = received(&[("a.txt", b"one\r\n")], Some("input"));
        assert!(!same && snapshot.is_none());
        assert!(received(&[("a.txt", b"one\n")], Some("TRUE")).0.is_none());
    }

    /// The extraction's script run on a checkout where the agent marked `a.txt` assume-unchanged
    /// and then rewrote it (same size), with `grep` first on PATH: the final commit's `a.txt`.
    fn extracted_with(grep: Option<&str>) -> String {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        if let Some(script) = grep {
            let stub = bin.join("grep");
            std::fs::write(&stub, format!("#!/bin/sh\n{script}\n")).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
        let g = crate::git::command::neutral_git_sh();
        let env = [
            ("G", g.as_str()),
            ("C", super::super::steps::COMMIT_ENV),
            ("PATH", &path),
        ];
        let run = |args: &[&str]| {
            let out = run_in(&repo, &env, args[0], &args[1..]);
            String::from_utf8_lossy(&out).trim().to_string()
        };
        run(&["git", "init", "-q"]);
        std::fs::write(repo.join("a.txt"), "one\n").unwrap();
        run(&["git", "add", "a.txt"]);
        run(&[&["git"], COMMIT].concat());
        let base = run(&["git", "rev-parse", "HEAD"]);
        run(&["git", "update-index", "--assume-unchanged", "a.txt"]);
        std::fs::write(repo.join("a.txt"), "two\n").unwrap();
        let trust = (crate::git::patch::unix_now() + 10).to_string();
        run(&["sh", "-c", EXTRACT_SCRIPT, "sh", &base, &base, &trust]);
        run(&["git", "show", "refs/cra/final:a.txt"])
    }

    #[test]
    fn an_assume_unchanged_file_the_agent_rewrote_is_its_work_even_where_grep_cannot_read_the_list()
    {
        // One test, not three: the script's temporary index is a fixed path (a pod's own /tmp).
        assert_eq!(extracted_with(None), "two", "the host's grep");
        // A grep without -z (exit 2): the refresh runs; only "none" (exit 1) spares it.
        assert_eq!(extracted_with(Some("exit 2")), "two", "a grep that fails");
        // The control: a grep that says no entry is marked loses the edit, as `git add -A`
        // obeys the mark, so the two above pass by the refresh they decided.
        assert_eq!(extracted_with(Some("cat >/dev/null; exit 1")), "one");
    }

    #[test]
    fn a_receive_answer_that_is_not_a_snapshot_is_an_error_naming_it() {
        assert!(read_plain_snapshot(b"").unwrap().is_none());
        let err = read_plain_snapshot(b"snapshot abc").err().unwrap();
        assert!(err.message.contains("\"snapshot abc\""), "{}", err.message);
        assert!(read_plain_snapshot(b"hello 1 2").is_err());
    }
}
