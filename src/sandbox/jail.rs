//! The bubblewrap mount plan one session (or one git command of the adapter's, see
//! [`Jail::git`]) runs in. Built from paths that exist before the session starts and that no
//! other session's git creates or removes (a whole directory, never a file inside a shared
//! `.git`), so concurrent sessions cannot break each other's sandbox.
//!
//! What is inside, in mount order (later mounts cover earlier ones):
//! 1. fresh namespaces for pids, network, IPC and hostname; a fresh `/proc` (only the session's
//!    processes); a minimal `/dev`; `--die-with-parent`, `--new-session`, every capability
//!    dropped (bwrap run as root keeps them otherwise); an empty `/tmp`;
//! 2. the system read-only (`/usr`, `/bin`, `/lib*`, `/sbin`, `/etc` without its shadow files);
//! 3. a private, empty home directory (tmpfs) and CLI config dir;
//! 4. read-only: the toolchains on the CLI's `PATH` (a `…/bin` entry brings its prefix, so
//!    `npm`'s `../lib/node_modules` resolves), what the session must read (the repository for a
//!    Planner or Reviewer, the shared object store for an Implementor, the CLI itself,
//!    `sandbox.allowRead`), then the user's shell profile and git config files;
//! 5. credential stores that fall inside a read-only tree are covered with empty ones;
//! 6. read-write: the Implementor's clone and `sandbox.allowWrite`;
//! 7. the directory holding the sockets of the adapter's egress proxy and model relay;
//! 8. the sandbox's own root read-only.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{AdapterError, ErrorCode, Result};

use super::HOME_CREDENTIALS;

/// Where the relay sockets appear inside the sandbox.
pub const SOCKET_DIR: &str = "/run/claude-runtime-adapter";

/// System directories bound read-only when they exist.
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// Files under `/etc` nobody in a session needs (password hashes); covered with an empty file.
const HIDDEN_SYSTEM_FILES: &[&str] = &[
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/shadow-",
    "/etc/gshadow-",
];

/// The user's shell profile and git identity, visible read-only in the private home so the
/// agent's shell and commits behave as the user's own.
pub const PROFILE_FILES: &[&str] = &[
    ".profile",
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".zshrc",
    ".zprofile",
    ".zshenv",
    ".inputrc",
    ".gitconfig",
    ".config/git/config",
    ".config/git/ignore",
];

/// What one sandbox contains.
#[derive(Debug, Clone, Default)]
pub struct JailPlan {
    /// Where processes start.
    pub cwd: PathBuf,
    /// Read-write (must exist).
    pub writable: Vec<PathBuf>,
    /// Read-only (skipped when missing).
    pub readable: Vec<PathBuf>,
    /// The home directory processes see: empty, private, with [`PROFILE_FILES`].
    pub home: Option<PathBuf>,
    /// Further private, empty, writable directories (the CLI's config dir).
    pub scratch: Vec<PathBuf>,
    /// Host directory shown at [`SOCKET_DIR`].
    pub sockets: Option<PathBuf>,
    /// The `PATH` processes get: its toolchains are made readable.
    pub path_env: Option<OsString>,
}

/// A built plan: bwrap's arguments up to (not including) the `--` before the command.
#[derive(Debug, Clone)]
pub struct Jail {
    args: Vec<OsString>,
}

