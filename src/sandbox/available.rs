//! Whether a session's sandbox can run here (Linux: the adapter's bubblewrap sandbox and its
//! socat bridges; macOS: Claude Code's Seatbelt sandbox), checked before anything is
//! provisioned so that a session that cannot be confined fails closed with nothing created.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::error::{AdapterError, ErrorCode, Result};

pub const INSTALL_HINT: &str = "apt-get install -y bubblewrap socat";

/// Checks the tools the session's sandbox needs, looked up on `path` (the `PATH` the CLI gets):
/// Linux and WSL2: `bwrap` and `socat`; macOS: `sandbox-exec` (Seatbelt, part of the OS);
/// native Windows: unsupported.
/// On Linux bubblewrap is then tried once (per binary, per process): installed is not enough
/// when the kernel or a container refuses it namespaces.
pub fn check_available(path: Option<&OsStr>) -> Result<()> {
    check_for(std::env::consts::OS, path)?;
    #[cfg(target_os = "linux")]
    if let Some(bwrap) = find_on_path("bwrap", path) {
        super::jail::probe(&bwrap)?;
    }
    Ok(())
}

fn check_for(os: &str, path: Option<&OsStr>) -> Result<()> {
    let unavailable = |msg: String| Err(AdapterError::new(ErrorCode::SandboxUnavailable, msg));
    match os {
        "linux" => {
            let missing: Vec<&str> = [("bwrap", "bubblewrap"), ("socat", "socat")]
                .iter()
                .filter(|(bin, _)| !on_path(bin, path))
                .map(|(bin, pkg)| if bin == pkg { *bin } else { "bubblewrap (bwrap)" })
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            unavailable(format!(
                "the OS sandbox for agent commands needs {} on PATH; install with `{INSTALL_HINT}` \
                 (Debian/Ubuntu), or set `sandbox: false` to run agents without it",
                missing.join(" and ")
            ))
        }
        "macos" if on_path("sandbox-exec", path) || Path::new("/usr/bin/sandbox-exec").exists() => {
            Ok(())
        }
        "macos" => unavailable(
            "the OS sandbox for agent commands needs sandbox-exec (Seatbelt, /usr/bin/sandbox-exec), \
             which was not found; set `sandbox: false` to run agents without it"
                .into(),
        ),
        other => unavailable(format!(
            "the OS sandbox for agent commands is not available on {other} (Linux, WSL2 and macOS \
             only); set `sandbox: false` to run agents without it"
        )),
    }
}

fn on_path(bin: &str, path: Option<&OsStr>) -> bool {
    find_on_path(bin, path).is_some()
}

/// The executable `bin` as `path` (a `PATH` value) finds it.
pub fn find_on_path(bin: &str, path: Option<&OsStr>) -> Option<PathBuf> {
    std::env::split_paths(path?)
        .map(|dir| dir.join(bin))
        .find(|p| is_executable(p))
}

#[cfg(unix)]
fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(p: &Path) -> bool {
    p.is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tools_are_named_with_the_install_command() {
        let empty = tempfile::tempdir().unwrap();
        let e = check_for("linux", Some(empty.path().as_os_str())).unwrap_err();
        assert_eq!(e.code, ErrorCode::SandboxUnavailable);
        assert!(
            e.message.contains("bubblewrap (bwrap) and socat"),
            "{}",
            e.message
        );
        assert!(e.message.contains(INSTALL_HINT));
        assert!(check_for("linux", None).is_err());
        assert!(check_for("windows", None)
            .unwrap_err()
            .message
            .contains("not available on windows"));
    }

    #[cfg(unix)]
    #[test]
    fn tools_found_on_path_pass() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for bin in ["bwrap", "socat"] {
            let p = dir.path().join(bin);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        check_for("linux", Some(dir.path().as_os_str())).unwrap();
        std::fs::remove_file(dir.path().join("socat")).unwrap();
        let e = check_for("linux", Some(dir.path().as_os_str())).unwrap_err();
        assert!(e.message.contains("needs socat on PATH"), "{}", e.message);
    }
}
