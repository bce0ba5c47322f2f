//! The end of an Implementor on a layer reads only what changed (issue 37).
//!
//! [`super::patch`] stages the whole checkout: `update-index --really-refresh` and `git add -A`
//! stat every file through the overlay (100,000 files: seconds), although the agent wrote a
//! few. On a layer the candidates are known: every path the agent wrote, created or deleted
//! is in the layer's `upper/` (a deletion as a whiteout), and every path whose index entry it
//! changed differs from the base's index, which every layer starts from. Everywhere else the
//! checkout is the base, and the full staging's answer there is what it would be for an agent
//! that did nothing — which is verified once per base ([`verify`]): that staging, run as an
//! extraction runs it (jailed, on a layer with nothing written, the same index and racy-clean
//! limit) gives exactly the snapshot tree. So the final tree is the snapshot's outside the
//! candidates, and, for them, what `git add -A` limited to them stages into a copy of the
//! agent's index; written by `write-tree` and compared with the snapshot by `git diff-tree`,
//! as on the full path, its records go through the same code as before
//! ([`super::patch::patch_of_changes`]), so the patch is byte-identical whenever the tree is.
//!
//! What it costs at 100,000 files is the index (8 MiB), not the tree: the three git steps run
//! by one fixed script in one jail (one bubblewrap, one overlay mount; [`stage_candidates`]);
//! the agent's index is read in place, not listed by git ([`super::index_file`]); git's
//! re-reading of every racily clean file each time it writes an index is avoided where it
//! changes no answer ([`keep_racy_answers`]); and when the setup changed no tracked file the
//! final tree is the patch's target itself, where the full path builds it again in an index
//! of the whole base tree.
//!
//! Why the per-path answer is the same. `git add -A` decides each path by its index entry, its
//! file and the rules that apply to it (attributes, ignores, config); limited by a pathspec it
//! makes the same decision for the paths it covers and leaves the others alone. Outside the
//! candidates the entry is the base's (compared field by field: stat data, flags, mode, oid,
//! stage, as the index file stores them), the file is the base's, and the rules are the
//! base's, which is checked: the layer's git dir holds nothing that changes them (its config
//! byte for byte the base's, no `info/` file, nothing git reads that the layer did not start
//! with), no candidate is a `.gitignore`, `.gitattributes` or `.gitmodules` (their rules reach
//! beyond the path), and the host's git config and version are those of the verification. The
//! one input left is the racy-clean limit: the copy of the index gets the agent's index's
//! mtime capped before the snapshot ([`super::patch::stat_trust_limit`]); a limit other than
//! the verification's changes nothing when no entry is racy under one and not the other, or
//! when every entry that could be is one whose content is its oid (checked at verification).
//!
//! Where the setup changed a tracked file or left untracked output, the snapshot holds it and
//! the base's index (the layer's, outside the candidates) does not: the limited staging's
//! final tree then differs from the full one there, and its records set such a path as the
//! index has it. The patch lays records on the base commit ([`super::patch::patch_of_changes`]),
//! so that is no change as long as the index is the commit's tree, which is verified too: the
//! full staging lays nothing there (it finds the path as the snapshot has it), the limited one
//! lays the commit's own entry. A setup that staged into the index fails that, and its base's
//! layers take the full path.
//!
//! A directory of the base the agent removed is a whiteout in `upper/`, one it made anew is
//! marked opaque (`user.overlay.opaque`, the overlay being mounted with `userxattr`): either is
//! a candidate as a whole, as a new directory is.
//!
//! Everything that is not proven so — a gitlink anywhere, an entry marked assume-unchanged,
//! skip-worktree or intent-to-add or unmerged, a nested `.git`, an entry of `upper/` with
//! extended attributes other than overlayfs's bookkeeping and a directory's opaque mark, a
//! directory of the base with another mode, an index git would read otherwise than
//! [`super::index_file`] does, an index mtime set back before the verification's, a git that
//! fails or complains — makes
//! the extraction take the full path ([`super::patch::agent_patch`]), as it does while a base
//! is not verified yet. The layer's git dir is the agent's: on the host it is only listed and
//! compared (no symlink followed) and its index read as bytes (every length checked); git
//! reads it in the jail, with the hardening of every extraction ([`super::command`]'s
//! `NEUTRALISED`: no fsmonitor, hooks or transport, stat data trusted no further than git's
//! racy-clean rule), the agent's paths passed on stdin, never in the script's text.