impl Jail {
    pub fn new(plan: &JailPlan) -> Jail {
        let mut a = Args::default();
        a.flags(&[
            "--die-with-parent",
            "--new-session",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--cap-drop",
            "ALL",
        ]);
        a.two("--proc", "/proc");
        a.two("--dev", "/dev");
        a.two("--tmpfs", "/tmp");
        for dir in SYSTEM_DIRS {
            let p = Path::new(dir);
            match std::fs::read_link(p) {
                // Merged /usr: keep /bin -> usr/bin a symlink, as on the host.
                Ok(target) => a.pair("--symlink", target.as_os_str(), p.as_os_str()),
                Err(_) if p.is_dir() => a.pair("--ro-bind", p.as_os_str(), p.as_os_str()),
                Err(_) => {}
            }
        }
        for f in HIDDEN_SYSTEM_FILES {
            if Path::new(f).exists() {
                a.pair("--ro-bind", OsStr::new("/dev/null"), OsStr::new(f));
            }
        }
        if let Some(home) = &plan.home {
            a.one("--tmpfs", home.as_os_str());
        }
        for dir in &plan.scratch {
            if Some(dir) != plan.home.as_ref() {
                a.one("--tmpfs", dir.as_os_str());
            }
        }
        let mut readable = toolchain_dirs(plan.path_env.as_deref(), plan.home.as_deref());
        readable.extend(plan.readable.iter().cloned());
        for p in &readable {
            a.pair("--ro-bind-try", p.as_os_str(), p.as_os_str());
        }
        if let Some(home) = &plan.home {
            for f in PROFILE_FILES {
                let p = home.join(f);
                a.pair("--ro-bind-try", p.as_os_str(), p.as_os_str());
            }
        }
        for store in credential_stores_within(&readable, plan.home.as_deref()) {
            if store.is_dir() {
                a.one("--tmpfs", store.as_os_str());
            } else {
                a.pair("--ro-bind", OsStr::new("/dev/null"), store.as_os_str());
            }
        }
        for p in &plan.writable {
            a.pair("--bind", p.as_os_str(), p.as_os_str());
        }
        if let Some(s) = &plan.sockets {
            a.pair("--bind", s.as_os_str(), OsStr::new(SOCKET_DIR));
        }
        // Nothing else is writable: without this the sandbox's root tmpfs would take writes
        // (private to the sandbox, but an agent would think it wrote somewhere real).
        a.two("--remount-ro", "/");
        a.one("--chdir", plan.cwd.as_os_str());
        Jail { args: a.0 }
    }

    /// bwrap's argv for running `program args` inside.
    pub fn argv(&self, program: &OsStr, args: &[OsString]) -> Vec<OsString> {
        let mut v = self.args.clone();
        v.push("--".into());
        v.push(program.to_os_string());
        v.extend(args.iter().cloned());
        v
    }
}

#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn flags(&mut self, f: &[&str]) {
        self.0.extend(f.iter().map(OsString::from));
    }
    fn two(&mut self, flag: &str, v: &str) {
        self.flags(&[flag, v]);
    }
    fn one(&mut self, flag: &str, p: &OsStr) {
        self.0.push(flag.into());
        self.0.push(p.into());
    }
    fn pair(&mut self, flag: &str, a: &OsStr, b: &OsStr) {
        self.one(flag, a);
        self.0.push(b.into());
    }
}

/// Directories of `PATH` worth making readable: an absolute entry, or its prefix when it is a
/// `bin` directory. Never `/`, the home directory or anything above it (that would expose every
/// file the session must not read), nor what the system mounts already cover.
pub(crate) fn toolchain_dirs(path_env: Option<&OsStr>, home: Option<&Path>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let Some(path_env) = path_env else {
        return out;
    };
    for entry in std::env::split_paths(path_env) {
        if !entry.is_absolute() || !entry.is_dir() {
            continue;
        }
        let dir = match (entry.file_name(), entry.parent()) {
            (Some(n), Some(parent)) if n == "bin" => parent.to_path_buf(),
            _ => entry.clone(),
        };
        let too_wide = dir.parent().is_none() || home.is_some_and(|h| h.starts_with(&dir));
        let system = SYSTEM_DIRS.iter().any(|s| dir.starts_with(s));
        if too_wide || system || out.contains(&dir) {
            continue;
        }
        // rustup's proxies in ~/.cargo/bin run the toolchains kept in ~/.rustup.
        if let Some(h) = home {
            if dir == h.join(".cargo") {
                out.push(h.join(".rustup"));
            }
        }
        out.push(dir);
    }
    out
}

/// The home directory's credential stores that lie inside a read-only tree of the plan.
fn credential_stores_within(readable: &[PathBuf], home: Option<&Path>) -> Vec<PathBuf> {
    let Some(home) = home else { return Vec::new() };
    HOME_CREDENTIALS
        .iter()
        .map(|c| home.join(c))
        .filter(|p| p.exists() && readable.iter().any(|r| p.starts_with(r)))
        .collect()
}

