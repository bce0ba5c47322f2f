//! Non-UTF-8 text in a patch. The patch becomes a JS string, so it must be UTF-8. Paths are
//! kept ASCII by `core.quotePath=true` (git octal-escapes other bytes), but a text file whose
//! content is not UTF-8 (Latin-1, Shift-JIS, ...) would put raw bytes in a text hunk; each such
//! file's section is re-emitted as a git binary patch (`GIT binary patch` / `literal`, zlib +
//! base85, exactly what `git diff --binary` prints for a binary file), built from the blobs named
//! on its `index` line. `git apply` applies it like any binary patch, so the file still
//! round-trips byte for byte.
//!
//! The blobs are read by git where the rest of the patch was made ([`At`]: the checkout's jail,
//! within `extractionTimeout`), never by a library on the host: the agent wrote the checkout's
//! git directory, whose `objects/info/alternates` can name any path of the host, one that blocks
//! whoever opens it (a FIFO) or one the jail does not show.

use std::collections::HashMap;

use super::command::{run_with_input, At};
use crate::error::{AdapterError, Result};

/// Rewrites every file section of `patch` that is not valid UTF-8 as a binary patch.
pub(crate) async fn binarize_non_utf8(worktree: At<'_>, patch: &[u8]) -> Result<String> {
    let sections = split_sections(patch)
        .into_iter()
        .map(Section::of)
        .collect::<Result<Vec<_>>>()?;
    let mut wanted = Vec::new();
    for section in &sections {
        if let Section::NonUtf8 { old, new, .. } = section {
            wanted.extend([old.as_str(), new.as_str()]);
        }
    }
    let blobs = read_blobs(worktree, &wanted).await?;
    let mut out = String::with_capacity(patch.len() + patch.len() / 4);
    for section in &sections {
        match section {
            Section::Text(s) => out.push_str(s),
            Section::NonUtf8 { header, old, new } => {
                out.push_str(header);
                out.push_str("GIT binary patch\n");
                push_literal(&mut out, blob(&blobs, new)?);
                push_literal(&mut out, blob(&blobs, old)?);
            }
        }
    }
    Ok(out)
}

/// Splits a patch at each `diff --git ` line. Inside hunks every line starts with ' ', '+', '-',
/// '\\' or '@', and binary data lines with a length letter, so such a line is always a header.
fn split_sections(patch: &[u8]) -> Vec<&[u8]> {
    const HEADER: &[u8] = b"diff --git ";
    let mut starts = vec![0];
    let mut pos = 0;
    while let Some(nl) = patch[pos..].iter().position(|&b| b == b'\n') {
        pos += nl + 1;
        if patch[pos..].starts_with(HEADER) {
            starts.push(pos);
        }
    }
    starts.push(patch.len());
    starts.windows(2).map(|w| &patch[w[0]..w[1]]).collect()
}

/// One file's section of the patch: kept as it is, or, not being UTF-8, to be re-emitted as
/// `GIT binary patch` from its extended header lines (`diff --git`, mode, rename, `index`
/// lines: all ASCII) and literal forward and reverse images of the blobs its `index` line
/// names (`old`, `new`: full hex ids, all zeros for a side that does not exist).
enum Section<'a> {
    Text(&'a str),
    NonUtf8 {
        header: String,
        old: String,
        new: String,
    },
}

impl<'a> Section<'a> {
    fn of(section: &'a [u8]) -> Result<Section<'a>> {
        if let Ok(s) = std::str::from_utf8(section) {
            return Ok(Section::Text(s));
        }
        let mut header = String::new();
        let mut oids = None;
        for line in section.split_inclusive(|&b| b == b'\n') {
            if line.starts_with(b"--- ")
                || line.starts_with(b"@@")
                || line.starts_with(b"Binary files")
            {
                break;
            }
            let text = std::str::from_utf8(line)
                .map_err(|_| AdapterError::extract("a patch header line is not UTF-8"))?;
            if let Some(rest) = text.strip_prefix("index ") {
                let range = rest.split_whitespace().next().unwrap_or("");
                if let Some((a, b)) = range.split_once("..") {
                    oids = Some((a.to_string(), b.to_string()));
                }
            }
            header.push_str(text);
        }
        let (old, new) = oids
            .ok_or_else(|| AdapterError::extract("a non-UTF-8 diff section has no index line"))?;
        for oid in [&old, &new] {
            if !oid.bytes().all(|b| b.is_ascii_hexdigit()) || ![40, 64].contains(&oid.len()) {
                return Err(AdapterError::extract(format!(
                    "bad object id in patch: {oid}"
                )));
            }
        }
        Ok(Section::NonUtf8 { header, old, new })
    }
}

fn is_null(oid: &str) -> bool {
    oid.bytes().all(|b| b == b'0')
}

/// A side's content, from what [`read_blobs`] read: a side that does not exist (the null id)
/// is empty.
fn blob<'b>(blobs: &'b HashMap<String, Vec<u8>>, oid: &str) -> Result<&'b [u8]> {
    if is_null(oid) {
        return Ok(&[]);
    }
    blobs
        .get(oid)
        .map(Vec::as_slice)
        .ok_or_else(|| AdapterError::extract(format!("cannot read blob {oid}")))
}

