//! The OS sandbox one agent session runs in, built by the adapter: on Linux the Claude Code
//! CLI and everything it starts run inside one bubblewrap sandbox per session ([`jail`] has the
//! mount plan), so the boundary is the same whichever tool the agent uses (Bash, Read, Write,
//! WebFetch). Inside there is no network: loopback ports are bridged (socat) to unix
//! sockets of the adapter outside — the egress proxy ([`proxy`]: `sandbox.allowedDomains` and
//! the model API host, every attempt reported) and the model relay ([`crate::gateway`], a
//! layer below: the CLI holds a placeholder, the relay adds the real API key or token, which is
//! never readable inside); and
//! when the CLI's telemetry is on, a third: the telemetry forwarder ([`telemetry`]: OTLP
//! exports to the engine's collector only, its headers added outside).
//! The adapter's own git, when it reads an agent's clone, runs in a jail of the clone alone
//! ([`GitJails`]: the answer to what git, a layer below, asks of the sandbox in
//! `crate::git::confine`).
//!
//! Lifecycle use: [`check_available`] before anything is provisioned (fails closed);
//! [`SessionSandbox::start`] when the CLI is started (dropping it stops proxy and relay, and
//! ends and removes the session's cgroup, see [`limits`]).
//! [`WriteScope`] and [`ReadGuard`] answer the CLI's file-tool hooks natively — a clearer reason
//! for the model than the kernel's, and the boundary that remains with `sandbox: false`.
//! macOS keeps Claude Code's own Seatbelt sandbox (`seatbelt.rs`).

mod allowlist;
mod available;
pub mod commands;
mod credentials;
mod git_jail;
mod home;
pub mod jail;
#[cfg(target_os = "linux")]
pub mod limits;
#[cfg(target_os = "linux")]
pub mod overlay;
mod proxy;
mod read_guard;
mod toolchains;
// Compiled in Linux tests too: the settings text is plain data, tested where CI runs.
#[cfg(any(target_os = "macos", test))]
mod seatbelt;
pub mod telemetry;
mod write_scope;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::config::SandboxConfig;
use crate::error::{AdapterError, ErrorCode, Result};
use crate::gateway::provider::{anthropic_upstream, provider_relay, Provider};
use crate::gateway::{placeholder, ApiHooks, ModelRelay};
#[cfg(target_os = "linux")]
use crate::git::layer::LayerMounts;
use crate::process::env_value;
use crate::scratch::ScratchDir;

pub use allowlist::DomainAllowlist;
pub use available::{check_available, find_on_path, INSTALL_HINT};
pub use credentials::{credential_stores, is_credential_var, HOME_CREDENTIALS};
pub use git_jail::GitJails;
pub use jail::{Jail, JailPlan};
pub use proxy::{EgressAttempt, EgressProxy, EgressSink};
pub use read_guard::ReadGuard;
#[cfg(target_os = "macos")]
pub use seatbelt::seatbelt_settings;
pub use telemetry::{TelemetryForwarder, TelemetryPlan};
pub use write_scope::WriteScope;

/// The model API's credential variables: replaced by placeholders inside, added back by the
/// relay outside.
pub const MODEL_CREDENTIALS: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
];
/// Loopback ports inside the sandbox (its network namespace is its own, so they never clash).
const EGRESS_PORT: u16 = 3128;
const MODEL_PORT: u16 = 3129;
const TELEMETRY_PORT: u16 = 3130;

/// Inside the sandbox, before the CLI: the socat bridges (to the sockets in `$CRA_SOCKET_DIR`,
/// where a pod without its jail has them, else the sandbox's mount point) — the proxy's and
/// the relay's, and the telemetry forwarder's where its socket is there (the session's
/// telemetry is on) — named to the engine where it places the CLI's tools in a cgroup (the
/// first line of the request pipe, written before the CLI, so before anything of the agent's,
/// runs: the bridges stay in the CLI's part with it; the CLI's path is `CRA_CLI` for the
/// ripgrep wrapper, see [`commands::TOOL_WRAPPER_SCRIPT`]), then wait (bounded) until all
/// listen — the CLI's first API request must not race them — then exec the CLI (`"$@"`).
const BRIDGE_SCRIPT: &str = r#"d=${CRA_SOCKET_DIR:-/run/claude-runtime-adapter}
socat TCP-LISTEN:3128,bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:$d/egress.sock </dev/null >/dev/null 2>&1 &
b=$!
socat TCP-LISTEN:3129,bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:$d/model.sock </dev/null >/dev/null 2>&1 &
b="$b $!"
want=2
if [ -S $d/telemetry.sock ]; then
  socat TCP-LISTEN:3130,bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:$d/telemetry.sock </dev/null >/dev/null 2>&1 &
  b="$b $!"
  want=3