/// A check that `bwrap` can build a sandbox here (namespaces allowed, the kernel
/// cooperating): a sandbox that cannot start stops the session before anything is created.
/// A success is remembered for the process; a failure is tried again next time.
pub fn probe(bwrap: &Path) -> Result<()> {
    static WORKS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let works = || WORKS.lock().unwrap_or_else(|e| e.into_inner());
    if works().iter().any(|p| p == bwrap) {
        return Ok(());
    }
    let jail = Jail::new(&JailPlan {
        cwd: PathBuf::from("/"),
        ..JailPlan::default()
    });
    let out = std::process::Command::new(bwrap)
        .args(jail.argv(OsStr::new("true"), &[]))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(std::process::Stdio::null())
        .output();
    let failed = match out {
        Ok(o) if o.status.success() => {
            works().push(bwrap.to_path_buf());
            return Ok(());
        }
        Ok(o) => format!(
            "bubblewrap ({}) cannot create a sandbox here ({}): {}",
            bwrap.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("bubblewrap ({}) could not be started: {e}", bwrap.display()),
    };
    Err(AdapterError::new(
        ErrorCode::SandboxUnavailable,
        format!("{failed}; set `sandbox: false` to run agents without the OS sandbox"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toolchains_bring_their_prefix_but_never_home_or_root() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("home");
        for d in [
            "home/.cargo/bin",
            "home/.nvm/v20/bin",
            "opt/tool/bin",
            "shims",
        ] {
            std::fs::create_dir_all(t.path().join(d)).unwrap();
        }
        let path = std::env::join_paths([
            t.path().join("home/.cargo/bin"),
            t.path().join("home/.nvm/v20/bin"),
            t.path().join("opt/tool/bin"),
            t.path().join("shims"),
            home.clone(),
            t.path().to_path_buf(),
            PathBuf::from("/usr/bin"),
            PathBuf::from("/"),
            PathBuf::from("relative/bin"),
        ])
        .unwrap();
        let dirs = toolchain_dirs(Some(&path), Some(&home));
        assert_eq!(
            dirs,
            vec![
                home.join(".rustup"),
                home.join(".cargo"),
                home.join(".nvm/v20"),
                t.path().join("opt/tool"),
                t.path().join("shims"),
            ]
        );
    }

    /// Later mounts cover earlier ones: the private /tmp and HOME first (a repository below
    /// either is mounted into them), read-only trees before the writable clone inside them,
    /// the root made read-only last, then where to start.
    #[test]
    fn mounts_are_ordered_private_dirs_first_then_read_only_trees_then_the_clone_and_the_root_read_only_last(
    ) {
        let t = tempfile::tempdir().unwrap();
        let repo = t.path().join("repo");
        let clone = repo.join(".worktrees/wi");
        std::fs::create_dir_all(&clone).unwrap();
        let jail = Jail::new(&JailPlan {
            cwd: clone.clone(),
            writable: vec![clone.clone()],
            readable: vec![repo.join(".git/objects")],
            home: Some(t.path().join("home")),
            sockets: Some(t.path().join("sock")),
            ..JailPlan::default()
        });
        let args: Vec<String> = jail
            .argv(OsStr::new("true"), &[])
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let at = |flag: &str, path: &str| {
            args.windows(2)
                .position(|w| w[0] == flag && w[1] == path)
                .unwrap_or_else(|| panic!("{flag} {path} in {args:?}"))
        };
        let s = |p: &Path| p.display().to_string();
        let tmp = at("--tmpfs", "/tmp");
        let home = at("--tmpfs", &s(&t.path().join("home")));
        let objects = args
            .iter()
            .position(|a| *a == s(&repo.join(".git/objects")))
            .unwrap();
        let rw = args.iter().position(|a| *a == "--bind").unwrap();
        let ro_root = at("--remount-ro", "/");
        let chdir = at("--chdir", &s(&clone));
        assert!(tmp < home && home < objects && objects < rw && rw < ro_root && ro_root < chdir);
        for flag in [
            "--unshare-pid",
            "--unshare-net",
            "--die-with-parent",
            "--new-session",
        ] {
            assert!(args.iter().any(|a| a == flag), "{flag}");
        }
        assert_eq!(&args[args.len() - 2..], ["--", "true"]);
    }

    #[test]
    fn credential_stores_inside_a_readable_toolchain_are_covered() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().to_path_buf();
        std::fs::create_dir_all(home.join(".cargo/bin")).unwrap();
        std::fs::write(home.join(".cargo/credentials.toml"), "token").unwrap();
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        let jail = Jail::new(&JailPlan {
            cwd: home.clone(),
            home: Some(home.clone()),
            path_env: Some(home.join(".cargo/bin").into_os_string()),
            ..JailPlan::default()
        });
        let args: Vec<String> = jail
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let cred = home.join(".cargo/credentials.toml").display().to_string();
        let at = args
            .iter()
            .position(|a| *a == cred)
            .expect("credentials covered");
        assert_eq!(args[at - 1], "/dev/null");
        // ~/.ssh is not inside anything readable: the private home already lacks it.
        assert!(!args.contains(&home.join(".ssh").display().to_string()));
    }
}