use std::collections::BTreeMap;
use std::path::Path;

use super::command::{neutral_git_sh, run_with_input, At};
use super::layer::Layer;
use super::patch::{
    diff, git_with_index, index_path, patch_of_changes, records_of_raw_diff, stage_all, tree_of,
    unix_now, write_tree, Snapshot, TempIndex,
};
use crate::error::Result;
use layer_diff::index_file::{self, CE_INTENT_TO_ADD, CE_SKIP_WORKTREE, CE_VALID, GITLINK_MODE};
use layer_diff::upper::{
    changed_paths, git_dir_as_made, nul_list, smudge_racy, staging, upper_candidates, MadeAs,
    RootGit,
};

/// What the verification of a base established (module docs).
#[derive(Debug)]
pub(crate) struct Verified {
    /// The base's index, as every layer over it starts with it.
    index: Vec<u8>,
    /// The mtime (seconds, nanoseconds) of the verification's copy of the index.
    limit: (i64, i64),
    /// Every entry at or after `limit`'s second holds its content's oid: a later limit
    /// changes nothing.
    later_limit_ok: bool,
    /// The host's git as the verification saw it (system config and attributes, version).
    host: Vec<u8>,
    /// The base's config, which a layer's must still be.
    config: Vec<u8>,
    /// The base's commit and its tree (see [`from_layer`]'s use of them).
    base_commit: String,
    base_tree: String,
}

/// One entry of `git ls-files --stage --debug -z`.
struct Entry {
    path: Vec<u8>,
    mode: String,
    oid: String,
    stage: String,
    mtime: i64,
    flags: u32,
    /// The stat data git compares with the file, but the device: it differs between two
    /// mounts of one overlay (the agent's git rewrites racy entries with its mount's), and
    /// leaving it out changes no answer — git does not compare it unless built with
    /// `USE_STDEV`, and then it finds every entry changed in every mount and compares all by
    /// content, whatever the entry says.
    stat: String,
}

/// Parses `git ls-files --stage --debug -z`: `<mode> <oid> <stage>\t<path>\0` then five
/// `\n`-ended lines of stat data (ctime, mtime, dev/ino, uid/gid, size/flags).
fn parse_listing(out: &[u8]) -> Option<Vec<Entry>> {
    let mut entries = Vec::new();
    let mut chunks = out.split(|&b| b == 0);
    let mut head = chunks.next()?.to_vec();
    for chunk in chunks {
        // The stat lines of the entry `head` names, then the next entry's head.
        let mut at = 0;
        for _ in 0..5 {
            at += chunk.get(at..)?.iter().position(|&b| b == b'\n')? + 1;
        }
        let (stat, next) = chunk.split_at(at);
        let tab = head.iter().position(|&b| b == b'\t')?;
        let meta = std::str::from_utf8(&head[..tab]).ok()?;
        let mut f = meta.split(' ');
        let (mode, oid, stage) = (f.next()?, f.next()?, f.next()?);
        let stat_text = std::str::from_utf8(stat).ok()?;
        let mut lines = stat_text.lines();
        let _ctime = lines.next()?;
        let mtime = lines
            .next()?
            .trim()
            .strip_prefix("mtime: ")?
            .split(':')
            .next()?
            .parse()
            .ok()?;
        let all: Vec<&str> = stat_text.lines().collect();
        let [ctime, mtime_line, dev_ino, ids, size_flags] = all[..] else {
            return None;
        };
        let (size, flags) = size_flags.split_once("\tflags: ")?;
        let flags = u32::from_str_radix(flags.trim(), 16).ok()?;
        let ino = dev_ino.split_once('\t')?.1;
        let stat_key = format!("{ctime}\n{mtime_line}\n{ino}\n{ids}\n{size}");
        entries.push(Entry {
            path: head[tab + 1..].to_vec(),
            mode: mode.to_string(),
            oid: oid.to_string(),
            stage: stage.to_string(),
            mtime,
            flags,
            stat: stat_key,
        });
        head = next.to_vec();
    }
    head.is_empty().then_some(entries)
}

