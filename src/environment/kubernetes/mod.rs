//! The Kubernetes environment: one pod per session, the same four steps as the local one.
//!
//! - **provision**: a pod of the session image ([`cluster`]), one exec stream into it running
//!   `cra-pod mux`, over which [`RemoteShell`] multiplexes everything else: processes with their
//!   stdio, and the pod's two unix sockets tunnelled to the session's [`Gateway`] (model relay,
//!   egress proxy) on the engine. The pod needs no network, and the key and the allowlist stay
//!   here. The repository goes in as a `git bundle` of `defaultBranch` streamed into the pod and
//!   cloned there (no remote, no URL, no engine path); the Implementor's branch is made, the
//!   setup command runs, and the checkout is snapshotted as locally.
//! - **exec**: the CLI runs in the pod under `cra-jail` (bubblewrap: its own network namespace,
//!   the checkout read-write or read-only, nothing else of the pod), behind the same socat
//!   bridges as the local sandbox.
//! - **extract**: a script in the jail stages the checkout into a temporary index, commits the
//!   snapshot and final trees, and streams them back as a bundle; the engine fetches that into
//!   a scratch repository borrowing the repository's objects and computes the patch with the
//!   local backend's own [`patch_of_trees`] — the same bytes by construction.
//! - **destroy**: `Bye` over the stream, then the pod is deleted and waited for.

pub mod cluster;
mod devcontainer;
mod history;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use self::cluster::{Cluster, Pod, PodRequest};
use super::remote::{RemoteCommand, RemoteShell};
use super::{Backend, EnvRequest, Environment, Exec, ExecCommand, Workspace};
use crate::config::{KubernetesConfig, SandboxConfig};
use crate::error::{AdapterError, ErrorCode, Result};
use crate::git::command::{git_command, neutral_git_sh, run_git, At};
use crate::git::patch::{patch_of_trees, STAT_TRUST_MARGIN_SECS};
use crate::git::RepoGit;
use crate::sandbox::commands::commands_share;
use crate::sandbox::{
    bridged_argv, commands_prefix_script, env_value, use_commands_prefix, Gateway, PREFIX_SCRIPT,
};
use crate::scratch::ScratchDir;

/// The adapter's runtime in the pod ([`cluster::RUNTIME_DIR`]: the session image's own, or the
/// copy a pod of another image gets; its contract: `image/`).
const RUNTIME_BIN: &str = "/opt/claude-runtime-adapter/bin";
/// The runtime's `git` (image/git-history), first on the PATH: history on demand.
const RUNTIME_HISTORY: &str = "/opt/claude-runtime-adapter/history";
const CLI: &str = "/opt/claude-runtime-adapter/bin/claude";
const MUX: &[&str] = &["/opt/claude-runtime-adapter/bin/cra-pod", "mux"];
const JAIL: &str = "/opt/claude-runtime-adapter/bin/cra-jail";
/// The PATH a command gets where the image names none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// What the adapter itself runs in the pod besides its runtime: git, and the few POSIX tools
/// of its steps and of `cra-jail` (with `/bin/sh`). An image lacking one is refused before
/// anything else happens in it.
const IMAGE_NEEDS: &[&str] = &[
    "git", "cat", "cp", "chmod", "date", "stat", "touch", "rm", "mkdir", "realpath", "readlink",
    "grep", "sleep",
];
const WORKDIR: &str = "/workspace/repo";
const STATE: &str = "/var/lib/cra";
const SOCKETS: &str = "/var/lib/cra/sockets";
const HOME: &str = "/home/agent";
/// The largest bundle of the agent's work read back (a checkout's whole new content).
const MAX_WORK_BUNDLE: u64 = 4 << 30;
/// Output kept of a provisioning step, for its error message.
const MAX_STEP_OUTPUT: usize = 64 << 10;
/// Bound on the small provisioning steps in the pod (clone excepted: it is bounded by the
/// setup timeout with the setup command).
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a pod whose stream broke is given to show why in its status.
const LOST_WAIT: Duration = Duration::from_secs(15);

/// Makes [`KubernetesEnvironment`]s; connects to the cluster on first use.
pub struct KubernetesBackend {
    config: Arc<KubernetesConfig>,
    cluster: tokio::sync::OnceCell<Arc<Cluster>>,
    /// The cluster-side backstop (`activeDeadlineSeconds`): the whole life a session may have.
    deadline: Option<Duration>,
}