fi
if [ -p "$d/tools.request" ]; then echo "bridges $b" > "$d/tools.request"; fi
export CRA_CLI="$1"
n=0
while [ "$(grep -c -e ' 0100007F:0C38 00000000:0000 0A' -e ' 0100007F:0C39 00000000:0000 0A' -e ' 0100007F:0C3A 00000000:0000 0A' /proc/net/tcp)" -lt $want ]; do
  n=$((n+1))
  if [ $n -gt 3000 ]; then echo 'claude-runtime-adapter: the sandbox network bridges did not start' >&2; exit 125; fi
  sleep 0.002
done
exec "$@""#;

/// What one session may see and change.
#[derive(Debug, Clone, Default)]
pub struct SessionScope {
    /// Where the CLI starts.
    pub cwd: PathBuf,
    /// Read-write: the Implementor's clone.
    pub writable: Vec<PathBuf>,
    /// Read-only: the repository (Planner, Reviewer) or its object stores (Implementor), the
    /// CLI's own directory.
    pub readable: Vec<PathBuf>,
    /// The Implementor's copy-on-write checkout, mounted at its path (the `cwd`).
    #[cfg(target_os = "linux")]
    pub layer: Option<LayerMounts>,
    /// The session's directory for the CLI's config (its conversations), kept across CLI runs;
    /// `None`: a private one per run.
    pub cli_config: Option<PathBuf>,
}

/// One session's sandbox: its mount plan, and the egress (CLI environment, egress proxy,
/// model relay) it reaches the outside through.
pub struct SessionSandbox {
    jail: Jail,
    egress: Egress,
    #[cfg(target_os = "linux")]
    limits: limits::SessionLimits,
}

/// What any confined session reaches the outside through, wherever it runs (a local bubblewrap
/// sandbox, a pod): the CLI's environment inside (credentials as placeholders, the model API at
/// the relay, everything else through the proxy), the egress proxy, the model relay and (the
/// CLI's telemetry on) the telemetry forwarder on unix sockets of the engine (stopped, and their sockets removed, when this is dropped), and the
/// session's generated `~/.gitconfig`.
pub struct Egress {
    env: Vec<(String, String)>,
    _proxy: EgressProxy,
    _relay: ModelRelay,
    /// The CLI's telemetry forwarder and the collectors it sends to, when its telemetry is on.
    telemetry: Option<(TelemetryForwarder, Vec<String>)>,
    sockets: ScratchDir,
    git_config: String,
}

