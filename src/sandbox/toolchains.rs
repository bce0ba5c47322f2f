//! What of the toolchains on the session's `PATH` is mounted (read-only) so they run inside,
//! without their neighbours: a `…/bin` on `PATH` used to bring its whole prefix, and
//! `~/.local/bin` brought `~/.local/share` (shell history, `auth.json` files, keyrings), nvm's
//! bin its `etc/npmrc` (the global `_authToken`), `~/.cargo/bin` its `config.toml` (registry
//! token), `~/go/bin` every repository under `~/go/src`.
//!
//! The rule, per `PATH` directory (system directories are mounted whole elsewhere):
//! - the directory itself;
//! - of its prefix (the parent of a `bin`), only the parts a toolchain runs from
//!   ([`PREFIX_PARTS`]: `lib`, `libexec`, `include`, a venv's `pyvenv.cfg`, a version manager's
//!   `shims`/`versions`…), never `etc`, `share`, `src`, `pkg` or config files — except a Go
//!   root, which needs its `src` and `pkg` and holds nothing else;
//! - a `shims` directory brings its version manager's root the same way (pyenv, rbenv, nodenv);
//! - `~/.cargo/bin` brings rustup's toolchains and settings and cargo's read-only caches
//!   (`registry`, `git`), not `config.toml` or credentials;
//! - a symlink in a mounted `bin` (pipx and uv tools in `~/.local/bin`, a venv's `python`) and a
//!   script's `#!` interpreter bring the prefix they resolve to, by the same rule (followed
//!   transitively, bounded); a target with no `bin` above it brings only itself;
//! - a `versions`/`toolchains` entry that is a symlink brings its target.
//!
//! Every path is mounted at its real location and, where `PATH` names it through a symlink, at
//! that name too. Nothing is ever the home directory, an ancestor of it, or `/`.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};

/// A read-only mount: `src` (real path on the host) shown at `dest`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RoMount {
    pub src: PathBuf,
    pub dest: PathBuf,
}

/// What of a prefix a toolchain runs from.
const PREFIX_PARTS: &[&str] = &[
    "bin",
    "sbin",
    "lib",
    "lib32",
    "lib64",
    "libexec",
    "include",
    "pyvenv.cfg",
    "shims",
    "plugins",
    "versions",
    "version",
];

/// Bounds: a `PATH` full of huge directories (Homebrew's has thousands of entries) costs a
/// bounded scan, and a symlink maze cannot grow the plan without end.
const MAX_ENTRIES_PER_DIR: usize = 4096;
const MAX_PREFIXES: usize = 256;

/// The mounts for `path_env`; `home` is never mounted (nor anything above it); `system` lists
/// directories the sandbox already has.
pub fn toolchain_mounts(
    path_env: Option<&OsStr>,
    home: Option<&Path>,
    system: &[&str],
) -> Vec<RoMount> {
    let mut plan = Plan {
        home: home.map(|h| h.canonicalize().unwrap_or_else(|_| h.to_path_buf())),
        system: system.iter().map(PathBuf::from).collect(),
        mounts: BTreeSet::new(),
        prefixes: BTreeSet::new(),
        queue: Vec::new(),
    };
    let Some(path_env) = path_env else {
        return Vec::new();
    };
    for entry in std::env::split_paths(path_env) {
        if !entry.is_absolute() {
            continue;
        }
        let Ok(real) = entry.canonicalize() else {
            continue;
        };
        if !real.is_dir() || plan.excluded(&real) || plan.excluded(&entry) {
            continue;
        }
        plan.mount(&real, &entry);
        // Scanned once its prefix is mounted: `npm -> ../lib/node_modules/…` is then covered.
        plan.queue.push(real.clone());
        let name = real.file_name().and_then(OsStr::to_str);
        if let (Some("bin" | "shims"), Some(prefix)) = (name, real.parent()) {
            plan.prefix(prefix);
        }
    }
    plan.drain();
    plan.finish()
}

struct Plan {
    home: Option<PathBuf>,
    system: Vec<PathBuf>,
    mounts: BTreeSet<RoMount>,
    prefixes: BTreeSet<PathBuf>,
    /// `bin` directories still to scan for symlinks and interpreters.
    queue: Vec<PathBuf>,
}