/// The blobs `oids` name (the null id left out), in one `git cat-file --batch`: for each, a line
/// `<oid> <type> <size>` (or `<oid> missing`), the content, a newline.
async fn read_blobs(worktree: At<'_>, oids: &[&str]) -> Result<HashMap<String, Vec<u8>>> {
    let mut input = Vec::new();
    for oid in oids.iter().filter(|o| !is_null(o)) {
        input.extend_from_slice(oid.as_bytes());
        input.push(b'\n');
    }
    if input.is_empty() {
        return Ok(HashMap::new());
    }
    let out = run_with_input(
        worktree.git(&["cat-file", "--batch"]),
        "git cat-file --batch".into(),
        input,
    )
    .await
    .map_err(|e| {
        AdapterError::extract("cannot read the blobs of a non-UTF-8 file").with_cause(e)
    })?;
    let mut blobs = HashMap::new();
    let mut rest = out.stdout.as_slice();
    while !rest.is_empty() {
        let nl = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
        let line = String::from_utf8_lossy(&rest[..nl]).into_owned();
        let bad = || AdapterError::extract(format!("cannot read blob: git cat-file said {line}"));
        let [oid, "blob", size] = line.split(' ').collect::<Vec<_>>()[..] else {
            return Err(bad());
        };
        let size: usize = size.parse().map_err(|_| bad())?;
        let content = rest.get(nl + 1..nl + 1 + size).ok_or_else(bad)?;
        blobs.insert(oid.to_string(), content.to_vec());
        rest = rest.get(nl + 2 + size..).unwrap_or_default();
    }
    Ok(blobs)
}

/// `literal <size>` followed by the zlib stream of `data` in git's base85 lines, and a blank
/// line (git's `emit_binary_diff_body`).
fn push_literal(out: &mut String, data: &[u8]) {
    out.push_str(&format!("literal {}\n", data.len()));
    let z = zlib_stored(data);
    for chunk in z.chunks(52) {
        let n = chunk.len() as u8;
        out.push(if n <= 26 {
            (b'A' + n - 1) as char
        } else {
            (b'a' + n - 27) as char
        });
        encode_85(out, chunk);
        out.push('\n');
    }
    out.push('\n');
}

/// A zlib stream made of deflate "stored" blocks: valid for any inflater and needs no
/// compressor (this path only runs for the rare non-UTF-8 text file).
fn zlib_stored(data: &[u8]) -> Vec<u8> {
    let mut z = Vec::with_capacity(data.len() + data.len() / 65535 * 5 + 11);
    z.extend_from_slice(&[0x78, 0x01]);
    let mut chunks = data.chunks(65535).peekable();
    if chunks.peek().is_none() {
        z.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        let len = c.len() as u16;
        z.push(u8::from(last));
        z.extend_from_slice(&len.to_le_bytes());
        z.extend_from_slice(&(!len).to_le_bytes());
        z.extend_from_slice(c);
    }
    z.extend_from_slice(&adler32(data).to_be_bytes());
    z
}

fn adler32(data: &[u8]) -> u32 {
    const MOD: u32 = 65521;
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += u32::from(x);
            b += a;
        }
        a %= MOD;
        b %= MOD;
    }
    (b << 16) | a
}

/// git's base85 (`base85.c`): big-endian 4-byte groups, the last one zero-padded.
fn encode_85(out: &mut String, data: &[u8]) {
    const EN85: &[u8; 85] =
        b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";
    for group in data.chunks(4) {
        let mut acc: u32 = 0;
        for (i, &b) in group.iter().enumerate() {
            acc |= u32::from(b) << (24 - 8 * i);
        }
        let mut buf = [0u8; 5];
        for slot in buf.iter_mut().rev() {
            *slot = EN85[(acc % 85) as usize];
            acc /= 85;
        }
        out.extend(buf.iter().map(|&c| c as char));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_literal_matches_git() {
        // `git diff --binary` prints this for an empty side: "literal 0\nHcmV?d00001\n\n".
        // Ours is a different (stored) zlib stream for the same data, so check it decodes.
        let mut s = String::new();
        push_literal(&mut s, b"");
        assert!(s.starts_with("literal 0\n"));
        assert!(s.ends_with("\n\n"));
    }

    #[test]
    fn adler32_of_known_string() {
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
    }

    #[test]
    fn base85_matches_git_alphabet() {
        let mut s = String::new();
        encode_85(&mut s, &[0, 0, 0, 0]);
        assert_eq!(s, "00000");
        let mut s = String::new();
        encode_85(&mut s, &[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(s, "|NsC0");
    }

    #[test]
    fn sections_split_on_diff_headers_only() {
        let p = b"diff --git a/x b/x\n+diff --git no\ndiff --git a/y b/y\n-z\n";
        let s = split_sections(p);
        assert_eq!(s.len(), 2);
        assert!(s[1].starts_with(b"diff --git a/y"));
    }
}
