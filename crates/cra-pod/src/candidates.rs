//! The end of a session layered on the node's base reads only what changed (issue 37), as a
//! local layer's does (`src/git/layer_patch.rs`, whose module docs say why a `git add -A`
//! limited to the candidates stages what the whole one would, with the `layer-diff` crate's
//! one copy of the reading):
//!
//! - `cra-pod candidates LAYERFILE LIMIT`, in the pod outside the jail (the layer's `upper/`
//!   is not in it): reads the layer's `upper/` and the agent's index against the base's, and
//!   writes to stdout either `full` (the whole checkout is to be staged; why on stderr) or
//!   `layered` and three sized parts: the agent's index prepared for the limited staging (its
//!   racily clean entries under the candidates smudged against LIMIT, the trust limit of the
//!   snapshot as the full staging caps the index's mtime at it), the tracked candidates and
//!   the untracked ones (NUL-separated). It is given a base the engine verified when it was
//!   made: every file of it holds its entry's content, and its index's tree is the snapshot's.
//! - `cra-pod receive DIR`, in the jail: that stream from stdin into `DIR/index`,
//!   `DIR/tracked` and `DIR/untracked`; exits 3 for `full` or anything else.
//! - `cra-pod pathspecs DIR`, in the jail: the tracked candidates and the untracked ones
//!   `DIR/ignored` (`git check-ignore`'s answer) does not name, NUL-separated on stdout.
//!
//! Everything read is the agent's: the parts are sized and bounded, and anything unexpected is
//! `full`, after which the jail stages the whole checkout as before.