/// `git ls-files --stage --debug -z` of `index`, parsed; None: git failed or said something
/// this does not read.
async fn listing(at: At<'_>, index: &Path) -> Option<Vec<Entry>> {
    let out = git_with_index(
        at.git(&["ls-files", "--stage", "--debug", "-z"]),
        index,
        "git ls-files --stage --debug -z",
    )
    .await
    .ok()?;
    parse_listing(&out)
}

/// The mtime of a file as (seconds, nanoseconds).
fn mtime_of(path: &Path) -> Option<(i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).ok()?;
    Some((m.mtime(), m.mtime_nsec()))
}

/// What of the host git reads in every jail: its system config and attributes, and which git
/// it is.
async fn host_git() -> Vec<u8> {
    let mut out = Vec::new();
    for f in ["/etc/gitconfig", "/etc/gitattributes"] {
        out.extend_from_slice(f.as_bytes());
        match std::fs::read(f) {
            Ok(b) => out.extend_from_slice(&b),
            Err(e) => out.extend_from_slice(format!("({:?})", e.kind()).as_bytes()),
        }
        out.push(0);
    }
    if let Ok(v) = super::command::run_git(Path::new("/"), &["--version"]).await {
        out.extend_from_slice(&v.stdout);
    }
    out
}

/// Verifies the base of `layer` (a layer with nothing written, made for this, its checkout at
/// `at`): the extraction's staging there must give the snapshot's tree (module docs). None
/// when it does not, or anything on the way is not as expected: the base's layers then take
/// the full path.
pub(crate) async fn verify(
    at: At<'_>,
    layer: &Layer,
    commit: &str,
    snapshot: &Snapshot,
) -> Option<Verified> {
    let started = unix_now() as i64;
    let base_tree = tree_of(at, commit).await?;
    let host = host_git().await;
    let git_dir = layer.git_dir();
    // The base's index is the commit's tree (module docs: where the snapshot and it differ).
    let own = TempIndex::copy_of(&git_dir.join("index"), None).ok()?;
    if write_tree(at, &own.path).await.ok()? != base_tree {
        tracing::debug!(base = %layer.base.display(), "the base's layers take the full extraction: its index is not the commit's tree (its setup staged into it)");
        return None;
    }
    let index = std::fs::read(git_dir.join("index")).ok()?;
    let config = std::fs::read(git_dir.join("config")).ok()?;
    let limit_secs = super::patch::stat_trust_limit(Some(snapshot.taken));
    let temp = TempIndex::copy_of(&git_dir.join("index"), Some(limit_secs)).ok()?;
    let limit = mtime_of(&temp.path)?;
    let before = listing(at, &temp.path).await?;
    let tree = stage_all(at, &temp.path).await.ok()?;
    if tree != snapshot.tree {
        tracing::debug!(base = %layer.base.display(), "the base's layers take the full extraction: an untouched layer does not stage to the snapshot");
        return None;
    }
    // The base's index as this reads it, which must be what git lists.
    let parsed = index_file::entries(&index)?;
    let same = parsed.len() == before.len()
        && parsed.iter().zip(&before).all(|(p, b)| {
            p.path == b.path
                && format!("{:o}", p.mode) == b.mode
                && p.oid_hex() == b.oid
                && p.stage().to_string() == b.stage
        });
    if !same {
        return None;
    }
    let after = listing(at, &temp.path).await?;
    let plain = |e: &Entry| {
        e.stage == "0"
            && e.mode != format!("{GITLINK_MODE:o}")
            && e.flags & (CE_VALID | CE_INTENT_TO_ADD | CE_SKIP_WORKTREE) == 0
    };
    if !before.iter().chain(&after).all(plain) {
        return None;
    }
    let staged: BTreeMap<&[u8], &Entry> = after.iter().map(|e| (e.path.as_slice(), e)).collect();
    // Which entries a limit can decide: those whose stat data matches their file (staging
    // left it as it was); the others are compared by content whatever the limit. Each one
    // racy under the verification's limit was compared by content: whether its content is
    // its oid is known, and when it is, no limit changes its answer.
    let later_limit_ok = before.iter().filter(|e| e.mtime >= limit.0).all(|e| {
        staged
            .get(e.path.as_slice())
            .is_some_and(|s| s.stat != e.stat || (s.mode == e.mode && s.oid == e.oid))
    });
    // An entry of the checkout's last second is racy here also when the staging reads the
    // index it rewrote (stamped `started` or later), and may not be in a later extraction:
    // the same answer only if its content is its oid.
    if !later_limit_ok && before.iter().any(|e| e.mtime >= started) {
        return None;
    }
    Some(Verified {
        index,
        limit,
        later_limit_ok,
        host,
        config,
        base_commit: commit.to_string(),
        base_tree,
    })
}

