//! The bubblewrap mount plan one session (or one git command of the adapter's, see
//! [`super::git_jail`]) runs in. Built from paths that exist before the session starts and that no
//! other session's git creates or removes (a whole directory, never a file inside a shared
//! `.git`), so concurrent sessions cannot break each other's sandbox.
//!
//! What is inside, in mount order (later mounts cover earlier ones):
//! 1. fresh namespaces for users, pids, network, IPC and hostname, and no further user
//!    namespaces (`--disable-userns`: `unshare -Ur` inside would hand back every capability of
//!    a nested namespace, kernel attack surface); a fresh `/proc` (only the session's
//!    processes); a minimal `/dev`; `--die-with-parent`, `--new-session`, every capability
//!    dropped (bwrap run as root keeps them otherwise); an empty `/tmp` and `/dev/shm`, every
//!    tmpfs of the plan sized ([`JailPlan::tmpfs_size`]) and `/dev` itself read-only (bwrap's
//!    `--dev` is a writable tmpfs of no size);
//! 2. the system read-only (`/usr`, `/bin`, `/lib*`, `/sbin`, `/etc` without its shadow files);
//! 3. a private, empty home directory (tmpfs) and CLI config dir; none of the user's dotfiles
//!    (a profile re-exports tokens, a global git config carries url rewrites with tokens): the
//!    adapter's generated files go there instead ([`JailPlan::home_files`], the git identity);
//! 4. read-only: what the toolchains on the CLI's `PATH` run from, without their neighbours
//!    ([`super::toolchains`]), what the session must read (the repository view for a Planner or
//!    Reviewer, the shared object store for an Implementor, the CLI itself,
//!    `sandbox.allowRead`);
//! 5. read-write: the Implementor's clone and `sandbox.allowWrite`;
//! 6. read-only: the directory holding the sockets of the adapter's egress proxy and model
//!    relay (connecting needs no write access; nobody inside may plant or replace a socket);
//! 7. credential stores and key files that any of these binds would show are covered with
//!    empty ones — after every bind, so no bind lays the host's file over a cover again, and
//!    compared with the binds resolved through symlinks ([`covers`]);
//! 8. the sandbox's own root read-only.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{AdapterError, ErrorCode, Result};
#[cfg(target_os = "linux")]
use crate::git::layer::LayerMounts;

use super::toolchains::{toolchain_mounts, RoMount};
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

/// What one sandbox contains.
#[derive(Debug, Clone, Default)]
pub struct JailPlan {
    /// Where processes start.
    pub cwd: PathBuf,
    /// Read-write (must exist).
    pub writable: Vec<PathBuf>,
    /// Read-only (skipped when missing).
    pub readable: Vec<PathBuf>,
    /// The home directory processes see: empty and private.
    pub home: Option<PathBuf>,
    /// Files the adapter made for the session, shown read-only: (host file, path inside).
    pub home_files: Vec<(PathBuf, PathBuf)>,
    /// Further private, empty, writable directories.
    pub scratch: Vec<PathBuf>,
    /// Host directories of the session bound writable at a path inside: (host, inside). The
    /// CLI's config dir, which outlives one CLI so a conversation can be resumed.
    pub kept: Vec<(PathBuf, PathBuf)>,
    /// Host directory shown at [`SOCKET_DIR`].
    pub sockets: Option<PathBuf>,
    /// The `PATH` processes get: its toolchains are made readable.
    pub path_env: Option<OsString>,
    /// Bytes each tmpfs made here may hold (`None`: the kernel's default, half of RAM).
    pub tmpfs_size: Option<u64>,
    /// Credential files named by the environment (a cloud key file): hidden wherever they are
    /// within what is visible.
    pub secret_files: Vec<PathBuf>,
    /// A copy-on-write checkout mounted before bubblewrap starts (its `target` is then made
    /// writable like any other directory of `writable`): see [`super::overlay`].
    #[cfg(target_os = "linux")]
    pub overlay: Option<super::overlay::Overlay>,
}

