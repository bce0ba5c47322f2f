//! What the Rust benches share: each bench is a crate of its own, so each says `mod support;`.

use std::path::Path;
use std::process::Command;

/// The environment variable `name` as a number (a bench's size: `BENCH_N`, `BENCH_FILES`, …),
/// else `default` (unset or not a number).
pub fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs git in `dir`: its stdout, or a panic with git's stderr.
#[allow(dead_code)] // not every bench runs git
pub fn git(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