/// The agent's patch read from its layer (module docs); None: not provably the full
/// staging's, the caller takes the full path. Errors only where the full path would fail the
/// same way (the agent's index unreadable).
pub(crate) async fn patch_from_layer(
    at: At<'_>,
    layer: &Layer,
    verified: &Verified,
    base: &str,
    snapshot: &Snapshot,
    trust_before: u64,
) -> Result<Option<String>> {
    let index = index_path(at)?;
    let temp = TempIndex::copy_of(&index, Some(trust_before))?;
    Ok(from_layer(at, layer, verified, base, snapshot, &index, &temp.path).await)
}

async fn from_layer(
    at: At<'_>,
    layer: &Layer,
    v: &Verified,
    base: &str,
    snapshot: &Snapshot,
    index: &Path,
    temp: &Path,
) -> Option<String> {
    let git_dir = layer.git_dir();
    let mut alternates = layer
        .base
        .join(".git/objects")
        .into_os_string()
        .into_encoded_bytes();
    alternates.push(b'\n');
    let made = MadeAs {
        config: &v.config,
        alternates: Some(&alternates),
        empty_info: true,
    };
    if host_git().await != v.host || git_dir_as_made(&git_dir, &made).is_err() {
        return None;
    }
    // The racy-clean limit (module docs).
    let limit = mtime_of(temp)?;
    if !(limit == v.limit || (limit > v.limit && v.later_limit_ok)) {
        return None;
    }
    // What the agent's index changed.
    let mine = std::fs::read(temp).ok()?;
    let entries = index_file::entries(&mine)?;
    let changed = match mine == v.index {
        true => Vec::new(),
        false => changed_paths(&entries, &index_file::entries(&v.index)?)?,
    };
    let upper = layer.dir.join("upper");
    let mut pointer = b"gitdir: ".to_vec();
    pointer.extend_from_slice(git_dir.as_os_str().as_encoded_bytes());
    pointer.push(b'\n');
    let cands = upper_candidates(&upper, &layer.base, RootGit::Pointer(&pointer))?;
    let in_base = |p: &[u8]| {
        use std::os::unix::ffi::OsStrExt;
        std::fs::symlink_metadata(layer.base.join(std::ffi::OsStr::from_bytes(p))).is_ok()
    };
    let staging = staging(cands, changed, in_base, &entries)?;
    // Nothing changed: the snapshot's tree is the final one, as the full staging finds.
    if staging.candidates == 0 {
        return Some(String::new());
    }
    // A path with something tracked at or under it (a deleted directory whose name a rule
    // ignores) is staged, and should `git add` then refuse it, the extraction falls back.
    let ignored = if staging.untracked.is_empty() {
        std::collections::BTreeSet::new()
    } else {
        // Nothing of these is in the index, so it need not be read (100,000 entries: 8 MiB).
        let cmd = at.git(&["check-ignore", "--no-index", "-z", "--stdin"]);
        let names = nul_list(staging.untracked.iter());
        match run_with_input(cmd, "git check-ignore --no-index".into(), names).await {
            Ok(out) => out
                .stdout
                .split(|&b| b == 0)
                .filter(|p| !p.is_empty())
                .map(<[u8]>::to_vec)
                .collect(),
            // 1: none is ignored.
            Err(e) if e.code == Some(1) => std::collections::BTreeSet::new(),
            Err(_) => return None,
        }
    };
    // (Nothing untracked has an entry under it: only the tracked ones can be racy.)
    keep_racy_answers(temp, &mine, &entries, &staging.tracked, limit)?;
    let staged: Vec<&Vec<u8>> = staging
        .tracked
        .iter()
        .chain(staging.untracked.iter().filter(|p| !ignored.contains(*p)))
        .collect();
    let (tree, changes) = stage_candidates(at, temp, &snapshot.tree, &staged).await?;
    if changes.is_empty() {
        return Some(String::new());
    }
    // With no tracked change of the setup's (the snapshot is the base commit's tree), the
    // base's tree with the agent's changes applied — what `patch_of_changes` builds in an
    // index of the whole tree — is the final tree itself: every entry outside the changes is
    // the snapshot's, that is the base's, and both trees were written by `write-tree`.
    if v.base_commit == base && v.base_tree == snapshot.tree {
        return diff(at, base, &tree).await.ok();
    }
    patch_of_changes(at, index, base, changes).await.ok()
}

