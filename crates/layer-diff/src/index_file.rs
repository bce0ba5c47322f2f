//! The entries of a git index file, read in place (`gitformat-index(5)`): what the end of a
//! layered session compares between an agent's index and its base's, 100,000 entries in
//! milliseconds where `git ls-files --stage --debug` in a jail took a third of a second. The
//! file is the agent's: every length is checked, and anything this does not read exactly as git
//! would — another version or hash, a split or sparse index, an extension git requires and this
//! does not know, a truncated entry — is `None`, and the caller does without.

/// `ce_flags` bits (git's `cache.h`) as [`Entry::flags`] holds them: the on-disk 16-bit flags
/// in the low half, the extended ones (version 3+) shifted to where git keeps them in memory.
pub const CE_VALID: u32 = 0x8000;
pub const CE_EXTENDED: u32 = 0x4000;
pub const CE_STAGEMASK: u32 = 0x3000;
pub const CE_INTENT_TO_ADD: u32 = 1 << 29;
pub const CE_SKIP_WORKTREE: u32 = 1 << 30;
/// The bits of the 16-bit flags that hold the name's length.
const CE_NAMEMASK: u32 = 0x0fff;

/// The mode of a gitlink (a submodule's commit).
pub const GITLINK_MODE: u32 = 0o160000;

/// stat data (10 × 4 bytes), a SHA-1 oid, the 16-bit flags.
const FIXED: usize = 40 + 20 + 2;
/// Where the device number is in an entry (see [`Entry::record`]).
const DEV: std::ops::Range<usize> = 16..20;

/// One entry of the index.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    pub path: Vec<u8>,
    /// Everything git keeps of it but its path, as stored: stat data, mode, oid, flags (and
    /// extended flags) — but the device, which differs between two mounts of one overlay and
    /// which git does not compare (it would have to be built with `USE_STDEV`, and then it
    /// compares every entry by content in every mount whatever the entry says).
    pub record: [&'a [u8]; 2],
    pub mode: u32,
    pub flags: u32,
    /// Where it starts in the file.
    pub offset: usize,
}

impl Entry<'_> {
    pub fn stage(&self) -> u32 {
        (self.flags & CE_STAGEMASK) >> 12
    }

    /// The object id, in hex.
    pub fn oid_hex(&self) -> String {
        // (The oid follows the stat data: at 40 of the entry, 20 of `record[1]`.)
        self.record[1][40 - DEV.end..60 - DEV.end]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Its mtime as stored: seconds, nanoseconds.
    pub fn mtime(&self) -> (u32, u32) {
        let b = self.record[0];
        (
            u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
            u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
        )
    }
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be16(b: &[u8], at: usize) -> Option<u32> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?).into())
}

/// The entries of the index file `data` (SHA-1, version 2, 3 or 4), in its order (git's: by
/// path, then stage); `None` for anything not read exactly as git reads it (module docs). The
/// trailing checksum is not verified: git reads the same bytes and refuses them if it is
/// wrong, which makes the caller's git step fail.
pub fn entries(data: &[u8]) -> Option<Vec<Entry<'_>>> {
    if data.get(..4)? != b"DIRC" {
        return None;
    }
    let version = be32(data, 4)?;
    if !(2..=4).contains(&version) {
        return None;
    }
    let count = be32(data, 8)? as usize;
    let end = data.len().checked_sub(20)?;
    let mut at = 12;
    let mut out: Vec<Entry<'_>> = Vec::with_capacity(count.min(end / FIXED));
    let mut previous: Vec<u8> = Vec::new();
    for _ in 0..count {
        let start = at;
        let flags16 = be16(data, at + FIXED - 2)?;
        let mut flags = flags16;
        let mut fixed = FIXED;
        if flags16 & CE_EXTENDED != 0 {
            if version < 3 {
                return None;
            }
            let extended = be16(data, at + FIXED)?;
            // Only the two bits git writes (skip-worktree, intent-to-add); others: unknown.
            if extended & !0x6000 != 0 {
                return None;
            }
            flags |= extended << 16;
            fixed += 2;
        }
        at += fixed;
        let path = if version == 4 {
            // A varint of how many bytes of the previous path to drop, then the rest.
            let (drop, used) = varint(data.get(at..end)?)?;
            at += used;
            let keep = previous.len().checked_sub(drop)?;
            let len = data.get(at..end)?.iter().position(|&b| b == 0)?;
            let mut path = previous[..keep].to_vec();
            path.extend_from_slice(&data[at..at + len]);
            at += len + 1;
            path
        } else {
            let len = data.get(at..end)?.iter().position(|&b| b == 0)?;
            let path = data[at..at + len].to_vec();
            // NUL-padded to a multiple of 8 bytes, at least one NUL.
            let size = (fixed + len + 8) & !7;
            at = start + size;
            if at > end || data[start + fixed + len..at].iter().any(|&b| b != 0) {
                return None;
            }
            path
        };
        let len = path.len() as u32;
        // git takes the length from the flags (the NUL only past 0xfff); and it keeps its
        // entries sorted, one per path at stage 0 — anything else is not read here.
        if path.is_empty()
            || flags16 & CE_NAMEMASK != len.min(CE_NAMEMASK)
            || (!out.is_empty() && path <= previous)
        {
            return None;
        }
        let entry = &data[start..start + fixed];
        out.push(Entry {
            record: [&entry[..DEV.start], &entry[DEV.end..]],
            mode: be32(entry, 24)?,
            flags,
            offset: start,
            path: path.clone(),
        });
        previous = path;
    }
    // Extensions up to the checksum: those that change which entries there are (a split
    // index's `link`, a sparse index's `sdir`) or that git requires (lowercase) are not read.
    while at < end {
        let sig = data.get(at..at + 4)?;
        let size = be32(data, at + 4)? as usize;
        if sig[0].is_ascii_lowercase() {
            return None;
        }
        at = at.checked_add(8)?.checked_add(size)?;
    }
    (at == end).then_some(out)
}