impl Plan {
    /// `/`, the home directory and its ancestors would expose everything; system dirs are
    /// mounted already.
    fn excluded(&self, p: &Path) -> bool {
        p.parent().is_none()
            || self.home.as_deref().is_some_and(|h| h.starts_with(p))
            || self.system.iter().any(|s| p.starts_with(s))
    }

    fn mount(&mut self, real: &Path, seen_as: &Path) {
        if self.excluded(real) {
            return;
        }
        self.mounts.insert(RoMount {
            src: real.to_path_buf(),
            dest: real.to_path_buf(),
        });
        if seen_as != real && !self.excluded(seen_as) {
            self.mounts.insert(RoMount {
                src: real.to_path_buf(),
                dest: seen_as.to_path_buf(),
            });
        }
    }

    /// The mounts, without the aliases that fall inside another mounted tree: there the
    /// symlink itself is visible and resolves to the real path, which is mounted (bwrap cannot
    /// mount onto a symlink in a read-only tree anyway).
    fn finish(self) -> Vec<RoMount> {
        let inside_another = |m: &RoMount| {
            m.src != m.dest
                && self
                    .mounts
                    .iter()
                    .any(|o| o.dest != m.dest && m.dest.starts_with(&o.dest))
        };
        self.mounts
            .iter()
            .filter(|m| !inside_another(m))
            .cloned()
            .collect()
    }

    fn covered(&self, p: &Path) -> bool {
        self.mounts
            .iter()
            .any(|m| m.src == m.dest && p.starts_with(&m.src))
    }

    /// Mounts what of `prefix` a toolchain runs from (see the module docs).
    fn prefix(&mut self, prefix: &Path) {
        if self.excluded(prefix)
            || self.prefixes.len() >= MAX_PREFIXES
            || !self.prefixes.insert(prefix.to_path_buf())
        {
            return;
        }
        if is_go_root(prefix) {
            self.mount(prefix, prefix);
            return;
        }
        for part in PREFIX_PARTS {
            let p = prefix.join(part);
            if std::fs::symlink_metadata(&p).is_err() {
                continue;
            }
            match p.canonicalize() {
                Ok(real) => self.mount(&real, &p),
                Err(_) => continue,
            }
            if *part == "bin" {
                self.queue.push(p.clone());
            }
            if *part == "versions" {
                self.linked_entries(&p);
            }
        }
        if prefix.join("bin/rustup").is_file() || prefix.file_name() == Some(OsStr::new(".cargo")) {
            self.rustup(prefix);
        }
    }

    /// rustup's proxies in `~/.cargo/bin` run the toolchains in `~/.rustup`; cargo reads its
    /// caches from `~/.cargo` (writes go to the private home's tmpfs around them).
    fn rustup(&mut self, cargo_home: &Path) {
        for cache in ["registry", "git"] {
            let p = cargo_home.join(cache);
            if p.is_dir() {
                self.mount(&p, &p);
            }
        }
        let Some(rustup) = cargo_home.parent().map(|h| h.join(".rustup")) else {
            return;
        };
        for part in ["settings.toml", "toolchains", "update-hashes"] {
            let p = rustup.join(part);
            if let Ok(real) = p.canonicalize() {
                self.mount(&real, &p);
            }
        }
        self.linked_entries(&rustup.join("toolchains"));
    }

