//! What the session's image has, as far as the adapter cares ([`inspect_image`], asked before
//! anything else runs in the pod), and the environment a process in the pod gets from it
//! ([`pod_env`]): nothing of the engine's machine, the image's own tools first.

use super::layout::{DEFAULT_PATH, HOME, RUNTIME_BIN, RUNTIME_HISTORY};
use super::steps::{provision_error, MAX_STEP_OUTPUT, STEP_TIMEOUT};
use crate::environment::remote::{RemoteCommand, RemoteShell};
use crate::error::Result;

/// What the adapter itself runs in the pod besides its runtime: git, and the few POSIX tools
/// of its steps and of `cra-jail` (with `/bin/sh`). An image lacking one is refused before
/// anything else happens in it.
const IMAGE_NEEDS: &[&str] = &[
    "git", "cat", "cp", "chmod", "date", "stat", "touch", "rm", "mkdir", "realpath", "readlink",
    "grep", "sleep",
];

/// What the session's image has, as far as the adapter cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ImageFacts {
    /// The image's own PATH (its `Env`, as pid 1 got it), or [`DEFAULT_PATH`].
    pub path: String,
    /// bash where the image has it (the CLI's shell of choice), else `/bin/sh`.
    pub shell: String,
    /// The image's git (what the runtime's `git` runs).
    pub git: String,
}

/// Asks the pod what its image has, before anything else runs in it: `/bin/sh`, then git and
/// the tools of [`IMAGE_NEEDS`] on the image's PATH. An image lacking one is `ERR_PROVISION`
/// naming what is missing.
pub(super) async fn inspect_image(shell: &RemoteShell, image: &str) -> Result<ImageFacts> {
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
    // pid 1 (cra-pod idle) runs with the image's own environment. The container counts as
    // running once its runtime's init (root, not dumpable) is told to start, a moment before it
    // has exec'd cra-pod, and until then its environ is refused (CI saw `Permission denied`
    // once, 16 pods starting at once). So the read is retried for up to ~5 s, then its error
    // is the answer (an image without `cat` fails every try).
    let environ = run(
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "i=0; until cat /proc/1/environ 2>/dev/null; do \
             i=$((i + 1)); [ \"$i\" -lt 50 ] || exec cat /proc/1/environ; sleep 0.1 2>/dev/null; \
             done"
                .into(),
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
pub(super) fn pod_env(
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