#[cfg(target_os = "linux")]
impl JailPlan {
    /// Shows a layered checkout ([`LayerMounts`]): its overlay mounted, its git dir writable,
    /// the object stores that git dir reads through readable. The session's sandbox and the
    /// jail of the adapter's git mount a layer alike, here.
    pub fn mount_layer(&mut self, layer: &LayerMounts) {
        self.overlay = Some(super::overlay::Overlay {
            lower: layer.lower.clone(),
            upper: layer.upper.clone(),
            work: layer.work.clone(),
            target: layer.target.clone(),
        });
        self.writable.push(layer.git_dir.clone());
        self.readable.extend(layer.objects.iter().cloned());
    }
}

/// A built plan: bwrap's arguments up to (not including) the `--` before the command.
#[derive(Debug, Clone)]
pub struct Jail {
    args: Vec<OsString>,
    #[cfg(target_os = "linux")]
    overlay: Option<super::overlay::Overlay>,
}

impl Jail {
    pub fn new(plan: &JailPlan) -> Jail {
        let mut a = Args::default();
        let size = plan.tmpfs_size;
        a.flags(&[
            "--die-with-parent",
            "--new-session",
            "--unshare-user",
            "--disable-userns",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--cap-drop",
            "ALL",
        ]);
        // Started as root of the namespace the overlay is mounted in: the processes keep the
        // ids they would have had without it.
        #[cfg(target_os = "linux")]
        if plan.overlay.is_some() {
            let (uid, gid) = super::overlay::Overlay::ids();
            a.two("--uid", &uid.to_string());
            a.two("--gid", &gid.to_string());
        }
        a.two("--proc", "/proc");
        a.two("--dev", "/dev");
        a.tmpfs(size, OsStr::new("/dev/shm"));
        a.two("--remount-ro", "/dev");
        a.tmpfs(size, OsStr::new("/tmp"));
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
            a.tmpfs(size, home.as_os_str());
        }
        for dir in &plan.scratch {
            if Some(dir) != plan.home.as_ref() {
                a.tmpfs(size, dir.as_os_str());
            }
        }
        for (host, inside) in &plan.kept {
            a.pair("--bind", host.as_os_str(), inside.as_os_str());
        }
        // What the read-only binds show: (host path, path inside).
        let mut readable: Vec<(PathBuf, PathBuf)> = Vec::new();
        for RoMount { src, dest } in
            toolchain_mounts(plan.path_env.as_deref(), plan.home.as_deref(), SYSTEM_DIRS)
        {
            a.pair("--ro-bind-try", src.as_os_str(), dest.as_os_str());
            readable.push((src, dest));
        }
        for p in &plan.readable {
            a.pair("--ro-bind-try", p.as_os_str(), p.as_os_str());
            readable.push((p.clone(), p.clone()));
        }
        for (src, dest) in &plan.home_files {
            a.pair("--ro-bind", src.as_os_str(), dest.as_os_str());
        }
        for p in &plan.writable {
            a.pair("--bind", p.as_os_str(), p.as_os_str());
        }
        if let Some(s) = &plan.sockets {
            a.pair("--ro-bind", s.as_os_str(), OsStr::new(SOCKET_DIR));
        }
        // Last of all the binds: a bind made after a cover would lay the host's file over it
        // again (a key file inside an allowWrite directory was readable and writable).
        // A system dir that is a symlink (merged /usr) shows what its target's bind shows.
        let shown = SYSTEM_DIRS
            .iter()
            .map(PathBuf::from)
            .filter(|p| std::fs::read_link(p).is_err())
            .chain(plan.writable.iter().cloned())
            .map(|p| (p.clone(), p))
            .chain(readable);
        let stores = plan
            .home
            .iter()
            .flat_map(|h| HOME_CREDENTIALS.iter().map(move |c| h.join(c)))
            .chain(plan.secret_files.iter().cloned());
        for cover in covers(shown, stores) {
            if cover.is_dir {
                a.tmpfs(size, cover.inside.as_os_str());
            } else {
                a.pair(
                    "--ro-bind",
                    OsStr::new("/dev/null"),
                    cover.inside.as_os_str(),
                );
            }
        }
        // Nothing else is writable: without this the sandbox's root tmpfs would take writes
        // (private to the sandbox, but an agent would think it wrote somewhere real).
        a.two("--remount-ro", "/");
        a.one("--chdir", plan.cwd.as_os_str());
        Jail {
            args: a.0,
            #[cfg(target_os = "linux")]
            overlay: plan.overlay.clone(),
        }
    }

    /// What bwrap's process must run before exec: mounting the plan's overlay
    /// ([`super::overlay::Overlay::pre_exec`]); `None` without one. `Err`: the overlay's paths
    /// cannot be mounted.
    #[cfg(target_os = "linux")]
    #[allow(clippy::type_complexity)]
    pub fn pre_exec(
        &self,
    ) -> std::result::Result<
        Option<Box<dyn FnMut() -> std::io::Result<()> + Send + Sync + 'static>>,
        String,
    > {
        match &self.overlay {
            Some(o) => Ok(Some(Box::new(o.pre_exec()?))),
            None => Ok(None),
        }
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
    /// A private, empty tmpfs at `p` of at most `size` bytes.
    fn tmpfs(&mut self, size: Option<u64>, p: &OsStr) {
        if let Some(n) = size {
            self.two("--size", &n.to_string());
        }
        self.one("--tmpfs", p);
    }
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

/// A credential store or key file as the sandbox would show it, to be covered.
#[derive(Debug, PartialEq, Eq)]
struct Cover {
    /// Where the sandbox shows it.
    inside: PathBuf,
    /// Covered with an empty directory (else with an empty file).
    is_dir: bool,
}

/// Where the sandbox would show any of `stores` (credential stores and key files, existing or
/// not) through the binds `shown` ((host path, path inside)). Both sides are compared resolved
/// through symlinks, as the kernel resolves them: a key file named through a link outside
/// every bind, or a bind whose path holds a link, shows the file where it really is. A bind of
/// a directory inside a store (`~/.aws/sso`) is covered whole.
fn covers(
    shown: impl Iterator<Item = (PathBuf, PathBuf)>,
    stores: impl Iterator<Item = PathBuf>,
) -> Vec<Cover> {
    let stores: Vec<PathBuf> = stores.filter_map(|s| s.canonicalize().ok()).collect();
    let mut covers: Vec<Cover> = Vec::new();
    for (host, inside) in shown {
        let Ok(host) = host.canonicalize() else {
            continue;
        };
        for store in &stores {
            let cover = if let Ok(rest) = store.strip_prefix(&host) {
                Cover {
                    inside: inside.join(rest),
                    is_dir: store.is_dir(),
                }
            } else if host.starts_with(store) {
                Cover {
                    inside: inside.clone(),
                    is_dir: host.is_dir(),
                }
            } else {
                continue;
            };
            if !covers.contains(&cover) {
                covers.push(cover);
            }
        }
    }
    covers
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
        Ok(o) => {
            let stderr = String::from_utf8_lossy(&o.stderr);
            // bwrap before 0.8 has no --disable-userns: without it the sandbox cannot keep a
            // command from making user namespaces, so it does not start.
            let old = if stderr.contains("disable-userns") {
                " (bubblewrap 0.8 or later is needed, for --disable-userns)"
            } else {
                ""
            };
            format!(
                "bubblewrap ({}) cannot create a sandbox here{old} ({}): {}",
                bwrap.display(),
                o.status,
                stderr.trim()
            )
        }
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
    fn credential_stores_inside_a_readable_tree_are_covered_and_a_toolchain_brings_none() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(home.join(".cargo/bin")).unwrap();
        std::fs::write(home.join(".cargo/credentials.toml"), "token").unwrap();
        std::fs::write(home.join(".cargo/config.toml"), "[registry]\ntoken = 't'").unwrap();
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        let args_of = |readable: Vec<PathBuf>| -> Vec<String> {
            Jail::new(&JailPlan {
                cwd: home.clone(),
                home: Some(home.clone()),
                readable,
                path_env: Some(home.join(".cargo/bin").into_os_string()),
                ..JailPlan::default()
            })
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
        };
        let cred = home.join(".cargo/credentials.toml").display().to_string();
        let cargo = home.join(".cargo").display().to_string();
        // On PATH, ~/.cargo/bin brings neither ~/.cargo nor its credentials or config.
        let args = args_of(Vec::new());
        assert!(args.contains(&home.join(".cargo/bin").display().to_string()));
        assert!(!args.contains(&cargo) && !args.contains(&cred));
        // Made readable as a whole (sandbox.allowRead), its credential store is covered.
        let args = args_of(vec![home.join(".cargo")]);
        let at = args
            .iter()
            .position(|a| *a == cred)
            .expect("credentials covered");
        assert_eq!(args[at - 1], "/dev/null");
        // ~/.ssh is not inside anything readable: the private home already lacks it.
        assert!(!args.contains(&home.join(".ssh").display().to_string()));
    }

    /// A key file in a writable directory, named through a symlink outside it, and a credential
    /// store of the home inside a writable tree: covered after the writable binds, where the
    /// sandbox shows them.
    #[cfg(unix)]
    #[test]
    fn key_files_and_stores_inside_writable_trees_are_covered_after_the_binds_where_they_really_are(
    ) {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().canonicalize().unwrap();
        let (rw, links, home) = (top.join("rw"), top.join("links"), top.join("rw/home"));
        std::fs::create_dir_all(home.join(".aws")).unwrap();
        std::fs::create_dir_all(&links).unwrap();
        std::fs::write(rw.join("key.json"), "key").unwrap();
        std::os::unix::fs::symlink(rw.join("key.json"), links.join("key.json")).unwrap();
        // allowWrite itself named through a link.
        std::os::unix::fs::symlink(&rw, top.join("rw-link")).unwrap();
        let args: Vec<String> = Jail::new(&JailPlan {
            cwd: top.clone(),
            home: Some(home.clone()),
            writable: vec![top.join("rw-link")],
            secret_files: vec![links.join("key.json")],
            ..JailPlan::default()
        })
        .args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
        let at = |w: [&str; 2]| {
            args.windows(2)
                .position(|p| p == w)
                .unwrap_or_else(|| panic!("{w:?} in {args:?}"))
        };
        let s = |p: PathBuf| p.display().to_string();
        let bind = at(["--bind", &s(top.join("rw-link"))]);
        let key = at(["/dev/null", &s(top.join("rw-link/key.json"))]);
        let store = at(["--tmpfs", &s(top.join("rw-link/home/.aws"))]);
        assert!(bind < key && bind < store, "{args:?}");
        assert!(
            !args.contains(&s(links.join("key.json"))),
            "the link is not shown"
        );
    }

    /// Every tmpfs the plan makes is sized, /dev/shm included, and bwrap's /dev tmpfs takes no
    /// files once /dev/shm is mounted in it.
    #[test]
    fn every_tmpfs_is_sized_and_dev_is_read_only() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("home");
        std::fs::create_dir_all(home.join(".cargo/bin")).unwrap();
        std::fs::create_dir_all(home.join(".cargo/registry")).unwrap();
        let jail = Jail::new(&JailPlan {
            cwd: t.path().to_path_buf(),
            home: Some(home.clone()),
            scratch: vec![t.path().join("config")],
            path_env: Some(home.join(".cargo/bin").into_os_string()),
            tmpfs_size: Some(8 << 20),
            ..JailPlan::default()
        });
        let args: Vec<String> = jail
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let tmpfs: Vec<usize> = (0..args.len()).filter(|&i| args[i] == "--tmpfs").collect();
        assert!(tmpfs.len() >= 4, "{args:?}");
        for i in tmpfs {
            assert_eq!(&args[i - 2..i], ["--size", "8388608"], "{}", args[i + 1]);
        }
        let at = |flag: &str, path: &str| {
            args.windows(2)
                .position(|w| w[0] == flag && w[1] == path)
                .unwrap_or_else(|| panic!("{flag} {path} in {args:?}"))
        };
        assert!(at("--dev", "/dev") < at("--tmpfs", "/dev/shm"));
        assert!(at("--tmpfs", "/dev/shm") < at("--remount-ro", "/dev"));
        for p in [home.clone(), t.path().join("config")] {
            at("--tmpfs", &p.display().to_string());
        }
        let default = Jail::new(&JailPlan::default());
        assert!(!default.args.iter().any(|a| a == "--size"));
    }
}
