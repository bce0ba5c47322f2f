//! The agent's commands' part of a session's limits (see [`super::limits`] for how a local
//! session enforces it, and the Kubernetes backend for a pod): how much they get, and the Bash
//! prefix that puts each command under it. Plain data on every platform.

use crate::config::Limits;

const MIB: u64 = 1024 * 1024;

/// The child cgroups of a session's: the CLI's and the agent's commands'.
#[cfg(target_os = "linux")]
pub(crate) const CLI: &str = "cli";
#[cfg(target_os = "linux")]
pub(crate) const TOOLS: &str = "tools";
/// The request pipe beside the prefix script (a FIFO, read by the engine: `limits`' placer):
/// a line written to it asks the engine to move the CLI's tools into the commands' cgroup now.
/// What a line says is not trusted: the engine moves what the CLI started, whoever asks (the
/// first line, written by the bridge script before the CLI exists, names the bridges).
pub const REQUEST_FIFO: &str = "tools.request";
/// Moves the running script into the commands' cgroup where the engine placed the session in a
/// cgroup (the request pipe is in `$d`): asks, then waits (a few seconds at most) until its own
/// `/proc/self/cgroup` shows it out of the CLI's part; exits 126 (fail-closed) otherwise. The
/// check is builtins only; its `sleep`s are the engine's to move like the rest.
macro_rules! join_tools {
    () => {
        r#"in_cli() {
  while IFS= read -r l; do
    case $l in */claude-runtime-adapter-*/cli) return 0 ;; esac
  done < /proc/self/cgroup
  return 1
}
if [ -p "$d/tools.request" ]; then
  n=0
  while in_cli; do
    if [ $((n % 200)) -eq 0 ]; then
      echo tools > "$d/tools.request" || { echo "claude-runtime-adapter: cannot ask for the command's limits" >&2; exit 126; }
    fi
    n=$((n+1))
    if [ $n -gt 1000 ]; then echo "claude-runtime-adapter: cannot put the command under its limits" >&2; exit 126; fi
    sleep 0.005
  done
fi
"#
    };
}

/// Takes the commands' share as `RLIMIT_NPROC` where that is how it is enforced
/// (`CRA_TOOLS_NPROC`: no usable cgroup, a pod), fail-closed, and keeps the variable from what
/// runs next. One text for the Bash prefix and the wrappers of the CLI's own tools.
macro_rules! take_nproc {
    () => {
        r#"if [ -n "$CRA_TOOLS_NPROC" ]; then
  ulimit -u "$CRA_TOOLS_NPROC" 2>/dev/null || ulimit -p "$CRA_TOOLS_NPROC" || { echo "claude-runtime-adapter: cannot limit the processes of $0" >&2; exit 126; }
fi
unset CRA_TOOLS_NPROC
"#
    };
}

/// The Bash prefix inside the sandbox (`CLAUDE_CODE_SHELL_PREFIX`; the CLI runs it as
/// `<prefix> '<command string>'`): joins the commands' cgroup (`join_tools`: nothing of the
/// cgroup filesystem is writable inside, the engine moves what the CLI started); sets the
/// commands' `RLIMIT_NPROC` when `CRA_TOOLS_NPROC` says so; then runs the command string with
/// the CLI's shell (or the engine's own prefix, `CRA_SHELL_PREFIX`). Fail-closed: a command
/// that cannot be put under its limits does not run. No process is made after the limits apply
/// (a command string of builtins still runs while the commands' share is used up).
pub const TOOLS_PREFIX_SCRIPT: &str = concat!(
    "d=${0%/*}\n",
    join_tools!(),
    take_nproc!(),
    r#"if [ -n "$CRA_SHELL_PREFIX" ]; then
  p=$CRA_SHELL_PREFIX
  unset CRA_SHELL_PREFIX
  exec $p "$1"
fi
exec "${SHELL:-/bin/bash}" -c "$1"
"#
);

/// The programs the CLI runs itself that a wrapper puts under the commands' limits before they
/// start (where the session has a cgroup): its ripgrep (Grep, Glob; made the `rg` on `PATH` by
/// `USE_BUILTIN_RIPGREP=0`) and its git (which runs what a repository's config names: an
/// fsmonitor, a diff driver). The placer would move them anyway, within its sweep; the wrapper
/// makes it before their first instruction.
pub const WRAPPED_TOOLS: &[&str] = &["rg", "git"];
/// The wrapper of each of [`WRAPPED_TOOLS`] (`<dir>/bin/<name>`, the directory first on the
/// CLI's `PATH`): joins the commands' cgroup (`join_tools`), or where the share is an rlimit
/// (`CRA_TOOLS_NPROC`: no usable cgroup, a pod) takes it, then runs the program of that name
/// further along `PATH`; ripgrep without one is the CLI's own, built in (its binary, `CRA_CLI`
/// as the bridge script found it, run as `rg` with the arguments the CLI gives its own).
pub const TOOL_WRAPPER_SCRIPT: &str = concat!(
    "d=${0%/*}\nd=${d%/*}\n",
    join_tools!(),
    take_nproc!(),
    r#"name=${0##*/}
IFS=:
for p in $PATH; do
  if [ "$p" != "$d/bin" ] && [ -f "$p/$name" ] && [ -x "$p/$name" ]; then
    unset IFS
    exec "$p/$name" "$@"
  fi
done
unset IFS
cli=${CRA_CLI:-$CLAUDE_CODE_EXECPATH}
if [ "$name" = rg ] && [ -n "$cli" ]; then
  exec bash -c 'exec -a rg "$0" --no-config "$@"' "$cli" "$@"
fi
echo "claude-runtime-adapter: no $name to run" >&2
exit 127
"#
);

/// The agent's commands' share of the session's limits: what is left after the CLI's
/// headroom — a quarter of the tasks (at least 64) and of the memory (at least 512 MiB), never
/// more than half of either. The CLI (a runtime with its worker threads, the two bridges and
/// their connections) stays well inside that headroom.
pub fn commands_share(limits: &Limits) -> Limits {
    let share = |total: u64, floor: u64| total - (total / 4).max(floor).min(total / 2);
    Limits {
        memory: limits.memory.map(|m| share(m, 512 * MIB)),
        tasks: limits.tasks.map(|t| share(t, 64).max(1)),
        ..*limits
    }
}