impl Egress {
    /// Starts the proxy (allowing the sandbox's `allowed_domains` and the model API's host) and
    /// the relay (forwarding the features that reach out which its `server_tools` allow; any,
    /// without a sandbox). `cli_env` is the CLI's environment as the adapter built it
    /// (credentials included); the git identity is the user's global one, or as it applies in
    /// `identity_repo` when given.
    pub async fn start(
        sandbox: Option<&SandboxConfig>,
        cli_env: &[(String, String)],
        sink: Option<EgressSink>,
        identity_repo: Option<&Path>,
        api: ApiHooks,
    ) -> Result<Egress> {
        // Checked first: a telemetry setting the forwarder cannot use fails before anything runs.
        let telemetry_plan = TelemetryPlan::of(cli_env)?;
        let provider = Provider::of(cli_env);
        let (mut env, substitutions) = match provider {
            Provider::Anthropic => inside_env(&with_login_token(cli_env)),
            _ => inside_env(cli_env),
        };
        // The provider's credentials are found and checked before anything is started.
        let relay_url = format!("http://127.0.0.1:{MODEL_PORT}");
        let plan = provider_relay(cli_env, &relay_url, substitutions).await?;
        env.extend(plan.inside);
        let sockets = socket_dir()?;
        // The Anthropic API's host is reachable on its port (the CLI's own API traffic takes
        // the relay; this is for its other requests there). A provider's is not: the CLI
        // reaches it only through the relay.
        let mut allow = DomainAllowlist::new(sandbox.map_or(&[], |s| s.allowed_domains.as_slice()));
        if provider == Provider::Anthropic {
            if let Some((host, port)) = url_endpoint(&anthropic_upstream(cli_env)) {
                allow = allow.with_endpoint(&host, port);
            }
        }
        let proxy = EgressProxy::start(allow, sink, &sockets.path().join(EGRESS_SOCKET)).await?;
        let mut plan = plan.plan;
        plan.server_tools = sandbox.map(|s| s.server_tools.clone());
        plan.outage = api.outage;
        plan.pacing = api.pacing;
        plan.spend = api.spend;
        plan.trace = api.trace;
        plan.audit = api.audit;
        let relay = ModelRelay::start_plan(&sockets.path().join(MODEL_SOCKET), plan).await?;
        let telemetry = match telemetry_plan {
            Some(plan) => {
                let collectors = plan.collectors();
                let forwarder =
                    TelemetryForwarder::start(&sockets.path().join(TELEMETRY_SOCKET), plan)?;
                telemetry::forwarded_env(&mut env, &format!("http://127.0.0.1:{TELEMETRY_PORT}"));
                tracing::info!(
                    "the CLI's telemetry is forwarded to {} (and only there)",
                    collectors.join(", ")
                );
                Some((forwarder, collectors))
            }
            None => None,
        };
        Ok(Egress {
            env,
            _proxy: proxy,
            _relay: relay,
            telemetry,
            sockets,
            git_config: home::git_config(cli_env, identity_repo).await,
        })
    }

    /// The CLI's environment inside (no secret in it).
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// The engine-side sockets: `(file name inside, path here)` for the egress proxy, the
    /// model relay and, when the CLI's telemetry is on, the telemetry forwarder. Inside they are
    /// `/run/claude-runtime-adapter/<file name>`, where the bridge script ([`BRIDGE_SCRIPT`])
    /// expects them.
    pub fn sockets(&self) -> Vec<(&'static str, PathBuf)> {
        let mut names = vec![EGRESS_SOCKET, MODEL_SOCKET];
        if self.telemetry.is_some() {
            names.push(TELEMETRY_SOCKET);
        }
        names
            .into_iter()
            .map(|n| (n, self.sockets.path().join(n)))
            .collect()
    }

    /// The collectors the CLI's telemetry is forwarded to (empty: it is off).
    pub fn telemetry_collectors(&self) -> &[String] {
        self.telemetry.as_ref().map_or(&[], |(_, c)| c.as_slice())
    }

    /// The session's `~/.gitconfig`: the user's identity and line-ending settings only.
    pub fn git_config(&self) -> &str {
        &self.git_config
    }
}

/// The Bash prefix of the session (`CLAUDE_CODE_SHELL_PREFIX`, [`commands::TOOLS_PREFIX_SCRIPT`]),
/// written into the socket directory beside what it needs there (with a cgroup, the request
/// pipe of the placer, see [`limits`]): every command of the agent runs under the commands'
/// share of the limits.
#[cfg(target_os = "linux")]
fn commands_prefix(
    limits: &mut limits::SessionLimits,
    dir: &Path,
    env: &mut Vec<(String, String)>,
) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join(PREFIX_SCRIPT);
    let mut write = || -> std::io::Result<Vec<(String, String)>> {
        std::fs::write(&script, commands_prefix_script())?;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
        let bin = dir.join("bin");
        std::fs::create_dir(&bin)?;
        for name in commands::WRAPPED_TOOLS {
            let wrapper = bin.join(name);
            std::fs::write(&wrapper, tool_wrapper_script())?;
            std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
        }
        limits.commands_setup(dir)
    };
    let vars = write().map_err(|e| {
        AdapterError::new(
            ErrorCode::SandboxUnavailable,
            format!(
                "cannot write the sandbox's command prefix into {}",
                dir.display()
            ),
        )
        .with_cause(e)
    })?;
    use_commands_prefix(env, &format!("{}/{PREFIX_SCRIPT}", jail::SOCKET_DIR), vars);
    use_tool_wrappers(env);
    Ok(())
}

/// The wrapper of the CLI's own tools ([`commands::TOOL_WRAPPER_SCRIPT`]), as a file.
pub fn tool_wrapper_script() -> String {
    format!("#!/bin/sh\n{}", commands::TOOL_WRAPPER_SCRIPT)
}