impl KubernetesBackend {
    pub fn new(config: KubernetesConfig, deadline: Option<Duration>) -> KubernetesBackend {
        KubernetesBackend {
            config: Arc::new(config),
            cluster: tokio::sync::OnceCell::new(),
            deadline,
        }
    }

    /// The cluster client (a failed connection is not remembered: the next session retries).
    pub async fn cluster(&self) -> Result<Arc<Cluster>> {
        self.cluster
            .get_or_try_init(|| async { Cluster::connect(&self.config).await.map(Arc::new) })
            .await
            .cloned()
    }
}

impl Backend for KubernetesBackend {
    fn preflight(&self, _env: &[(String, String)], _sandbox: Option<&SandboxConfig>) -> Result<()> {
        // The pod's own jail is tried while provisioning (it can only be tried in a pod).
        Ok(())
    }

    fn cli_program(&self) -> Option<PathBuf> {
        Some(PathBuf::from(CLI))
    }

    fn sweep(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(async move { self.cluster().await?.sweep().await })
    }

    fn provision<'a>(
        &'a self,
        req: EnvRequest,
        stop: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Box<dyn Environment>>> {
        Box::pin(async move {
            let cluster = self.cluster().await?;
            let mut request = PodRequest::new(req.session_id.clone(), req.role);
            request.active_deadline = self.deadline;
            if self.config.image.is_none() {
                let default_branch = match &req.workspace {
                    Workspace::Checkout(p) => &p.default_branch,
                    Workspace::View(v) => &v.default_branch,
                };
                if let Some(image) = devcontainer::image_at(&req.repo_root, default_branch).await? {
                    tracing::info!(
                        session = %req.session_id,
                        image = %image,
                        "the session runs in the image the repository's {} names",
                        devcontainer::PATH
                    );
                    request.image = Some(image);
                }
            }
            let pod = cluster.create_pod(request, stop).await?;
            let pod = Arc::new(pod);
            let made = tokio::select! {
                r = prepare(pod.clone(), req) => r,
                () = stop.cancelled() => Err(AdapterError::new(
                    ErrorCode::Cancelled,
                    "the session was stopped while its pod was being prepared",
                )),
            };
            match made {
                Ok(env) => Ok(Box::new(env) as Box<dyn Environment>),
                Err(e) => {
                    let e = match pod.why_gone().await {
                        Some(lost) => lost.with_shared_cause(Arc::new(e)),
                        None => e,
                    };
                    if let Err(d) = pod.delete().await {
                        tracing::warn!(pod = %pod.name, error = %d, "could not delete a pod");
                    }
                    Err(e)
                }
            }
        })
    }
}