    /// Entries of `dir` that are symlinks (a pyenv version, a rustup linked toolchain): their
    /// targets are mounted at the entry.
    fn linked_entries(&mut self, dir: &Path) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten().take(MAX_ENTRIES_PER_DIR) {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_symlink()) {
                if let Ok(real) = p.canonicalize() {
                    if real.is_dir() {
                        self.mount(&real, &p);
                    }
                }
            }
        }
    }

    /// The symlinks and `#!` interpreters of a `bin` directory lead to further toolchains.
    fn scan_bin(&mut self, bin: &Path) {
        let Ok(rd) = std::fs::read_dir(bin) else {
            return;
        };
        let mut targets = Vec::new();
        for e in rd.flatten().take(MAX_ENTRIES_PER_DIR) {
            let p = e.path();
            let Ok(t) = e.file_type() else { continue };
            if t.is_symlink() {
                if let Ok(real) = p.canonicalize() {
                    targets.push(real);
                }
            } else if t.is_file() {
                if let Some(interp) = shebang_interpreter(&p) {
                    if let Ok(real) = interp.canonicalize() {
                        targets.push(real);
                    }
                }
            }
        }
        for t in targets {
            if self.covered(&t) || self.excluded(&t) {
                continue;
            }
            if let Some(pkg) = npm_package(&t) {
                match pkg {
                    NpmLayout::GlobalPrefix(p) => self.prefix(&p),
                    NpmLayout::Package(p) => self.mount(&p, &p),
                }
                continue;
            }
            match t
                .ancestors()
                .find(|a| a.file_name() == Some(OsStr::new("bin")))
            {
                Some(bin) if bin.parent().is_some_and(|p| !self.excluded(p)) => {
                    let prefix = bin.parent().map(Path::to_path_buf).unwrap_or_default();
                    self.prefix(&prefix);
                }
                // A lone script or binary: only itself.
                _ => self.mount(&t, &t),
            }
        }
    }

    fn drain(&mut self) {
        let mut scanned = BTreeSet::new();
        while let Some(bin) = self.queue.pop() {
            if scanned.len() < MAX_PREFIXES && scanned.insert(bin.clone()) {
                self.scan_bin(&bin);
            }
        }
    }
}

enum NpmLayout {
    /// `<prefix>/lib/node_modules/<pkg>/…`: an npm global prefix, mounted as a prefix.
    GlobalPrefix(PathBuf),
    /// `…/node_modules/<pkg>/…` elsewhere: the package, self-contained.
    Package(PathBuf),
}

/// Where a file inside an npm package comes from (its `bin` lives in the package, so the
/// nearest `bin` above it is not a prefix).
fn npm_package(t: &Path) -> Option<NpmLayout> {
    let modules = t
        .ancestors()
        .filter(|a| a.file_name() == Some(OsStr::new("node_modules")))
        .last()?;
    let lib = modules.parent()?;
    if lib.file_name() == Some(OsStr::new("lib")) {
        return lib
            .parent()
            .map(|p| NpmLayout::GlobalPrefix(p.to_path_buf()));
    }
    let rest = t.strip_prefix(modules).ok()?;
    let mut pkg = modules.to_path_buf();
    for c in rest.components().take(2) {
        pkg.push(c);
        // A scoped package is two levels: `@scope/name`.
        if !c.as_os_str().to_string_lossy().starts_with('@') {
            break;
        }
    }
    Some(NpmLayout::Package(pkg))
}

/// A Go root (`GOROOT`) needs its `src` and `pkg`, unlike a `GOPATH`, whose `src` holds other
/// repositories.
fn is_go_root(p: &Path) -> bool {
    p.join("src/runtime").is_dir() && p.join("pkg/tool").is_dir() && p.join("VERSION").is_file()
}

/// The absolute interpreter of a `#!` script (`/usr/bin/env` and the like included; the
/// caller skips what the system mounts cover).
fn shebang_interpreter(file: &Path) -> Option<PathBuf> {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(file).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|b| *b == b'\n').next()?;
    let interp = std::str::from_utf8(line).ok()?.split_whitespace().next()?;
    let p = PathBuf::from(interp);
    p.is_absolute().then_some(p)
}

