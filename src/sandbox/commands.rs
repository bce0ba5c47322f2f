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
/// The Bash prefix inside the sandbox (`CLAUDE_CODE_SHELL_PREFIX`; the CLI runs it as
/// `<prefix> '<command string>'`): where the engine placed the session in a cgroup (the request
/// pipe is beside it), asks to be moved into the commands' cgroup and waits (a few seconds at
/// most) until its own `/proc/self/cgroup` shows it there; sets the commands' `RLIMIT_NPROC`
/// when `CRA_TOOLS_NPROC` says so; then runs the command string with the CLI's shell (or the
/// engine's own prefix, `CRA_SHELL_PREFIX`). Fail-closed: a command that cannot be put under
/// its limits does not run. Nothing of the cgroup filesystem is writable inside: the engine
/// does the move, of what the CLI started only. The wait checks with builtins; its `sleep`s
/// are the engine's to move like the rest. None is made after the limits apply (a command
/// string of builtins still runs while the commands' share is used up).
pub const TOOLS_PREFIX_SCRIPT: &str = r#"d=${0%/*}
in_cli() {
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
if [ -n "$CRA_TOOLS_NPROC" ]; then
  ulimit -u "$CRA_TOOLS_NPROC" 2>/dev/null || ulimit -p "$CRA_TOOLS_NPROC" || { echo "claude-runtime-adapter: cannot limit the command's processes" >&2; exit 126; }
fi
unset CRA_TOOLS_NPROC
if [ -n "$CRA_SHELL_PREFIX" ]; then
  p=$CRA_SHELL_PREFIX
  unset CRA_SHELL_PREFIX
  exec $p "$1"
fi
exec "${SHELL:-/bin/bash}" -c "$1"
"#;

/// The agent's commands' share of the session's limits: what is left after the CLI's
/// headroom — a quarter of the tasks (at least 64) and of the memory (at least 512 MiB), never
/// more than half of either. The CLI (a runtime with its worker threads, the two bridges and
/// their connections) stays well inside that headroom.
pub fn commands_share(limits: &Limits) -> Limits {
    let share = |total: u64, floor: u64| total - (total / 4).max(floor).min(total / 2);
    Limits {
        memory: limits.memory.map(|m| share(m, 512 * MIB)),
        tasks: limits.tasks.map(|t| share(t, 64).max(1)),
        tmpfs: limits.tmpfs,
    }
}