/// Everything between a Running pod and a session ready for its CLI.
async fn prepare(pod: Arc<Pod>, req: EnvRequest) -> Result<KubernetesEnvironment> {
    let mux: Vec<String> = MUX.iter().map(|s| s.to_string()).collect();
    let exec = pod.exec(&mux).await?;
    // The stream lives as long as its status future: held by a task that also drains the pod
    // agent's own diagnostics (stderr) into the log, until the stream ends.
    let (status, mut diagnostics) = (exec.status, exec.stderr);
    let name = pod.name.clone();
    tokio::spawn(async move {
        let mut text = Vec::new();
        let _ = (&mut diagnostics)
            .take(MAX_STEP_OUTPUT as u64)
            .read_to_end(&mut text)
            .await;
        let end = status.await;
        tracing::debug!(pod = %name, ?end, diagnostics = %String::from_utf8_lossy(&text), "the pod's stream ended");
    });
    let shell = RemoteShell::start(exec.stdout, exec.stdin).await?;
    let image = inspect_image(&shell, &pod.image).await?;
    // The pod's directories are empty volumes (cluster.rs): the socket directory, private to
    // the session's user, is made here.
    let bare = [("PATH".to_string(), image.path.clone())];
    Steps {
        shell: &shell,
        env: &bare,
    }
    .run(
        "making the socket directory",
        ["mkdir", "-p", "-m", "0700", SOCKETS]
            .map(String::from)
            .to_vec(),
        &[],
        STEP_TIMEOUT,
        "/",
    )
    .await?;
    let allowed: &[String] = req
        .sandbox
        .as_ref()
        .map_or(&[], |s| s.allowed_domains.as_slice());
    let gateway =
        Gateway::start(allowed, &req.env, req.egress.clone(), Some(&req.repo_root)).await?;
    for (name, engine_side) in gateway.sockets() {
        shell
            .listen(&format!("{SOCKETS}/{name}"), engine_side)
            .await?;
    }
    let engine_dirs: Vec<String> = [
        env_value(&req.env, "HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
        Some(req.repo_root.clone()),
        std::env::current_dir().ok(),
    ]
    .into_iter()
    .flatten()
    // `/` (a HOME of root's on some systems) would name everything.
    .filter(|d| d.parent().is_some())
    .map(|d| d.display().to_string())
    .collect();
    let mut env = pod_env(gateway.env(), &engine_dirs, &image);
    if let Some(sandbox) = &req.sandbox {
        // The agent's commands get their share of the session's tasks in the jail's user
        // namespace (RLIMIT_NPROC: the pod's processes run as a user other than root, which the
        // kernel does hold to it): a command that forks thousands of processes fails with
        // EAGAIN and the CLI keeps its headroom under the pod's pid limit.
        let share = commands_share(&sandbox.limits).tasks;
        use_commands_prefix(
            &mut env,
            &format!("{}/{PREFIX_SCRIPT}", crate::sandbox::jail::SOCKET_DIR),
            share.map(|n| ("CRA_TOOLS_NPROC".to_string(), n.to_string())),
        );
    }
    let step = Steps {
        shell: &shell,
        env: &env,
    };
    step.write_file(
        &format!("{STATE}/gitconfig"),
        with_identity(gateway.git_config()).as_bytes(),
        "0644",
    )
    .await?;
    if req.sandbox.is_some() {
        let script = format!("{SOCKETS}/{PREFIX_SCRIPT}");
        step.write_file(&script, commands_prefix_script().as_bytes(), "0755")
            .await?;
    }
    let (default_branch, checkout) = match &req.workspace {
        Workspace::Checkout(p) => (p.default_branch.clone(), Some(p)),
        Workspace::View(v) => (v.default_branch.clone(), None),
    };
    let base = send_repository(&step, &req.repo_root, &default_branch).await?;
    let history = history::HistoryServer::start(&req.repo_root, &default_branch, &base).await?;
    shell
        .listen(&format!("{SOCKETS}/{}", history::SOCKET), history.socket())
        .await?;
    let sandboxed = req.sandbox.is_some();
    if sandboxed {
        step.jail_works().await?;
    }
    let mut snapshot = None;
    if let Some(p) = checkout {
        step.run_sh(
            "branch",
            &format!("git checkout -q -b {}", sh_quote(&p.branch)),
            STEP_TIMEOUT,
        )
        .await?;
        if let Some(setup) = p.setup.as_ref().filter(|s| !s.is_empty()) {
            step.setup(setup, sandboxed, p.setup_timeout).await?;
        }
        snapshot = Some(step.snapshot(&base, sandboxed).await?);
    }
    Ok(KubernetesEnvironment {
        pod,
        shell: Some(shell),
        gateway: Some(gateway),
        env,
        workdir: PathBuf::from(WORKDIR),
        repo_root: req.repo_root,
        base,
        snapshot,
        sandboxed,
        _history: history,
    })
}

/// What the session's image has, as far as the adapter cares.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ImageFacts {
    /// The image's own PATH (its `Env`, as pid 1 got it), or [`DEFAULT_PATH`].
    path: String,
    /// bash where the image has it (the CLI's shell of choice), else `/bin/sh`.
    shell: String,
    /// The image's git (what the runtime's `git` runs).
    git: String,
}