/// The wrappers (`bin/` beside the prefix script, inside) first on the CLI's `PATH`, and its
/// ripgrep looked up there: what the CLI runs itself is under the commands' limits from its
/// first instruction, a cgroup's or an rlimit's.
pub fn use_tool_wrappers(env: &mut Vec<(String, String)>) {
    let bin = format!("{}/bin", jail::SOCKET_DIR);
    match env.iter_mut().find(|(k, _)| k == "PATH") {
        Some((_, path)) => *path = format!("{bin}:{path}"),
        None => env.push(("PATH".to_string(), bin)),
    }
    env.retain(|(k, _)| k != "USE_BUILTIN_RIPGREP");
    env.push(("USE_BUILTIN_RIPGREP".to_string(), "0".to_string()));
}

/// The prefix script's file name beside the sockets, and its content.
pub const PREFIX_SCRIPT: &str = "commands.sh";
pub fn commands_prefix_script() -> String {
    format!("#!/bin/sh\n{}", commands::TOOLS_PREFIX_SCRIPT)
}

/// Points the CLI's Bash at the prefix script `at` (inside), with the prefix's variables
/// `vars`. A prefix the engine configured for the CLI runs after it (`CRA_SHELL_PREFIX`).
pub fn use_commands_prefix(
    env: &mut Vec<(String, String)>,
    at: &str,
    vars: impl IntoIterator<Item = (String, String)>,
) {
    const SHELL_PREFIX_VAR: &str = "CLAUDE_CODE_SHELL_PREFIX";
    let engine_prefix = env
        .iter()
        .position(|(k, _)| k == SHELL_PREFIX_VAR)
        .map(|i| env.remove(i).1)
        .filter(|p| !p.is_empty());
    env.extend(engine_prefix.map(|p| ("CRA_SHELL_PREFIX".to_string(), p)));
    env.extend(vars);
    env.push((SHELL_PREFIX_VAR.to_string(), at.to_string()));
}

/// The socket file names of [`Egress::sockets`].
const EGRESS_SOCKET: &str = "egress.sock";
const MODEL_SOCKET: &str = "model.sock";
/// The bridge script starts the telemetry bridge only where this socket is.
const TELEMETRY_SOCKET: &str = "telemetry.sock";

/// `sh -c BRIDGE_SCRIPT sh program args…`: the argv that starts the bridges, then the CLI.
pub fn bridged_argv(program: &std::ffi::OsStr, args: &[String]) -> Vec<OsString> {
    let mut argv: Vec<OsString> = vec![
        "-c".into(),
        BRIDGE_SCRIPT.into(),
        "sh".into(),
        program.to_os_string(),
    ];
    argv.extend(args.iter().map(OsString::from));
    argv
}

/// What [`SessionSandbox::start`] reads once per process for the CLI's environment `cli_env`:
/// the `PATH` of the user's login shell (cached: [`home::profile_path`]).
pub async fn warm_up(cli_env: &[(String, String)]) {
    home::profile_path(cli_env).await;
}

