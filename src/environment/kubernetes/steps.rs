//! Steps run in the pod while provisioning and extracting ([`Steps`]): commands over the pod's
//! stream, bounded in time and in the output kept, inside the pod's jail when the session is
//! sandboxed ([`confined`]), a failure naming its step; among them the Implementor's
//! post-setup snapshot, taken as locally.

use std::time::Duration;

use super::layout::{JAIL, WORKDIR};
use crate::environment::remote::{RemoteCommand, RemoteShell};
use crate::error::{AdapterError, ErrorCode, Result};
use crate::git::command::neutral_git_sh;
use crate::git::patch::STAT_TRUST_MARGIN_SECS;

/// Output kept of a provisioning step, for its error message.
pub(super) const MAX_STEP_OUTPUT: usize = 64 << 10;
/// Bound on the small provisioning steps in the pod (clone excepted: it is bounded by the
/// setup timeout with the setup command).
pub(super) const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// `ERR_PROVISION`: the session's pod could not be made ready.
pub(super) fn provision_error(message: impl Into<String>) -> AdapterError {
    AdapterError::new(ErrorCode::Provision, message)
}

/// `argv` in the pod's jail with the checkout in `mode` (`rw`, `ro`); as it is for `None`
/// (`sandbox: false`).
pub(super) fn confined(mode: Option<&str>, argv: Vec<String>) -> Vec<String> {
    let Some(mode) = mode else { return argv };
    [JAIL, mode, WORKDIR, "--"]
        .into_iter()
        .map(String::from)
        .chain(argv)
        .collect()
}

/// `ERR_SANDBOX_UNAVAILABLE` for a jailed step that failed (`e`).
pub(super) fn not_confined(e: AdapterError) -> AdapterError {
    AdapterError::new(
        ErrorCode::SandboxUnavailable,
        format!(
            "the session cannot be confined in its pod: {}; the cluster must allow user \
             namespaces in pods (README: Kubernetes backend), or set sandbox: false to run the \
             agent with the pod as its only boundary",
            e.message
        ),
    )
}

/// `'…'` for sh.
pub(super) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Steps run in the pod while provisioning and extracting.
pub(super) struct Steps<'a> {
    pub shell: &'a RemoteShell,
    pub env: &'a [(String, String)],
}