/// Where an entry's file size is (from its start): git's own "smudge" of an entry it cannot
/// trust sets it to 0, after which the entry never matches its file by stat data (an entry of
/// size 0 matches only an empty file, and then only if it names the empty blob).
pub const SIZE: std::ops::Range<usize> = 36..40;

/// git's offset varint (`varint.c`): 7 bits a byte, high bit: more, each continuation adds 1.
fn varint(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    let mut c = *b.first()?;
    let mut val = usize::from(c & 0x7f);
    while c & 0x80 != 0 {
        i += 1;
        c = *b.get(i)?;
        val = val.checked_add(1)?.checked_mul(128)? | usize::from(c & 0x7f);
    }
    Some((val, i + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn git(dir: &std::path::Path, args: &[&str]) -> Vec<u8> {
        let out = Command::new("git")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        out.stdout
    }

    /// `git ls-files --stage -z`'s view: mode, oid, stage, path.
    fn as_git_lists(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in entries(data).unwrap() {
            let oid = e.oid_hex();
            out.extend_from_slice(format!("{:o} {oid} {}\t", e.mode, e.stage()).as_bytes());
            out.extend_from_slice(&e.path);
            out.push(0);
        }
        out
    }

    #[test]
    fn every_index_version_reads_as_git_lists_it() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        git(d, &["init", "-q"]);
        for (p, c) in [
            ("a", "a"),
            ("dir/b", "b"),
            ("dir/sub/long-name-shares-a-prefix", "c"),
            ("dir/sub/long-name-shares-a-prefix-too", "d"),
            ("nl\nin name", "e"),
        ] {
            let p = d.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, c).unwrap();
        }
        git(d, &["add", "-A"]);
        git(d, &["update-index", "--chmod=+x", "a"]);
        for version in ["2", "3", "4"] {
            git(d, &["update-index", "--index-version", version]);
            if version == "3" {
                git(d, &["update-index", "--skip-worktree", "dir/b"]);
            }
            let data = std::fs::read(d.join(".git/index")).unwrap();
            assert_eq!(
                as_git_lists(&data),
                git(d, &["ls-files", "--stage", "-z"]),
                "version {version}"
            );
            let e = entries(&data).unwrap();
            let b = e.iter().find(|e| e.path == b"dir/b").unwrap();
            assert_eq!(b.flags & CE_SKIP_WORKTREE != 0, version != "2");
        }
    }

    #[test]
    fn a_truncated_or_split_index_is_not_read() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        git(d, &["init", "-q"]);
        std::fs::write(d.join("a"), "a").unwrap();
        git(d, &["add", "a"]);
        let data = std::fs::read(d.join(".git/index")).unwrap();
        assert!(entries(&data).is_some());
        for cut in [1, 20, 40, data.len() - 12] {
            assert!(entries(&data[..data.len() - cut]).is_none(), "cut {cut}");
        }
        git(d, &["update-index", "--split-index"]);
        let data = std::fs::read(d.join(".git/index")).unwrap();
        assert!(entries(&data).is_none());
    }
}