/// Asks the pod what its image has, before anything else runs in it: `/bin/sh`, then git and
/// the tools of [`IMAGE_NEEDS`] on the image's PATH. An image lacking one is `ERR_PROVISION`
/// naming what is missing.
async fn inspect_image(shell: &RemoteShell, image: &str) -> Result<ImageFacts> {
    let needs = "a session's image needs /bin/sh, git and the POSIX tools the adapter runs \
                 (README: Kubernetes backend, \"The session's image\")";
    let run = |argv: Vec<String>, path: &str| {
        let cmd = RemoteCommand {
            argv,
            env: vec![("PATH".into(), path.to_string())],
            cwd: "/".into(),
        };
        async move {
            tokio::time::timeout(STEP_TIMEOUT, shell.run(cmd, &[], MAX_STEP_OUTPUT))
                .await
                .map_err(|_| {
                    provision_error(format!(
                        "the image {image} did not answer within {}s",
                        STEP_TIMEOUT.as_secs()
                    ))
                })?
        }
    };
    // pid 1 (cra-pod idle) runs with the image's own environment.
    let environ = run(
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "exec cat /proc/1/environ".into(),
        ],
        DEFAULT_PATH,
    )
    .await
    .map_err(|e| {
        provision_error(format!(
            "the image {image} cannot run /bin/sh ({}): {needs}",
            e.message
        ))
    })?;
    if !environ.status.success() {
        return Err(provision_error(format!(
            "the image {image} cannot run `cat` with /bin/sh ({}: {}): {needs}",
            environ.status,
            String::from_utf8_lossy(&environ.stderr).trim()
        )));
    }
    let path = environ
        .stdout
        .split(|b| *b == 0)
        .find_map(|v| v.strip_prefix(b"PATH="))
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PATH.to_string());
    let script = format!(
        "for t in {}; do command -v \"$t\" >/dev/null 2>&1 || echo \"missing $t\"; done; \
         printf 'git %s\\n' \"$(command -v git)\"; command -v bash || :",
        IMAGE_NEEDS.join(" ")
    );
    let probe = run(vec!["/bin/sh".into(), "-c".into(), script], &path).await?;
    let out = String::from_utf8_lossy(&probe.stdout);
    let missing: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("missing "))
        .collect();
    if !probe.status.success() || !missing.is_empty() {
        return Err(provision_error(format!(
            "the image {image} lacks {} (looked on its PATH {path}): {needs}",
            if missing.is_empty() {
                format!("what the probe needs ({})", probe.status)
            } else {
                missing.join(", ")
            }
        )));
    }
    let shell = out
        .lines()
        .find(|l| l.starts_with('/'))
        .unwrap_or("/bin/sh")
        .to_string();
    let git = out
        .lines()
        .find_map(|l| l.strip_prefix("git /"))
        .map(|g| format!("/{g}"))
        .ok_or_else(|| {
            provision_error(format!(
                "the image {image} has git on its PATH {path} only as a shell function or alias"
            ))
        })?;
    Ok(ImageFacts { path, shell, git })
}

/// The environment of a process in the pod: the gateway's environment inside (credentials
/// as placeholders) without what names the engine's machine — its paths, user and shell
/// variables, and any value naming one of `engine_dirs` (its HOME and the CLI's, the repository,
/// its working directory: `npm_config_cache=/home/me/.npm` means nothing in a pod and tells the agent about
/// the engine) — plus the pod's own: the image's PATH with the runtime after it (the image's
/// own tools come first), its shell.
fn pod_env(
    inside: &[(String, String)],
    engine_dirs: &[String],
    image: &ImageFacts,
) -> Vec<(String, String)> {
    const ENGINE_ONLY: &[&str] = &[
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "PWD",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "NODE_EXTRA_CA_CERTS",
        "CLAUDE_CONFIG_DIR",
        "XDG_CONFIG_HOME",
        "XDG_CACHE_HOME",
        "XDG_DATA_HOME",
        "XDG_STATE_HOME",
        "XDG_RUNTIME_DIR",
    ];
    let names_engine = |v: &str| engine_dirs.iter().any(|d| v.contains(d.as_str()));
    let mut env: Vec<(String, String)> = inside
        .iter()
        .filter(|(k, v)| {
            !ENGINE_ONLY.contains(&k.to_ascii_uppercase().as_str()) && !names_engine(v)
        })
        .cloned()
        .collect();
    let path = format!("{RUNTIME_HISTORY}:{}:{RUNTIME_BIN}", image.path);
    for (k, v) in [
        ("PATH", path.as_str()),
        ("HOME", HOME),
        ("USER", "agent"),
        ("LOGNAME", "agent"),
        ("SHELL", image.shell.as_str()),
        ("CLAUDE_CONFIG_DIR", "/home/agent/.claude"),
        ("CRA_GIT", image.git.as_str()),
    ] {
        env.push((k.to_string(), v.to_string()));
    }
    if !env.iter().any(|(k, _)| k == "LANG") {
        env.push(("LANG".into(), "C.UTF-8".into()));
    }
    env
}

