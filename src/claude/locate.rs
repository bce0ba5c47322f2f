//! Finding the Claude Code executable: `config.claudeExecutable`, then the platform package of
//! `@anthropic-ai/claude-agent-sdk-<platform>` in any `node_modules` above the addon or the
//! working directory (the way the official SDK resolves it), then `claude` on `PATH`.

use std::path::{Path, PathBuf};

use crate::error::{AdapterError, ErrorCode, Result};

/// The npm packages holding the native CLI for this platform, in the order the SDK tries them
/// (musl first on musl systems).
pub fn platform_packages() -> Vec<&'static str> {
    let arch = if cfg!(target_arch = "aarch64") {
        "arm64"
    } else {
        "x64"
    };
    let mut out = Vec::new();
    if cfg!(target_os = "linux") {
        let musl = cfg!(target_env = "musl");
        match (arch, musl) {
            ("x64", true) => out.extend([
                "claude-agent-sdk-linux-x64-musl",
                "claude-agent-sdk-linux-x64",
            ]),
            ("x64", false) => out.extend([
                "claude-agent-sdk-linux-x64",
                "claude-agent-sdk-linux-x64-musl",
            ]),
            (_, true) => out.extend([
                "claude-agent-sdk-linux-arm64-musl",
                "claude-agent-sdk-linux-arm64",
            ]),
            (_, false) => out.extend([
                "claude-agent-sdk-linux-arm64",
                "claude-agent-sdk-linux-arm64-musl",
            ]),
        }
    } else if cfg!(target_os = "macos") {
        out.push(if arch == "arm64" {
            "claude-agent-sdk-darwin-arm64"
        } else {
            "claude-agent-sdk-darwin-x64"
        });
    } else if cfg!(windows) {
        out.push(if arch == "arm64" {
            "claude-agent-sdk-win32-arm64"
        } else {
            "claude-agent-sdk-win32-x64"
        });
    }
    out
}

fn binary_name() -> &'static str {
    if cfg!(windows) {
        "claude.exe"
    } else {
        "claude"
    }
}

fn is_executable_file(path: &Path) -> bool {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                m.permissions().mode() & 0o111 != 0
            }
            #[cfg(not(unix))]
            {
                true
            }
        }
        _ => false,
    }
}

/// Directories to search for `node_modules`: the addon's own location first (the package that
/// depends on the platform binary), then the working directory.
pub fn search_roots(addon_dir: Option<&Path>) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    if let Some(dir) = addon_dir {
        roots.push(dir.to_path_buf());
    }
    if let Ok(cwd) = std::env::current_dir() {
        roots.push(cwd);
    }
    roots
}

pub fn locate_cli(configured: Option<&Path>, roots: &[PathBuf]) -> Result<PathBuf> {
    let mut tried: Vec<String> = Vec::new();
    // The engine named one: that one or nothing. Falling back would silently run a different
    // CLI than the engine chose (a mistyped path must be an error, not a surprise).
    if let Some(path) = configured {
        if is_executable_file(path) {
            return Ok(path.to_path_buf());
        }
        let why = if path.exists() {
            "is not an executable file"
        } else {
            "does not exist"
        };
        return Err(AdapterError::new(
            ErrorCode::CliNotFound,
            format!(
                "config.claudeExecutable {} {why} (no other CLI is tried when one is named)",
                path.display()
            ),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for root in roots {
        for dir in root.ancestors() {
            let modules = dir.join("node_modules").join("@anthropic-ai");
            if !seen.insert(modules.clone()) {
                continue;
            }
            for pkg in platform_packages() {
                let candidate = modules.join(pkg).join(binary_name());
                if is_executable_file(&candidate) {
                    return Ok(candidate);
                }
                tried.push(candidate.display().to_string());
            }
        }
    }
    if let Some(path_var) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path_var) {
            let candidate = dir.join(binary_name());
            if is_executable_file(&candidate) {
                return Ok(candidate);
            }
        }
    }
    tried.push(format!("`{}` on PATH", binary_name()));
    Err(AdapterError::new(
        ErrorCode::CliNotFound,
        format!(
            "no Claude Code executable found; looked at: {}",
            tried.join(", ")
        ),
    ))
}