impl SessionSandbox {
    /// Starts the session's proxy and relay and builds its sandbox. `cli_env` is the CLI's
    /// environment as the adapter built it (credentials included).
    pub async fn start(
        cfg: &SandboxConfig,
        scope: &SessionScope,
        cli_env: &[(String, String)],
        sink: Option<EgressSink>,
        api: ApiHooks,
    ) -> Result<SessionSandbox> {
        let (mut egress, profile_path) =
            tokio::try_join!(Egress::start(Some(cfg), cli_env, sink, None, api), async {
                Ok(home::profile_path(cli_env).await)
            })?;
        let cli_path = env_value(cli_env, "PATH");
        let path = home::merged_path(cli_path, profile_path.as_deref());
        egress.env.retain(|(k, _)| k != "PATH");
        egress
            .env
            .extend(path.clone().map(|p| ("PATH".to_string(), p)));
        let sockets = &egress.sockets;
        let git_config_file = sockets.path().join("gitconfig");
        std::fs::write(&git_config_file, &egress.git_config).map_err(|e| {
            AdapterError::new(
                ErrorCode::SandboxUnavailable,
                format!(
                    "cannot write the session's git config {}",
                    git_config_file.display()
                ),
            )
            .with_cause(e)
        })?;
        // A HOME of `/` (or relative) would put the private tmpfs over everything.
        let home = env_value(cli_env, "HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_absolute() && h.parent().is_some());
        let config_dir = env_value(cli_env, "CLAUDE_CONFIG_DIR").map(PathBuf::from);
        // The CLI's config dir (its conversation, which `--resume` reads) is the session's
        // directory outside when the environment keeps one, else private and gone with the CLI.
        // Shown where the CLI would look for it anyway, and named in its environment.
        let kept: Vec<(PathBuf, PathBuf)> = match &scope.cli_config {
            Some(host) => {
                // Not HOME itself: that is the session's private tmpfs, and stays so.
                let inside = config_dir
                    .clone()
                    .filter(|d| d.is_absolute() && d.parent().is_some() && Some(d) != home.as_ref())
                    .or_else(|| home.as_ref().map(|h| h.join(".claude")))
                    .unwrap_or_else(|| PathBuf::from("/tmp/claude-config"));
                egress.env.retain(|(k, _)| k != "CLAUDE_CONFIG_DIR");
                egress.env.push((
                    "CLAUDE_CONFIG_DIR".to_string(),
                    inside.display().to_string(),
                ));
                vec![(host.clone(), inside)]
            }
            None => Vec::new(),
        };
        let config_dir = config_dir.filter(|_| kept.is_empty());
        let mut writable = scope.writable.clone();
        // A missing path cannot be mounted; it has nothing to write into yet either.
        writable.extend(cfg.allow_write.iter().filter(|p| p.exists()).cloned());
        let mut readable = scope.readable.clone();
        readable.extend(cfg.allow_read.iter().cloned());
        let home_files = home
            .iter()
            .map(|h| (git_config_file.clone(), h.join(".gitconfig")))
            .collect();
        #[cfg(target_os = "linux")]
        let mut limits = limits::SessionLimits::create(cfg.limits);
        #[cfg(target_os = "linux")]
        commands_prefix(&mut limits, egress.sockets.path(), &mut egress.env)?;
        #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
        let mut plan = JailPlan {
            cwd: scope.cwd.clone(),
            writable,
            readable,
            home,
            home_files,
            scratch: config_dir.into_iter().collect(),
            kept,
            sockets: Some(egress.sockets.path().to_path_buf()),
            path_env: path.map(OsString::from),
            tmpfs_size: cfg.limits.tmpfs,
            secret_files: credentials::provider_credential_files(cli_env),
            #[cfg(target_os = "linux")]
            overlay: None,
        };
        #[cfg(target_os = "linux")]
        if let Some(layer) = &scope.layer {
            plan.mount_layer(layer);
        }
        let jail = Jail::new(&plan);
        Ok(SessionSandbox {
            jail,
            egress,
            #[cfg(target_os = "linux")]
            limits,
        })
    }

    /// What the session's first process runs before it executes bubblewrap: joins the
    /// session's cgroup (or sets the rlimits), then mounts the checkout's overlay, if any, in a
    /// namespace of its own (after joining: the cgroup is the host's to write).
    #[cfg(target_os = "linux")]
    pub fn pre_exec(&self) -> Result<impl FnMut() -> std::io::Result<()> + Send + Sync + 'static> {
        let mut limits = self.limits.pre_exec();
        let mut overlay = self.jail.pre_exec().map_err(|e| {
            AdapterError::new(
                ErrorCode::SandboxUnavailable,
                format!("cannot mount the session's checkout: {e}"),
            )
        })?;
        Ok(move || {
            limits()?;
            match overlay.as_mut() {
                Some(mount) => mount(),
                None => Ok(()),
            }
        })
    }

    /// True when the limits are only rlimits (no usable cgroup).
    #[cfg(target_os = "linux")]
    pub fn limits_are_fallback(&self) -> bool {
        self.limits.is_fallback()
    }

