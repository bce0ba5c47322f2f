//! The oldest git this crate works with, checked once when an adapter is created so an older
//! git fails with a message that says why instead of every Implementor start failing on some
//! unknown option. 2.30 is Debian 11's git; everything the crate runs is in it (worktree
//! listing and the `post-checkout` hook are read/run from git's own files, not the 2.36 CLI).

use crate::error::{AdapterError, ErrorCode, Result};

use super::command::{git_command, run};

/// The minimum git version, `(major, minor)`.
pub const MIN_GIT_VERSION: (u32, u32) = (2, 30);

/// Runs `git --version` and fails with `ERR_PROVISION` naming the minimum when git is missing,
/// older than [`MIN_GIT_VERSION`], or says something that is not a version. A success is
/// remembered for the life of the process (git is not downgraded under a running engine).
pub async fn check_git_version() -> Result<()> {
    static CHECKED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    CHECKED.get_or_try_init(check_once).await.map(|_| ())
}

async fn check_once() -> Result<()> {
    let (major, minor) = MIN_GIT_VERSION;
    let need = format!("git {major}.{minor} or newer is required");
    let out = run(
        git_command(&std::env::temp_dir(), &["--version"]),
        "git --version".into(),
    )
    .await
    .map_err(|e| {
        AdapterError::new(
            ErrorCode::Provision,
            format!("{need}; `git --version` failed"),
        )
        .with_cause(e)
    })?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match parse_version(&text) {
        Some(v) if v >= MIN_GIT_VERSION => Ok(()),
        Some(_) => Err(AdapterError::new(
            ErrorCode::Provision,
            format!("{need}; the git on PATH is older: `{text}`"),
        )),
        None => Err(AdapterError::new(
            ErrorCode::Provision,
            format!("{need}; cannot read the version of the git on PATH from `{text}`"),
        )),
    }
}

/// `(major, minor)` from "git version 2.39.3 (Apple Git-146)", "git version 2.45.1.windows.1".
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let v = text
        .strip_prefix("git version ")?
        .split_whitespace()
        .next()?;
    let mut parts = v.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_every_vendor_format() {
        assert_eq!(parse_version("git version 2.30.2"), Some((2, 30)));
        assert_eq!(
            parse_version("git version 2.39.3 (Apple Git-146)"),
            Some((2, 39))
        );
        assert_eq!(parse_version("git version 2.45.1.windows.1"), Some((2, 45)));
        assert_eq!(parse_version("hub version 2.14"), None);
        assert!(parse_version("git version 2.29.0").unwrap() < MIN_GIT_VERSION);
    }
}
