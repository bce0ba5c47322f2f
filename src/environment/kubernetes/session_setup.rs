//! What every session's pod is given over its stream, whether the pod was just made for it
//! ([`super::prepare`]) or a continuation takes it over ([`super::resume`]): the shell over the
//! stream, the pod's directories, the CLI's environment, the egress's sockets with the agent's
//! scripts, and the git identity.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::AsyncReadExt;
use tracing::Instrument;

use super::cluster::{Pod, PodExec};
use super::image::{pod_env, ImageFacts};
use super::layout::{SOCKETS, WORKDIR};
use super::steps::{Steps, MAX_STEP_OUTPUT, STEP_TIMEOUT};
use crate::config::SandboxConfig;
use crate::environment::remote::RemoteShell;
use crate::environment::EnvRequest;
use crate::error::Result;
use crate::process::env_value;
use crate::sandbox::commands::{commands_share, WRAPPED_TOOLS};
use crate::sandbox::{
    commands_prefix_script, tool_wrapper_script, use_commands_prefix, use_tool_wrappers, Egress,
    PREFIX_SCRIPT,
};

/// The shell over the pod's stream (`cra-pod mux`).
pub(super) async fn open_shell(pod: &Arc<Pod>, exec: PodExec) -> Result<RemoteShell> {
    // The stream may have opened before the pod's status named its image; what needs that
    // status (the runtime's note, the node base's key) waits for it, the rest does not.
    // In the session's span: its log reaches the session's logger.
    tokio::spawn(
        {
            let pod = pod.clone();
            async move {
                pod.image_id().await;
            }
        }
        .in_current_span(),
    );
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
    RemoteShell::start(exec.stdout, exec.stdin).await
}

/// The pod's directories made, and the CLI's environment there for `req`'s session with
/// `egress` ([`session_env`]).
pub(super) async fn dirs_and_env(
    shell: &RemoteShell,
    image: &ImageFacts,
    req: &EnvRequest,
    egress: &Egress,
) -> Result<Vec<(String, String)>> {
    make_dirs(shell, &image.path).await?;
    let dirs = engine_dirs(
        &req.env,
        &req.repo_root,
        std::env::var_os("HOME"),
        std::env::current_dir().ok(),
    );
    Ok(session_env(
        egress.env(),
        &dirs,
        image,
        req.sandbox.as_ref(),
    ))
}

/// The pod's directories are empty volumes (cluster.rs): the socket directory, private to the
/// session's user, is made here, and the checkout's, which the jail's probe binds while the
/// repository is still arriving. `path`: the image's PATH.
async fn make_dirs(shell: &RemoteShell, path: &str) -> Result<()> {
    let bare = [("PATH".to_string(), path.to_string())];
    Steps { shell, env: &bare }
        .run(
            "making the socket and checkout directories",
            vec![
                "sh".into(),
                "-c".into(),
                format!("mkdir -p -m 0700 {SOCKETS} && mkdir -p {WORKDIR}"),
            ],
            &[],
            STEP_TIMEOUT,
            "/",
        )
        .await
        .map(drop)
}

/// The engine's directories, which the pod's environment must not name ([`pod_env`]): the
/// session's HOME, the engine's own (`engine_home`), the repository and the engine's working
/// directory.
fn engine_dirs(
    session_env: &[(String, String)],
    repo_root: &Path,
    engine_home: Option<std::ffi::OsString>,
    engine_cwd: Option<PathBuf>,
) -> Vec<String> {
    [
        env_value(session_env, "HOME").map(PathBuf::from),
        engine_home.map(PathBuf::from),
        Some(repo_root.to_path_buf()),
        engine_cwd,
    ]
    .into_iter()
    .flatten()
    // `/` (a HOME of root's on some systems) would name everything.
    .filter(|d| d.parent().is_some())
    .map(|d| d.display().to_string())
    .collect()
}

/// The CLI's environment in the pod ([`pod_env`]): in the jail, with the agent's commands
/// behind the prefix script and the CLI's own tools behind their wrappers.
fn session_env(
    gateway_env: &[(String, String)],
    engine_dirs: &[String],
    image: &ImageFacts,
    sandbox: Option<&SandboxConfig>,
) -> Vec<(String, String)> {
    let mut env = pod_env(gateway_env, engine_dirs, image);
    if let Some(sandbox) = sandbox {
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
        // The CLI's own ripgrep and git take the same share.
        use_tool_wrappers(&mut env);
    }
    env
}

