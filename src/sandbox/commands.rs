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
/// The Bash prefix inside the sandbox (`CLAUDE_CODE_SHELL_PREFIX`; the CLI runs it as
/// `<prefix> '<command string>'`): joins the commands' cgroup (every `tools-*.procs` file beside
/// it, one per hierarchy: writing `0` moves the writer), sets the commands' `RLIMIT_NPROC` when
/// `CRA_TOOLS_NPROC` says so, then runs the command string with the CLI's shell (or the engine's
/// own prefix, `CRA_SHELL_PREFIX`). Fail-closed: a command that cannot be put under its limits
/// does not run. No fork before the limits apply is needed, none is made after (a command
/// string of builtins still runs while the commands' share is used up).
pub const TOOLS_PREFIX_SCRIPT: &str = r#"d=${0%/*}
for f in "$d"/tools-*.procs; do
  [ -e "$f" ] || continue
  echo 0 > "$f" || { echo "claude-runtime-adapter: cannot put the command under its limits ($f)" >&2; exit 126; }
done
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