    /// What of the configured limits the kernel does not enforce at all, if anything.
    pub fn limits_unenforced(&self) -> Option<String> {
        #[cfg(target_os = "linux")]
        return self.limits.unenforced();
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// The kernel limit the session ran into, if any.
    pub fn limit_hit(&self) -> Option<String> {
        #[cfg(target_os = "linux")]
        return self.limits.hit();
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// The commands' limits the agent's commands ran into (the session went on), if any.
    pub fn commands_hit(&self) -> Option<String> {
        #[cfg(target_os = "linux")]
        return self.limits.commands_hit();
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// bwrap's argv and environment for running `program args` as the session's CLI.
    pub fn command(&self, program: &Path, args: &[String]) -> (Vec<OsString>, &[(String, String)]) {
        let inner = bridged_argv(program.as_os_str(), args);
        (self.jail.argv("sh".as_ref(), &inner), &self.egress.env)
    }

    /// A one-line summary for the transcript.
    pub fn describe(&self) -> String {
        #[cfg(target_os = "linux")]
        let limits = self.limits.describe();
        #[cfg(not(target_os = "linux"))]
        let limits = "no kernel limits";
        let collectors = self.egress.telemetry_collectors();
        let telemetry = match collectors.is_empty() {
            true => String::new(),
            false => format!(
                "; the CLI's telemetry forwarded to {} only",
                collectors.join(", ")
            ),
        };
        format!(
            "bubblewrap; sockets {}; network only through the egress proxy{telemetry}; {limits}",
            self.egress.sockets.path().display()
        )
    }
}

/// The CLI's environment inside: no credential variable of the adapter's environment, the
/// model credentials as placeholders (returned with their real values for the relay), the
/// model API at the relay, every other connection through the egress proxy, `/tmp` private.
fn inside_env(cli_env: &[(String, String)]) -> (Vec<(String, String)>, Substitutions) {
    let mut env = Vec::new();
    let mut substitutions = Vec::new();
    for (k, v) in cli_env {
        if MODEL_CREDENTIALS.contains(&k.as_str()) {
            let p = placeholder();
            substitutions.push((p.clone(), v.clone()));
            env.push((k.clone(), p));
        } else if !is_credential_var(k) && !OVERRIDDEN.contains(&k.to_ascii_uppercase().as_str()) {
            env.push((k.clone(), v.clone()));
        }
    }
    let proxy = format!("http://127.0.0.1:{EGRESS_PORT}");
    let socks = format!("socks5h://127.0.0.1:{EGRESS_PORT}");
    for (k, v) in [
        (
            "ANTHROPIC_BASE_URL",
            format!("http://127.0.0.1:{MODEL_PORT}"),
        ),
        ("HTTP_PROXY", proxy.clone()),
        ("HTTPS_PROXY", proxy.clone()),
        ("http_proxy", proxy.clone()),
        ("https_proxy", proxy),
        ("ALL_PROXY", socks.clone()),
        ("all_proxy", socks),
        ("NO_PROXY", "localhost,127.0.0.1,::1".into()),
        ("no_proxy", "localhost,127.0.0.1,::1".into()),
        ("TMPDIR", "/tmp".into()),
        // The system git config is the host's (`/etc` is visible read-only): git inside
        // reads only the generated global one and the repository's own.
        ("GIT_CONFIG_NOSYSTEM", "1".into()),
    ] {
        env.push((k.to_string(), v));
    }
    (env, substitutions)
}

/// The CLI's environment, plus the OAuth token of a `claude login` as `CLAUDE_CODE_OAUTH_TOKEN`
/// when no model credential variable is set: the login's file (`.credentials.json` in the CLI's
/// config dir, else `~/.claude`) is not visible inside, so its token goes through the relay like
/// any other credential. The token is read when the session starts (a login's refresh happens
/// in the user's own CLI, not here).
fn with_login_token(cli_env: &[(String, String)]) -> Vec<(String, String)> {
    let mut env = cli_env.to_vec();
    if MODEL_CREDENTIALS
        .iter()
        .any(|k| env_value(cli_env, k).is_some_and(|v| !v.is_empty()))
    {
        return env;
    }
    let dir = env_value(cli_env, "CLAUDE_CONFIG_DIR")
        .map(PathBuf::from)
        .or_else(|| env_value(cli_env, "HOME").map(|h| Path::new(h).join(".claude")));
    let token = dir
        .and_then(|d| std::fs::read(d.join(".credentials.json")).ok())
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| {
            v.pointer("/claudeAiOauth/accessToken")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        })
        .filter(|t| !t.is_empty());
    if let Some(t) = token {
        env.push(("CLAUDE_CODE_OAUTH_TOKEN".into(), t));
    }
    env
}

/// (placeholder, real secret) pairs for the model relay.
type Substitutions = Vec<(String, String)>;

/// Variables [`inside_env`] sets itself (compared upper-case).
const OVERRIDDEN: &[&str] = &[
    "ANTHROPIC_BASE_URL",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "TMPDIR",
    "TMP",
    "TEMP",
    "GIT_CONFIG_NOSYSTEM",
];

/// `host` and port of `scheme://host[:port]/…` (the scheme's default port when none is given).
fn url_endpoint(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match hostport.strip_prefix('[') {
        Some(v6) => {
            let (h, rest) = v6.split_once(']')?;
            (h, rest.strip_prefix(':'))
        }
        None => match hostport.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        },
    };
    let default = if scheme.eq_ignore_ascii_case("https") {
        443
    } else {
        80
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => default,
    };
    (!host.is_empty()).then(|| (host.to_string(), port))
}

/// A private directory for one session's sockets, removed with them.
fn socket_dir() -> Result<ScratchDir> {
    ScratchDir::create("sockets").map_err(|e| {
        AdapterError::new(
            ErrorCode::SandboxUnavailable,
            format!(
                "cannot create the sandbox's socket directory in {}",
                std::env::temp_dir().display()
            ),
        )
        .with_cause(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_the_model_key_is_a_placeholder_and_other_secrets_are_gone() {
        let cli_env: Vec<(String, String)> = [
            ("PATH", "/usr/bin"),
            ("ANTHROPIC_API_KEY", "sk-real"),
            ("GITHUB_TOKEN", "ghp-real"),
            ("ANTHROPIC_BASE_URL", "https://api.example"),
            ("TMPDIR", "/var/tmp/x"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (env, subs) = inside_env(&cli_env);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let key = get("ANTHROPIC_API_KEY").unwrap();
        assert_ne!(key, "sk-real");
        assert_eq!(subs, vec![(key, "sk-real".to_string())]);
        assert_eq!(get("GITHUB_TOKEN"), None);
        assert_eq!(get("ANTHROPIC_BASE_URL").unwrap(), "http://127.0.0.1:3129");
        assert_eq!(get("TMPDIR").unwrap(), "/tmp");
        assert_eq!(get("PATH").unwrap(), "/usr/bin");
        assert!(!env.iter().any(|(_, v)| v.contains("real")));
    }

    #[test]
    fn a_claude_login_token_goes_through_the_relay_when_no_credential_variable_is_set() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(".credentials.json"),
            r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat-login","refreshToken":"r"}}"#,
        )
        .unwrap();
        let base = vec![(
            "CLAUDE_CONFIG_DIR".to_string(),
            dir.path().display().to_string(),
        )];
        let (env, subs) = inside_env(&with_login_token(&base));
        let token = env
            .iter()
            .find(|(k, _)| k == "CLAUDE_CODE_OAUTH_TOKEN")
            .unwrap();
        assert!(token.1.starts_with("sk-ant-sandbox-placeholder-"));
        assert_eq!(
            subs,
            vec![(token.1.clone(), "sk-ant-oat-login".to_string())]
        );
        // A key in the environment wins; the login is not read.
        let mut with_key = base.clone();
        with_key.push(("ANTHROPIC_API_KEY".into(), "sk-key".into()));
        let (env, subs) = inside_env(&with_login_token(&with_key));
        assert!(!env.iter().any(|(k, _)| k == "CLAUDE_CODE_OAUTH_TOKEN"));
        assert_eq!(subs.len(), 1);
        assert_eq!(subs[0].1, "sk-key");
    }

    #[test]
    fn url_endpoints() {
        let e = |u: &str| url_endpoint(u).map(|(h, p)| format!("{h} {p}"));
        assert_eq!(
            e("https://api.anthropic.com").unwrap(),
            "api.anthropic.com 443"
        );
        assert_eq!(e("http://127.0.0.1:8080/x").unwrap(), "127.0.0.1 8080");
        assert_eq!(e("http://u:p@h.example:1/").unwrap(), "h.example 1");
        assert_eq!(e("http://[::1]:81/").unwrap(), "::1 81");
        assert_eq!(e("http://gw.example/anthropic").unwrap(), "gw.example 80");
        assert_eq!(e("nonsense"), None);
        assert_eq!(e("http://h:notaport/"), None);
    }
}