// Symlinks make the layouts under test: unix only.
#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn mk(root: &Path, files: &[&str]) {
        for f in files {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "x").unwrap();
        }
    }

    fn dests(m: &[RoMount]) -> Vec<String> {
        m.iter().map(|m| m.dest.display().to_string()).collect()
    }

    #[test]
    fn toolchains_bring_what_runs_them_and_never_their_neighbours() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().canonicalize().unwrap().join("home");
        mk(
            &home,
            &[
                // nvm: node, npm via ../lib, and the global npmrc with a token
                ".nvm/versions/node/v20/bin/node",
                ".nvm/versions/node/v20/lib/node_modules/npm/bin/npm-cli.js",
                ".nvm/versions/node/v20/etc/npmrc",
                // ~/.local: a uv tool symlinked in, history and auth files beside it
                ".local/share/uv/tools/ruff/bin/ruff",
                ".local/share/uv/tools/ruff/pyvenv.cfg",
                ".local/share/fish/fish_history",
                ".local/share/gh/auth.json",
                ".local/lib/python3.11/site-packages/m.py",
                // cargo: proxies, caches, the token-bearing config
                ".cargo/bin/cargo",
                ".cargo/registry/index/x",
                ".cargo/config.toml",
                ".rustup/settings.toml",
                ".rustup/toolchains/stable/bin/rustc",
                // go: a GOPATH's bin, with other repositories in src
                "go/bin/gotool",
                "go/src/github.com/other/repo/secret.txt",
            ],
        );
        symlink(
            "../lib/node_modules/npm/bin/npm-cli.js",
            home.join(".nvm/versions/node/v20/bin/npm"),
        )
        .unwrap();
        std::fs::create_dir_all(home.join(".local/bin")).unwrap();
        symlink(
            home.join(".local/share/uv/tools/ruff/bin/ruff"),
            home.join(".local/bin/ruff"),
        )
        .unwrap();
        let path = std::env::join_paths([
            home.join(".nvm/versions/node/v20/bin"),
            home.join(".local/bin"),
            home.join(".cargo/bin"),
            home.join("go/bin"),
            home.clone(),
            PathBuf::from("/usr/bin"),
            PathBuf::from("/"),
        ])
        .unwrap();
        let m = toolchain_mounts(Some(&path), Some(&home), &["/usr"]);
        let got = dests(&m);
        let h = |p: &str| home.join(p).display().to_string();
        for want in [
            ".nvm/versions/node/v20/bin",
            ".nvm/versions/node/v20/lib",
            ".local/bin",
            ".local/lib",
            ".local/share/uv/tools/ruff/bin",
            ".local/share/uv/tools/ruff/pyvenv.cfg",
            ".cargo/bin",
            ".cargo/registry",
            ".rustup/toolchains",
            ".rustup/settings.toml",
            "go/bin",
        ] {
            assert!(got.contains(&h(want)), "{want} missing from {got:#?}");
        }
        for mounted in &m {
            for secret in [
                ".nvm/versions/node/v20/etc/npmrc",
                ".local/share/fish/fish_history",
                ".local/share/gh/auth.json",
                ".cargo/config.toml",
                "go/src/github.com/other/repo/secret.txt",
            ] {
                assert!(
                    !home.join(secret).starts_with(&mounted.dest),
                    "{secret} is visible through {mounted:?}"
                );
            }
            assert!(!home.starts_with(&mounted.dest), "{mounted:?} covers home");
            assert!(!mounted.dest.starts_with("/usr"));
        }
    }

    #[test]
    fn a_path_entry_through_a_symlink_is_mounted_at_both_names_and_a_lone_target_brings_only_itself(
    ) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        let home = root.join("home");
        mk(
            &root,
            &["opt/node-v1/bin/node", "home/projects/app/run.sh", "x/y"],
        );
        symlink(root.join("opt/node-v1"), root.join("current")).unwrap();
        std::fs::create_dir_all(home.join("bin2")).unwrap();
        symlink(home.join("projects/app/run.sh"), home.join("bin2/run")).unwrap();
        let path = std::env::join_paths([root.join("current/bin"), home.join("bin2")]).unwrap();
        let m = toolchain_mounts(Some(&path), Some(&home), &[]);
        assert!(m.contains(&RoMount {
            src: root.join("opt/node-v1/bin"),
            dest: root.join("current/bin"),
        }));
        assert!(m.contains(&RoMount {
            src: root.join("opt/node-v1/bin"),
            dest: root.join("opt/node-v1/bin"),
        }));
        assert!(m.contains(&RoMount {
            src: home.join("projects/app/run.sh"),
            dest: home.join("projects/app/run.sh"),
        }));
        assert!(!dests(&m).contains(&home.join("projects/app").display().to_string()));
    }

    #[test]
    fn a_script_interpreter_brings_its_prefix() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        mk(
            &root,
            &["py/3.11/bin/python3.11", "py/3.11/lib/python3.11/os.py"],
        );
        let tool = root.join("tools/bin/tool");
        std::fs::create_dir_all(tool.parent().unwrap()).unwrap();
        std::fs::write(
            &tool,
            format!(
                "#!{} -u\nprint(1)\n",
                root.join("py/3.11/bin/python3.11").display()
            ),
        )
        .unwrap();
        let m = toolchain_mounts(Some(root.join("tools/bin").as_os_str()), None, &[]);
        let got = dests(&m);
        assert!(
            got.contains(&root.join("py/3.11/lib").display().to_string()),
            "{got:?}"
        );
    }
}