/// Writes the copy of the agent's index at `temp` (read as `data`) as [`smudge_racy`] makes it
/// and stamps it now: writing it is then cheap, and staging `paths` decides as under `limit`.
fn keep_racy_answers(
    temp: &Path,
    data: &[u8],
    entries: &[index_file::Entry<'_>],
    paths: &[Vec<u8>],
    limit: (i64, i64),
) -> Option<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let out = smudge_racy(data, entries, paths, limit)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(temp)
        .ok()?;
    f.write_all(&out).ok()?;
    f.set_modified(std::time::SystemTime::now()).ok()
}

/// Stages `paths` (none: the index is taken as it is) into the copy of the agent's index at
/// `temp`, writes the final tree and lists how it differs from `snapshot`, in one jail (one
/// bubblewrap, one overlay mount; the paths on stdin): the final tree and the records
/// [`patch_of_changes`] takes. `index.skipHash`: the copy is written twice and read by
/// nothing else, so its checksum over 8 MiB (100,000 entries) is not worth computing.
async fn stage_candidates(
    at: At<'_>,
    temp: &Path,
    snapshot: &str,
    paths: &[&Vec<u8>],
) -> Option<(String, Vec<u8>)> {
    let g = neutral_git_sh();
    let script = format!(
        "set -e; if [ \"$1\" = add ]; then {g} -c index.skipHash=true --literal-pathspecs add \
         -A --pathspec-from-file=- --pathspec-file-nul; fi; t=$({g} -c index.skipHash=true \
         write-tree); echo \"$t\"; {g} diff-tree -r -z --no-renames \"$2\" \"$t\""
    );
    let add = if paths.is_empty() { "-" } else { "add" };
    let mut cmd = at.sh(&script, &[add.into(), snapshot.into()]);
    cmd.env("GIT_INDEX_FILE", temp);
    let out = run_with_input(
        cmd,
        "git add -A (candidates); git write-tree; git diff-tree (snapshot..final)".into(),
        nul_list(paths.iter().copied()),
    )
    .await
    .ok()?;
    let newline = out.stdout.iter().position(|&b| b == b'\n')?;
    let tree = std::str::from_utf8(&out.stdout[..newline]).ok()?;
    if tree.is_empty() || !tree.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let changes = records_of_raw_diff(&out.stdout[newline + 1..]).ok()?;
    Some((tree.to_string(), changes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_with_newlines_in_names_is_read_entry_by_entry() {
        // (`dev` and `ino` are separated by a tab, as are `size` and `flags`.)
        let stat = "  ctime: 1:2\n  mtime: 3:4\n  dev: 5\tino: 6\n  uid: 7\tgid: 8\n  size: 9\tflags: 8000\n";
        let mut out = Vec::new();
        out.extend_from_slice(b"100644 e69de29bb2d1d6434b8b29ae775ad8c2e48c5391 0\ta\nb");
        out.push(0);
        out.extend_from_slice(stat.as_bytes());
        out.extend_from_slice(b"120000 e69de29bb2d1d6434b8b29ae775ad8c2e48c5391 0\tc");
        out.push(0);
        out.extend_from_slice(stat.as_bytes());
        let e = parse_listing(&out).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].path, b"a\nb");
        assert_eq!(e[0].mtime, 3);
        assert_eq!(e[0].flags, CE_VALID);
        assert_eq!(e[1].mode, "120000");
        assert_eq!(e[1].path, b"c");
        assert!(parse_listing(b"garbage").is_none_or(|e| e.is_empty()));
    }
}