/// The session's sockets in the pod (the egress's, tunnelled to the engine) and, when the
/// session is sandboxed, the agent's commands' prefix and the tools' wrappers beside them.
pub(super) async fn sockets_and_files(
    step: &Steps<'_>,
    egress: &Egress,
    sandboxed: bool,
) -> Result<()> {
    for (name, engine_side) in egress.sockets() {
        step.shell
            .listen(&format!("{SOCKETS}/{name}"), engine_side)
            .await?;
    }
    if !sandboxed {
        return Ok(());
    }
    let script = format!("{SOCKETS}/{PREFIX_SCRIPT}");
    step.write_file(&script, commands_prefix_script().as_bytes(), "0755")
        .await?;
    step.run(
        "making the tools' wrappers' directory",
        vec!["mkdir".into(), "-p".into(), format!("{SOCKETS}/bin")],
        &[],
        STEP_TIMEOUT,
        "/",
    )
    .await?;
    for name in WRAPPED_TOOLS {
        step.write_file(
            &format!("{SOCKETS}/bin/{name}"),
            tool_wrapper_script().as_bytes(),
            "0755",
        )
        .await?;
    }
    Ok(())
}

/// The session's git config with an identity: where the repository's configuration names no
/// one, a fixed one (in a pod git cannot make one up from the host name as it does locally,
/// and an agent's `git commit` must work).
pub(super) fn with_identity(config: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Limits;

    #[test]
    fn the_engines_directories_are_the_homes_the_repository_and_the_cwd_but_never_root() {
        let dirs = engine_dirs(
            &[("HOME".into(), "/home/session".into())],
            Path::new("/srv/repo"),
            Some("/home/engine".into()),
            Some(PathBuf::from("/srv/engine")),
        );
        assert_eq!(
            dirs,
            ["/home/session", "/home/engine", "/srv/repo", "/srv/engine"]
        );
        // root's HOME `/` would name every path; what is not known names nothing.
        let dirs = engine_dirs(&[], Path::new("/srv/repo"), Some("/".into()), None);
        assert_eq!(dirs, ["/srv/repo"]);
    }

    #[test]
    fn a_jailed_sessions_commands_get_the_prefix_their_share_of_tasks_and_the_tools_wrappers() {
        let image = ImageFacts {
            path: "/usr/bin:/bin".into(),
            shell: "/bin/sh".into(),
            git: "/usr/bin/git".into(),
        };
        let egress = [(
            "CLAUDE_CODE_SHELL_PREFIX".into(),
            "/engine/prefix.sh".into(),
        )];
        assert_eq!(
            session_env(&egress, &[], &image, None),
            pod_env(&egress, &[], &image),
            "without the jail, the pod's environment as it is"
        );
        let limits = |tasks| SandboxConfig {
            limits: Limits {
                tasks,
                ..Default::default()
            },
            ..Default::default()
        };
        let jailed = session_env(&egress, &[], &image, Some(&limits(Some(1024))));
        let value = |k| env_value(&jailed, k);
        assert_eq!(
            value("CLAUDE_CODE_SHELL_PREFIX"),
            Some("/run/claude-runtime-adapter/commands.sh")
        );
        assert_eq!(value("CRA_SHELL_PREFIX"), Some("/engine/prefix.sh"));
        // commands_share: a quarter of the tasks (at least 64) is the CLI's headroom.
        assert_eq!(value("CRA_TOOLS_NPROC"), Some("768"));
        assert!(value("PATH").is_some_and(|p| p.starts_with("/run/claude-runtime-adapter/bin:")));
        assert_eq!(value("USE_BUILTIN_RIPGREP"), Some("0"));
        let unlimited = session_env(&egress, &[], &image, Some(&limits(None)));
        assert_eq!(env_value(&unlimited, "CRA_TOOLS_NPROC"), None);
    }

    #[test]
    fn the_git_config_gets_a_fixed_identity_only_for_what_it_does_not_name() {
        let email = "\temail = \"agent@claude-runtime-adapter.invalid\"\n";
        assert_eq!(
            with_identity(""),
            format!("[user]\n\tname = \"Claude agent\"\n{email}")
        );
        let named = "[user]\n\tname = Ann\n";
        assert_eq!(with_identity(named), format!("{named}[user]\n{email}"));
        let both = "[user]\n\tname = Ann\n\temail = ann@example.com\n";
        assert_eq!(with_identity(both), both);
    }
}