impl Steps<'_> {
    /// `argv` in `cwd` with `input`, bounded; its stdout, or the error naming `what`.
    pub(super) async fn run(
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
    pub(super) async fn write_file(&self, path: &str, content: &[u8], mode: &str) -> Result<()> {
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
    pub(super) async fn jail_works(&self) -> Result<()> {
        let argv = confined(Some("ro"), vec!["true".into()]);
        self.run("cra-jail", argv, &[], STEP_TIMEOUT, WORKDIR)
            .await
            .map(drop)
            .map_err(not_confined)
    }

    pub(super) async fn setup(
        &self,
        setup: &[String],
        sandboxed: bool,
        limit: Duration,
    ) -> Result<()> {
        let argv = confined(sandboxed.then_some("rw"), setup.to_vec());
        self.run("worktreeSetupCommand", argv, &[], limit, WORKDIR)
            .await
            .map(drop)
    }

    /// The checkout now, as a commit on `base` kept under `refs/cra/snapshot` (so the agent's
    /// `git gc` keeps it): what the patch is measured against; with the pod's clock before it
    /// was staged, less the margin, which bounds what extraction trusts the index's stat data
    /// for (`git::patch`'s module docs: the same rule as locally, with the pod's own clock).
    pub(super) async fn snapshot(&self, base: &str, sandboxed: bool) -> Result<PodSnapshot> {
        // Git in the pod ignores what the agent may configure to run, as the local one does.
        let g = neutral_git_sh();
        let script = format!(
            "set -e; {}; i=/tmp/cra-snapshot.index; cp -p .git/index \"$i\"; \
             GIT_INDEX_FILE=$i {g} update-index -q --really-refresh; \
             GIT_INDEX_FILE=$i {g} add -A; t=$(GIT_INDEX_FILE=$i {g} write-tree); {}",
            trust_limit_sh(),
            snapshot_sh(&g, "\"$t\"", base)
        );
        let argv = confined(
            sandboxed.then_some("rw"),
            vec!["sh".into(), "-c".into(), script],
        );
        let out = self
            .run("snapshot", argv, &[], STEP_TIMEOUT, WORKDIR)
            .await?;
        let out = String::from_utf8_lossy(&out);
        PodSnapshot::read(&out).ok_or_else(|| {
            provision_error(format!(
                "the snapshot step in the pod answered {:?}, not a commit and a time",
                out.trim()
            ))
        })
    }

    /// Whether the node's base just made (its tree at [`WORKDIR`], bound writable) may end its
    /// layered sessions by their candidates (`cra-pod candidates`; [`super::work::EXTRACT_SCRIPT`]):
    /// - staged with every entry compared by content (the index's copy dated 1970, so that git
    ///   takes every entry for racily clean), the checkout gives the snapshot's tree: the
    ///   snapshot says what every file holds;
    /// - the base's index as it is, which every layer starts from, is the commit's tree.
    ///
    /// Then every path the agent did not touch ends, in the patch, as the commit has it on
    /// either end: the whole staging finds it as the snapshot has it (no change to lay on the
    /// commit), or as the index has it, which is the commit's; the limited staging keeps the
    /// index's. So a setup's own changes and untracked output stay out of the patch on both.
    /// Where the snapshot is the commit's tree, both together mean every file holds its
    /// entry's content, so the two final trees are the same tree. False, and the base's
    /// sessions stage their whole checkout, where that does not hold or the step fails.
    pub(super) async fn verify_base(&self, snapshot: &PodSnapshot, pod: &str) -> bool {
        let g = neutral_git_sh();
        let script = format!(
            "set -e; v=/tmp/cra-verify.index; w=/tmp/cra-base.index; cp .git/index \"$v\"; \
             cp .git/index \"$w\"; touch -m -d @1 \"$v\"; \
             GIT_INDEX_FILE=$v {g} update-index -q --really-refresh >/dev/null || :; \
             GIT_INDEX_FILE=$v {g} add -A; a=$(GIT_INDEX_FILE=$v {g} write-tree); \
             b=$(GIT_INDEX_FILE=$w {g} write-tree); \
             echo \"$a $b\"; {g} rev-parse \"$1^{{tree}}\" \"$1^^{{tree}}\""
        );
        let argv = confined(
            Some("rw"),
            vec![
                "sh".into(),
                "-c".into(),
                script,
                "sh".into(),
                snapshot.commit.clone(),
            ],
        );
        let why = match self
            .run("the base's verification", argv, &[], STEP_TIMEOUT, WORKDIR)
            .await
        {
            Ok(out) => {
                let out = String::from_utf8_lossy(&out);
                // The tree staged by content, the index's, the snapshot's, the commit's.
                match out.split_whitespace().collect::<Vec<_>>()[..] {
                    [by_content, index, snapshot, commit]
                        if by_content == snapshot && index == commit =>
                    {
                        return true
                    }
                    _ => format!(
                        "the trees staged by content, of its index, of the snapshot and of the \
                         commit are {:?}",
                        out.trim()
                    ),
                }
            }
            Err(e) => e.message,
        };
        tracing::debug!(pod = %pod, "the node's base is not verified: its sessions stage their whole checkout: {why}");
        false
    }
}

/// An Implementor's post-setup snapshot in its pod: the commit, and the index timestamp
/// extraction caps the agent's index at (Unix seconds, the pod's clock).
pub(super) struct PodSnapshot {
    pub commit: String,
    pub trust_before: u64,
}

impl PodSnapshot {
    /// `COMMIT LIMIT`, as the snapshot's scripts print it.
    pub(super) fn read(text: &str) -> Option<PodSnapshot> {
        let mut words = text.split_whitespace();
        match (
            words.next(),
            words.next().map(str::parse::<u64>),
            words.next(),
        ) {
            (Some(commit), Some(Ok(limit)), None) => Some(PodSnapshot {
                commit: commit.to_string(),
                trust_before: limit.max(1),
            }),
            _ => None,
        }
    }
}

/// `l=`: the pod's clock less the margin, the snapshot's trust limit; taken before anything
/// of the snapshot is staged.
pub(super) fn trust_limit_sh() -> String {
    format!("l=$(( $(date +%s) - {STAT_TRUST_MARGIN_SECS} ))")
}

/// The snapshot's commit of `tree` on `base` with `git` = `g`, kept under `refs/cra/snapshot`
/// and printed with `$l` ([`trust_limit_sh`]) as [`PodSnapshot::read`] reads it. Shared by
/// the snapshot step and the receiving script's shortcut (`work::plain_snapshot`).
pub(super) fn snapshot_sh(g: &str, tree: &str, base: &str) -> String {
    format!(
        "c=$({COMMIT_ENV} {g} commit-tree {tree} -p {base} -m snapshot); \
         {g} update-ref refs/cra/snapshot \"$c\"; echo \"$c $l\""
    )
}

/// `commit-tree` with a fixed identity and date: only the commit's tree is ever used.
pub(super) const COMMIT_ENV: &str = "GIT_AUTHOR_NAME=cra GIT_AUTHOR_EMAIL=cra@localhost \
    GIT_COMMITTER_NAME=cra GIT_COMMITTER_EMAIL=cra@localhost \
    GIT_AUTHOR_DATE='@0 +0000' GIT_COMMITTER_DATE='@0 +0000'";
