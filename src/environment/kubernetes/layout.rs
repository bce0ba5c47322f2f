//! Where things are in a session's pod: the adapter's runtime there (the image contract:
//! `image/`) and the directories the adapter makes and uses. One list, for every step that
//! names a path in the pod.

/// The adapter's runtime in the pod ([`super::cluster::RUNTIME_DIR`]: the session image's own,
/// or the copy a pod of another image gets; its contract: `image/`).
pub(super) const RUNTIME_BIN: &str = "/opt/claude-runtime-adapter/bin";
/// The runtime's `git` (image/git-history), first on the PATH: history on demand.
pub(super) const RUNTIME_HISTORY: &str = "/opt/claude-runtime-adapter/history";
pub(super) const CLI: &str = "/opt/claude-runtime-adapter/bin/claude";
pub(super) const MUX: &[&str] = &["/opt/claude-runtime-adapter/bin/cra-pod", "mux"];
pub(super) const JAIL: &str = "/opt/claude-runtime-adapter/bin/cra-jail";
/// The PATH a command gets where the image names none.
pub(super) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
pub(super) const WORKDIR: &str = "/workspace/repo";
pub(super) const STATE: &str = "/var/lib/cra";
pub(super) const SOCKETS: &str = "/var/lib/cra/sockets";
pub(super) const HOME: &str = "/home/agent";