/// The session's git config with an identity: where the repository's configuration names no
/// one, a fixed one (in a pod git cannot make one up from the host name as it does locally,
/// and an agent's `git commit` must work).
fn with_identity(config: &str) -> String {
    let mut config = config.to_string();
    let has = |key: &str| {
        config
            .lines()
            .any(|l| l.trim_start().starts_with(&format!("{key} = ")))
    };
    let (name, email) = (has("name"), has("email"));
    if !name || !email {
        config.push_str("[user]\n");
        if !name {
            config.push_str("\tname = \"Claude agent\"\n");
        }
        if !email {
            config.push_str("\temail = \"agent@claude-runtime-adapter.invalid\"\n");
        }
    }
    config
}

/// `argv` in the pod's jail with the checkout in `mode` (`rw`, `ro`); as it is for `None`
/// (`sandbox: false`).
fn confined(mode: Option<&str>, argv: Vec<String>) -> Vec<String> {
    let Some(mode) = mode else { return argv };
    [JAIL, mode, WORKDIR, "--"]
        .into_iter()
        .map(String::from)
        .chain(argv)
        .collect()
}

/// `'…'` for sh.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Steps run in the pod while provisioning and extracting.
struct Steps<'a> {
    shell: &'a RemoteShell,
    env: &'a [(String, String)],
}