use std::io::{BufRead, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use layer_diff::index_file;
use layer_diff::upper::{
    changed_paths, git_dir_as_made, read_at_most, read_regular, smudge_racy, staging,
    upper_candidates, MadeAs, RootGit,
};

/// The largest index read (git's for ~10 million paths).
const MAX_INDEX: u64 = 1 << 30;
/// The largest list of candidates passed on.
const MAX_LIST: u64 = 256 << 20;

/// `cra-pod candidates LAYERFILE LIMIT` (module docs).
pub fn candidates(args: &[String]) -> ! {
    let [file, limit] = args else {
        eprintln!("usage: cra-pod candidates LAYERFILE LIMIT");
        std::process::exit(2)
    };
    let mut out = std::io::stdout().lock();
    let answer = limit
        .parse::<i64>()
        .map_err(|_| format!("the limit {limit:?} is not a number of seconds"))
        .and_then(|limit| prepared(Path::new(file), limit));
    let written = match answer {
        Ok(p) => {
            eprintln!(
                "cra-pod candidates: {} path(s) staged from the layer ({} tracked, {} untracked)",
                p.tracked.len() + p.untracked.len(),
                p.tracked.len(),
                p.untracked.len()
            );
            out.write_all(b"layered\n")
                .and_then(|_| part(&mut out, &p.index))
                .and_then(|_| part(&mut out, &p.tracked_list()))
                .and_then(|_| part(&mut out, &p.untracked_list()))
        }
        Err(why) => {
            eprintln!("cra-pod candidates: the whole checkout is staged: {why}");
            out.write_all(b"full\n")
        }
    };
    let _ = written.and_then(|_| out.flush());
    std::process::exit(0)
}

fn part(out: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    writeln!(out, "{}", bytes.len())?;
    out.write_all(bytes)
}

/// What the limited staging is given.
struct Prepared {
    index: Vec<u8>,
    tracked: Vec<Vec<u8>>,
    untracked: Vec<Vec<u8>>,
}

impl Prepared {
    fn tracked_list(&self) -> Vec<u8> {
        layer_diff::upper::nul_list(self.tracked.iter())
    }
    fn untracked_list(&self) -> Vec<u8> {
        layer_diff::upper::nul_list(self.untracked.iter())
    }
}

/// The candidates of the layer FILE describes, or why the whole checkout is to be staged.
fn prepared(file: &Path, trust: i64) -> Result<Prepared, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let get = |key: &str| crate::node_base::layer_field(&text, key).map(Path::new);
    let (Some(lower), Some(upper)) = (get("lower"), get("upper")) else {
        return Err("the checkout is not an overlay".into());
    };
    let base_index = read_at_most(&lower.join(".git/index"), MAX_INDEX)
        .ok_or("the base's index cannot be read")?;
    let base_entries = index_file::entries(&base_index).ok_or("the base's index is not read")?;
    let base_config =
        read_regular(&lower.join(".git/config")).ok_or("the base's config cannot be read")?;
    let upper_git = upper.join(".git");
    // The agent's git dir holds nothing that changes how git stages.
    if std::fs::symlink_metadata(&upper_git).is_ok() {
        let made = MadeAs {
            config: &base_config,
            alternates: None,
            empty_info: false,
        };
        git_dir_as_made(&upper_git, &made).map_err(|what| {
            format!("the agent's git dir holds what changes how git stages: {what}")
        })?;
    }
    // The agent's index: its git's copy in the layer, or the base's where it wrote none.
    let index_path = match std::fs::symlink_metadata(upper_git.join("index")) {
        Ok(_) => upper_git.join("index"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => lower.join(".git/index"),
        Err(e) => return Err(format!("the agent's index: {e}")),
    };
    let meta = std::fs::symlink_metadata(&index_path).map_err(|e| e.to_string())?;
    // (The base's, already read, where the agent's git wrote none: 8 MiB at 100,000 files.)
    let mine = match index_path.starts_with(upper) {
        true => read_at_most(&index_path, MAX_INDEX).ok_or("the agent's index cannot be read")?,
        false => base_index.clone(),
    };
    // The full staging's limit: the index's mtime, capped at the snapshot's trust limit.
    let limit = match meta.mtime() <= trust {
        true => (meta.mtime(), meta.mtime_nsec()),
        false => (trust, 0),
    };
    let entries = index_file::entries(&mine).ok_or("the agent's index is not read")?;
    let changed = changed_paths(&entries, &base_entries)
        .ok_or("an entry of the agent's index is marked, unmerged or a gitlink")?;
    let cands = upper_candidates(upper, lower, RootGit::Dir)
        .ok_or("the layer holds what a limited staging does not handle")?;
    let in_base =
        |p: &[u8]| std::fs::symlink_metadata(lower.join(std::ffi::OsStr::from_bytes(p))).is_ok();
    let staging = staging(cands, changed, in_base, &entries)
        .ok_or("a changed entry's rules reach beyond its path")?;
    let index = smudge_racy(&mine, &entries, &staging.tracked, limit)
        .ok_or("an entry is racily clean in a way git decides by how it was built")?;
    Ok(Prepared {
        index,
        tracked: staging.tracked,
        untracked: staging.untracked,
    })
}

/// `cra-pod receive DIR` (module docs).
pub fn receive(args: &[String]) -> ! {
    let [dir] = args else {
        eprintln!("usage: cra-pod receive DIR");
        std::process::exit(2)
    };
    let mut input = std::io::stdin().lock();
    let mut head = Vec::new();
    let layered =
        (&mut input).take(16).read_until(b'\n', &mut head).is_ok() && head == b"layered\n";
    if !layered {
        std::process::exit(3)
    }
    let dir = Path::new(dir);
    let received = std::fs::create_dir(dir).is_ok()
        && [
            ("index", MAX_INDEX),
            ("tracked", MAX_LIST),
            ("untracked", MAX_LIST),
        ]
        .iter()
        .all(|(name, max)| {
            read_part(&mut input, *max)
                .is_some_and(|bytes| std::fs::write(dir.join(name), bytes).is_ok())
        });
    std::process::exit(if received { 0 } else { 3 })
}

/// One sized part: its length on a line, then its bytes.
fn read_part(input: &mut impl BufRead, max: u64) -> Option<Vec<u8>> {
    let mut line = Vec::new();
    input.take(24).read_until(b'\n', &mut line).ok()?;
    let len: u64 = std::str::from_utf8(line.strip_suffix(b"\n")?)
        .ok()?
        .parse()
        .ok()?;
    if len > max {
        return None;
    }
    let mut bytes = Vec::new();
    input.take(len).read_to_end(&mut bytes).ok()?;
    (bytes.len() as u64 == len).then_some(bytes)
}

/// `cra-pod pathspecs DIR` (module docs).
pub fn pathspecs(args: &[String]) -> ! {
    let [dir] = args else {
        eprintln!("usage: cra-pod pathspecs DIR");
        std::process::exit(2)
    };
    let dir = Path::new(dir);
    let read = |name: &str| std::fs::read(dir.join(name));
    let (Ok(tracked), Ok(untracked)) = (read("tracked"), read("untracked")) else {
        std::process::exit(3)
    };
    let ignored = read("ignored").unwrap_or_default();
    let ignored: std::collections::BTreeSet<&[u8]> = ignored
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .collect();
    let mut out = tracked;
    for p in untracked.split(|&b| b == 0).filter(|p| !p.is_empty()) {
        if !ignored.contains(p) {
            out.extend_from_slice(p);
            out.push(0);
        }
    }
    let mut stdout = std::io::stdout().lock();
    let ok = stdout.write_all(&out).and_then(|_| stdout.flush()).is_ok();
    std::process::exit(if ok { 0 } else { 3 })
}