impl Steps<'_> {
    /// `sh -c script` in the checkout (or `/` before it exists), bounded; its stdout.
    /// `sh -c script` in the checkout, bounded; its stdout.
    async fn run_sh(&self, what: &str, script: &str, limit: Duration) -> Result<Vec<u8>> {
        let argv = vec!["sh".into(), "-c".into(), script.into()];
        self.run(what, argv, &[], limit, WORKDIR).await
    }

    /// `argv` in `cwd` with `input`, bounded; its stdout, or the error naming `what`.
    async fn run(
        &self,
        what: &str,
        argv: Vec<String>,
        input: &[u8],
        limit: Duration,
        cwd: &str,
    ) -> Result<Vec<u8>> {
        let cmd = RemoteCommand {
            argv,
            env: self.env.to_vec(),
            cwd: cwd.to_string(),
        };
        let out = tokio::time::timeout(limit, self.shell.run(cmd, input, MAX_STEP_OUTPUT))
            .await
            .map_err(|_| {
                provision_error(format!(
                    "{what} in the session's pod did not finish within {}s",
                    limit.as_secs()
                ))
            })??;
        if !out.status.success() {
            return Err(provision_error(format!(
                "{what} in the session's pod failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(out.stdout)
    }

    /// Writes `content` to `path` in the pod, with file mode `mode` (octal).
    async fn write_file(&self, path: &str, content: &[u8], mode: &str) -> Result<()> {
        let path = sh_quote(path);
        let script = format!("cat > {path} && chmod {mode} {path}");
        self.run(
            "writing a file",
            vec!["sh".into(), "-c".into(), script],
            content,
            STEP_TIMEOUT,
            "/",
        )
        .await
        .map(drop)
    }

    /// The jail starts in this pod (user namespaces allowed): otherwise nothing runs.
    async fn jail_works(&self) -> Result<()> {
        let argv = confined(Some("ro"), vec!["true".into()]);
        self.run("cra-jail", argv, &[], STEP_TIMEOUT, WORKDIR)
            .await
            .map(drop)
            .map_err(|e| {
                AdapterError::new(
                    ErrorCode::SandboxUnavailable,
                    format!(
                        "the session cannot be confined in its pod: {}; the cluster must allow \
                         user namespaces in pods (README: Kubernetes backend), or set \
                         sandbox: false to run the agent with the pod as its only boundary",
                        e.message
                    ),
                )
            })
    }

    async fn setup(&self, setup: &[String], sandboxed: bool, limit: Duration) -> Result<()> {
        let argv = confined(sandboxed.then_some("rw"), setup.to_vec());
        self.run("worktreeSetupCommand", argv, &[], limit, WORKDIR)
            .await
            .map(drop)
    }

    /// The checkout now, as a commit on `base` kept under `refs/cra/snapshot` (so the agent's
    /// `git gc` keeps it): what the patch is measured against; with the pod's clock before it
    /// was staged, less the margin, which bounds what extraction trusts the index's stat data
    /// for (`git::patch`'s module docs: the same rule as locally, with the pod's own clock).
    async fn snapshot(&self, base: &str, sandboxed: bool) -> Result<PodSnapshot> {
        // Git in the pod ignores what the agent may configure to run, as the local one does.
        let g = neutral_git_sh();
        let script = format!(
            "set -e; l=$(( $(date +%s) - {STAT_TRUST_MARGIN_SECS} )); i=/tmp/cra-snapshot.index; \
             cp -p .git/index \"$i\"; GIT_INDEX_FILE=$i {g} update-index -q --really-refresh; \
             GIT_INDEX_FILE=$i {g} add -A; t=$(GIT_INDEX_FILE=$i {g} write-tree); \
             c=$({COMMIT_ENV} {g} commit-tree \"$t\" -p {base} -m snapshot); \
             {g} update-ref refs/cra/snapshot \"$c\"; echo \"$c $l\""
        );
        let argv = confined(
            sandboxed.then_some("rw"),
            vec!["sh".into(), "-c".into(), script],
        );
        let out = self
            .run("snapshot", argv, &[], STEP_TIMEOUT, WORKDIR)
            .await?;
        let out = String::from_utf8_lossy(&out);
        let mut words = out.split_whitespace();
        match (words.next(), words.next().map(str::parse::<u64>)) {
            (Some(commit), Some(Ok(limit))) => Ok(PodSnapshot {
                commit: commit.to_string(),
                trust_before: limit.max(1),
            }),
            _ => Err(provision_error(format!(
                "the snapshot step in the pod answered {:?}, not a commit and a time",
                out.trim()
            ))),
        }
    }
}

/// An Implementor's post-setup snapshot in its pod: the commit, and the index timestamp
/// extraction caps the agent's index at (Unix seconds, the pod's clock).
struct PodSnapshot {
    commit: String,
    trust_before: u64,
}

/// `commit-tree` with a fixed identity and date: only the commit's tree is ever used.
const COMMIT_ENV: &str = "GIT_AUTHOR_NAME=cra GIT_AUTHOR_EMAIL=cra@localhost \
    GIT_COMMITTER_NAME=cra GIT_COMMITTER_EMAIL=cra@localhost \
    GIT_AUTHOR_DATE='@0 +0000' GIT_COMMITTER_DATE='@0 +0000'";

/// Extraction in the jail: stage everything into a temporary index (the agent's index copied
/// only when it is a regular file, its mtime capped at `$3` so that git compares by content
/// every entry recorded since the snapshot: `git::patch`'s module docs), commit the final
/// tree, and write a bundle of the snapshot and final commits to stdout. `$1` base, `$2`
/// snapshot commit, `$3` the snapshot's trust limit (Unix seconds).
const EXTRACT_SCRIPT: &str = r#"set -e
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

/// The repository goes in: the commit `default_branch` names, packed alone (its tree, no
/// history: [`history`]) and streamed into the pod, checked out at [`WORKDIR`] shallow at it,
/// with `origin` the session's history server. Returns the base commit.
async fn send_repository(
    step: &Steps<'_>,
    repo_root: &Path,
    default_branch: &str,
) -> Result<String> {
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
    let mut pack = git_command(repo_root, &["pack-objects", "--stdout", "-q"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| provision_error("cannot run git pack-objects").with_cause(e))?;
    let (Some(mut pack_in), Some(mut pack_out)) = (pack.stdin.take(), pack.stdout.take()) else {
        return Err(provision_error("git pack-objects has no stdio"));
    };
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
        // Moved in, so that the pipe closes (EOF: pack-objects starts) once the list is in.
        let list = async move { pack_in.write_all(&objects.stdout).await };
        let copy = async {
            tokio::io::copy(&mut pack_out, &mut stdin).await?;
            stdin.shutdown().await
        };
        let mut said = Vec::new();
        let mut diagnostics = (&mut stderr).take(MAX_STEP_OUTPUT as u64);
        let (l, c, _) = tokio::join!(list, copy, diagnostics.read_to_end(&mut said));
        (l.and(c), said)
    })
    .await;
    let packed = pack.wait().await;
    let received = tokio::time::timeout(STEP_TIMEOUT, control.wait()).await;
    match (sent, packed, received) {
        (Ok((Ok(()), _)), Ok(p), Ok(Some(r))) if p.success() && r.success() => Ok(base),
        (sent, p, r) => {
            let mut err = String::new();
            if let Some(mut e) = pack.stderr.take() {
                let _ = e.read_to_string(&mut err).await;
            }
            let said = match &sent {
                Ok((_, said)) => String::from_utf8_lossy(said).trim().to_string(),
                Err(_) => format!("not within {}s", limit.as_secs()),
            };
            Err(provision_error(format!(
                "cannot send {default_branch} to the session's pod (git pack-objects {p:?}, \
                 the pod's checkout {r:?}): {} {said}",
                err.trim()
            )))
        }
    }
}

fn provision_error(message: impl Into<String>) -> AdapterError {
    AdapterError::new(ErrorCode::Provision, message)
}

/// One session's pod.
pub struct KubernetesEnvironment {
    pod: Arc<Pod>,
    shell: Option<RemoteShell>,
    gateway: Option<Gateway>,
    env: Vec<(String, String)>,
    workdir: PathBuf,
    repo_root: PathBuf,
    base: String,
    /// The Implementor's snapshot (None: a read-only session).
    snapshot: Option<PodSnapshot>,
    sandboxed: bool,
    /// Serves the pod's `git fetch --unshallow` while the session lives.
    _history: history::HistoryServer,
}

impl KubernetesEnvironment {
    /// The pod still runs commands (bounded).
    async fn answers(&self, shell: &RemoteShell) -> Result<()> {
        let alive = RemoteCommand {
            argv: vec!["true".into()],
            env: self.env.clone(),
            cwd: "/".into(),
        };
        match tokio::time::timeout(Duration::from_secs(5), shell.run(alive, &[], 0)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(AdapterError::new(
                ErrorCode::AgentFailed,
                "the pod did not answer within 5 s",
            )),
        }
    }

    fn shell(&self) -> Result<&RemoteShell> {
        self.shell
            .as_ref()
            .ok_or_else(|| AdapterError::new(ErrorCode::Internal, "the pod's stream is closed"))
    }

    async fn read_work(&self, snapshot: &PodSnapshot) -> Result<String> {
        let shell = self.shell()?;
        let argv = confined(
            self.sandboxed.then_some("rw"),
            vec![
                "sh".to_string(),
                "-c".into(),
                EXTRACT_SCRIPT.into(),
                "sh".into(),
                self.base.clone(),
                snapshot.commit.clone(),
                snapshot.trust_before.to_string(),
            ],
        );
        let mut env = self.env.clone();
        env.push(("G".into(), neutral_git_sh()));
        env.push(("C".into(), COMMIT_ENV.into()));
        let mut exec = shell
            .spawn(RemoteCommand {
                argv,
                env,
                cwd: WORKDIR.into(),
            })
            .await?;
        let scratch = Scratch::create(&self.repo_root).await?;
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
        let copied = copied.map_err(|e| {
            AdapterError::extract("cannot read the work out of the pod").with_cause(e)
        })?;
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
        scratch.patch(&bundle_path, &self.base).await
    }
}

/// A scratch repository on the engine borrowing the repository's objects, where the work's
/// bundle is fetched and the patch computed; removed when dropped.
struct Scratch {
    dir: ScratchDir,
}

impl Scratch {
    async fn create(repo_root: &Path) -> Result<Scratch> {
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

    async fn patch(&self, bundle: &Path, base: &str) -> Result<String> {
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

impl Environment for KubernetesEnvironment {
    fn workdir(&self) -> &Path {
        &self.workdir
    }

    fn has_checkout(&self) -> bool {
        self.snapshot.is_some()
    }

    fn temp_dir(&self) -> PathBuf {
        PathBuf::from("/tmp")
    }

    fn describe(&self) -> String {
        format!(
            "Kubernetes pod {} of image {} on node {}; {}; network only through the egress \
             proxy, over the pod's exec stream; the pod's resources are its limits",
            self.pod.name,
            self.pod.image,
            self.pod.node,
            if self.sandboxed {
                "bubblewrap in the pod"
            } else {
                "no OS sandbox in the pod"
            }
        )
    }

    fn limits_are_fallback(&self) -> bool {
        false
    }

    fn keeps_unreadable_work(&self) -> bool {
        false
    }

    fn limit_hit(&self) -> Option<String> {
        None
    }

    fn lost(&self) -> BoxFuture<'_, Option<AdapterError>> {
        // A process killed for memory ends the whole pod (`cra-pod idle`), so the pod's own
        // status says it — once the kubelet has noticed, a second or two after the stream
        // broke: a broken stream waits (bounded) for the pod's status to say why.
        Box::pin(async move {
            // The agent may have ended as the pod went, before its stream broke: a command
            // the pod no longer answers tells.
            let broke = match &self.shell {
                Some(shell) => match shell.closed().now_or_never() {
                    Some(e) => Some(e),
                    None => self.answers(shell).await.err(),
                },
                None => None,
            };
            let Some(broke) = broke else {
                return self.pod.why_gone().await;
            };
            let deadline = tokio::time::Instant::now() + LOST_WAIT;
            loop {
                if let Some(gone) = self.pod.why_gone().await {
                    return Some(gone);
                }
                if tokio::time::Instant::now() >= deadline {
                    return Some(AdapterError::new(
                        ErrorCode::AgentFailed,
                        format!(
                            "the stream to pod {} broke ({}) while the pod still shows as running",
                            self.pod.name, broke.message
                        ),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    }

    fn exec(&mut self, cmd: ExecCommand) -> BoxFuture<'_, Result<Exec>> {
        Box::pin(async move {
            let mode = if self.snapshot.is_some() { "rw" } else { "ro" };
            let cli = std::iter::once("sh".to_string())
                .chain(
                    bridged_argv(std::ffi::OsStr::new(CLI), &cmd.args)
                        .into_iter()
                        .map(|a| a.to_string_lossy().into_owned()),
                )
                .collect();
            let argv = confined(self.sandboxed.then_some(mode), cli);
            let mut env = self.env.clone();
            if !self.sandboxed {
                // Without the jail the sockets are where the pod agent made them.
                env.push(("CRA_SOCKET_DIR".into(), SOCKETS.into()));
            }
            self.shell()?
                .spawn(RemoteCommand {
                    argv,
                    env,
                    cwd: WORKDIR.into(),
                })
                .await
        })
    }

    fn extract_patch(&self) -> BoxFuture<'_, Result<String>> {
        Box::pin(async move {
            match &self.snapshot {
                Some(s) => self.read_work(s).await,
                None => Ok(String::new()),
            }
        })
    }

    fn destroy(&mut self, _keep_checkout: bool) -> BoxFuture<'_, Result<()>> {
        // A pod cannot be kept for a later sweep the way a local checkout is: what could be
        // read was read; the pod goes either way (the issue: deleted on every end).
        Box::pin(async move {
            if let Some(shell) = self.shell.take() {
                if let Err(e) = shell.shutdown().await {
                    tracing::debug!(pod = %self.pod.name, error = %e, "the pod's stream ended before Bye");
                }
            }
            self.gateway = None;
            self.pod.delete().await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_environment_names_nothing_of_the_engines_machine() {
        let inside: Vec<(String, String)> = [
            ("PATH", "/home/me/.cargo/bin:/usr/bin"),
            ("HOME", "/home/me"),
            ("npm_config_cache", "/home/me/.npm"),
            ("INIT_CWD", "/srv/engine"),
            ("REPO_HINT", "/srv/repo/sub"),
            ("ANTHROPIC_API_KEY", "sk-ant-sandbox-placeholder-x"),
            ("LANG", "de_DE.UTF-8"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let dirs = ["/home/me", "/srv/repo", "/srv/engine"].map(String::from);
        let image = ImageFacts {
            path: "/opt/node/bin:/usr/bin:/bin".into(),
            shell: "/usr/bin/bash".into(),
            git: "/usr/bin/git".into(),
        };
        let env = pod_env(&inside, &dirs, &image);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("HOME"), Some(HOME));
        assert_eq!(
            get("PATH"),
            Some("/opt/claude-runtime-adapter/history:/opt/node/bin:/usr/bin:/bin:/opt/claude-runtime-adapter/bin")
        );
        assert_eq!(get("SHELL"), Some("/usr/bin/bash"));
        assert_eq!(get("LANG"), Some("de_DE.UTF-8"));
        assert_eq!(
            get("ANTHROPIC_API_KEY"),
            Some("sk-ant-sandbox-placeholder-x")
        );
        for k in ["npm_config_cache", "INIT_CWD", "REPO_HINT"] {
            assert_eq!(get(k), None, "{k}");
        }
        assert!(!env
            .iter()
            .any(|(_, v)| v.contains("/home/me") || v.contains("/srv")));
    }
}
