//! Checking a record (`verifyAuditRecord`, `cra-verify-audit`): every line whole and hashing to
//! its `hash`, numbered in order and chained to the one before; a seal only at the end, over
//! exactly the entries before it, signed by the given key, naming the given patch.
//!
//! What `ok` proves: with a `publicKey` and `sealed`, that the engine holding the key wrote the
//! record as it is, to its end. Without a key, only that the entries chain — anyone able to
//! rewrite the whole file could rewrite a consistent chain. An unsealed record (its engine
//! stopped mid-session, or the end cut off) is a valid prefix at best: whoever needs the whole
//! story requires `sealed`.

use std::io::BufRead;
use std::path::Path;

use serde_json::Value;

use super::seal::{self, PublicKey};
use super::{sha256_hex, GENESIS, HASH_TAIL_LEN};

/// What a check found; `first_bad` is the sequence number (the position, counting from 1) of
/// the first entry that fails, `reason` says why in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub ok: bool,
    pub sealed: bool,
    pub entries: u64,
    pub first_bad: Option<u64>,
    pub reason: Option<String>,
}

/// Checks the record at `path`. `Err`: the arguments are wrong (no such file, a key that is
/// not an Ed25519 PEM SPKI); a record that fails is an `Ok` verdict saying where and why.
pub fn verify(
    path: &Path,
    public_key: Option<&str>,
    patch: Option<&str>,
) -> Result<Verdict, String> {
    let key = public_key
        .map(PublicKey::from_pem)
        .transpose()
        .map_err(|e| format!("publicKey {e}"))?;
    let file = std::fs::File::open(path)
        .map_err(|e| format!("cannot read the audit record {}: {e}", path.display()))?;
    let mut reader = std::io::BufReader::new(file);
    let mut check = Check {
        key: key.as_ref(),
        patch,
        prev: GENESIS.to_string(),
        entries: 0,
        sealed: false,
    };
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("cannot read the audit record {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        let seq = check.entries + 1;
        if let Err(reason) = check.entry(seq, &line) {
            return Ok(Verdict {
                ok: false,
                sealed: check.sealed,
                entries: check.entries,
                first_bad: Some(seq),
                reason: Some(reason),
            });
        }
        check.entries = seq;
    }
    let reason = match (patch, check.sealed, check.entries) {
        (_, _, 0) => Some("the record has no entries".to_string()),
        (Some(_), false, _) => Some(
            "the record is not sealed (its session did not end, or its end was cut off), so it names no patch".to_string(),
        ),
        _ => None,
    };
    Ok(Verdict {
        ok: reason.is_none(),
        sealed: check.sealed,
        entries: check.entries,
        first_bad: None,
        reason,
    })
}

struct Check<'a> {
    key: Option<&'a PublicKey>,
    patch: Option<&'a str>,
    /// The hash the next entry must name as its `prev`.
    prev: String,
    entries: u64,
    sealed: bool,
}

impl Check<'_> {
    fn entry(&mut self, seq: u64, line: &[u8]) -> Result<(), String> {
        if self.sealed {
            return Err(format!(
                "entry {seq} comes after the seal, which must be the last"
            ));
        }
        let Some(line) = line.strip_suffix(b"\n") else {
            return Err(format!(
                "entry {seq} is cut short (no end of line): written when its engine stopped, or cut"
            ));
        };
        let text = std::str::from_utf8(line).map_err(|_| format!("entry {seq} is not UTF-8"))?;
        let entry: Value = serde_json::from_str(text)
            .map_err(|e| format!("entry {seq} is not a JSON object: {e}"))?;
        let hash = entry
            .get("hash")
            .and_then(Value::as_str)
            .filter(|h| h.len() == 64)
            .ok_or_else(|| format!("entry {seq} has no hash"))?;
        let hashed = text
            .len()
            .checked_sub(HASH_TAIL_LEN)
            .map(|end| &text[..end])
            .filter(|h| text[h.len()..] == format!(",\"hash\":\"{hash}\"}}"))
            .ok_or_else(|| format!("entry {seq} does not end with its hash"))?;
        if sha256_hex(hashed.as_bytes()) != hash {
            return Err(format!(
                "entry {seq} was changed: its bytes no longer hash to the hash it was written with"
            ));
        }
        match entry.get("seq").and_then(Value::as_u64) {
            Some(n) if n == seq => {}
            Some(n) => {
                return Err(format!(
                    "entry {seq} is missing or out of place: entry {n} is where it should be"
                ))
            }
            None => return Err(format!("entry {seq} has no sequence number")),
        }
        if entry.get("prev").and_then(Value::as_str) != Some(self.prev.as_str()) {
            return Err(format!(
                "entry {seq} does not chain to the entry before it (an entry before it was removed, replaced or moved)"
            ));
        }
        if entry.get("kind").and_then(Value::as_str).is_none()
            || entry.get("time").and_then(Value::as_u64).is_none()
        {
            return Err(format!("entry {seq} has no kind or time"));
        }
        if entry["kind"] == "seal" {
            self.seal(seq, &entry)?;
            self.sealed = true;
        }
        self.prev = hash.to_string();
        Ok(())
    }

    fn seal(&self, seq: u64, entry: &Value) -> Result<(), String> {
        let envelope = entry
            .get("envelope")
            .ok_or_else(|| format!("the seal (entry {seq}) has no envelope"))?;
        let opened = seal::open(envelope, self.key)?;
        let statement = &opened.statement;
        if statement["_type"] != seal::STATEMENT_TYPE
            || statement["predicateType"] != seal::PREDICATE_TYPE
        {
            return Err(format!(
                "the seal (entry {seq}) is not this adapter's in-toto statement"
            ));
        }
        let record = &statement["predicate"]["record"];
        if record["entries"].as_u64() != Some(seq - 1)
            || record["head"].as_str() != Some(self.prev.as_str())
        {
            return Err(format!(
                "the seal (entry {seq}) is over another record: it names {} entries ending in {}, the record has {} ending in {}",
                record["entries"], record["head"], seq - 1, self.prev
            ));
        }
        match opened.verified {
            Some(false) if !opened.signed => {
                return Err(format!("the seal (entry {seq}) is not signed"))
            }
            Some(false) => {
                return Err(format!(
                    "the seal's signature (entry {seq}) does not verify with the given public key"
                ))
            }
            _ => {}
        }
        if let Some(patch) = self.patch {
            let named = statement["subject"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|s| s["name"] == "patch")
                .and_then(|s| s["digest"]["sha256"].as_str())
                .ok_or_else(|| format!("the seal (entry {seq}) names no patch"))?;
            if named != sha256_hex(patch.as_bytes()) {
                return Err(format!(
                    "the seal (entry {seq}) names another patch: sha256 {named}, the given one is {}",
                    sha256_hex(patch.as_bytes())
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::super::seal::tests::{public_pem, PRIVATE};
    use super::super::{AuditConfig, AuditRecord, SigningKey, Subject};
    use super::*;

    const PATCH: &str = "diff --git a/x b/x\n";

    /// A sealed record of five entries and the seal; the key's public half as PEM.
    fn sealed(dir: &Path, signed: bool) -> (std::path::PathBuf, String) {
        let key = Arc::new(SigningKey::from_pem(PRIVATE).unwrap());
        let config = AuditConfig {
            dir: dir.to_path_buf(),
            key: signed.then(|| key.clone()),
        };
        let r = AuditRecord::create(
            &config,
            "s.audit.jsonl",
            Box::new(str::to_string),
            Box::new(|e| panic!("{e}")),
        )
        .unwrap();
        for i in 0..5 {
            r.append("tool_use", json!({ "n": i }));
        }
        r.seal(
            &[Subject::sha256("patch", PATCH.as_bytes())],
            json!({ "sessionID": "s" }),
        );
        (r.path().to_path_buf(), public_pem(&key))
    }

    fn lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| format!("{l}\n"))
            .collect()
    }

    fn rewrite(path: &Path, lines: &[String]) {
        std::fs::write(path, lines.concat()).unwrap();
    }

    #[test]
    fn a_whole_signed_record_verifies_with_its_key_and_its_patch() {
        let dir = tempfile::tempdir().unwrap();
        let (path, public) = sealed(dir.path(), true);
        let v = verify(&path, Some(&public), Some(PATCH)).unwrap();
        assert_eq!(
            v,
            Verdict {
                ok: true,
                sealed: true,
                entries: 6,
                first_bad: None,
                reason: None
            }
        );
    }

    #[test]
    fn each_kind_of_tampering_names_the_first_bad_entry() {
        let dir = tempfile::tempdir().unwrap();
        let (path, public) = sealed(dir.path(), true);
        let original = lines(&path);
        let check = |ls: &[String], patch: Option<&str>| {
            rewrite(&path, ls);
            verify(&path, Some(&public), patch).unwrap()
        };
        // One byte changed in entry 3.
        let mut changed = original.clone();
        changed[2] = changed[2].replacen("\"n\":2", "\"n\":7", 1);
        let v = check(&changed, None);
        assert_eq!((v.ok, v.first_bad), (false, Some(3)), "{v:?}");
        assert!(v.reason.unwrap().contains("was changed"));
        // Entry 2 removed.
        let mut removed = original.clone();
        removed.remove(1);
        let v = check(&removed, None);
        assert_eq!((v.ok, v.first_bad), (false, Some(2)), "{v:?}");
        // Entries 3 and 4 swapped.
        let mut swapped = original.clone();
        swapped.swap(2, 3);
        let v = check(&swapped, None);
        assert_eq!((v.ok, v.first_bad), (false, Some(3)), "{v:?}");
        // Another patch.
        let v = check(&original, Some("diff --git a/y b/y\n"));
        assert_eq!((v.ok, v.first_bad), (false, Some(6)), "{v:?}");
        assert!(v.reason.unwrap().contains("another patch"));
        // The whole record again: fine.
        assert!(check(&original, Some(PATCH)).ok);
    }

    #[test]
    fn a_record_rechained_by_someone_without_the_key_fails_its_signature() {
        let dir = tempfile::tempdir().unwrap();
        let (path, public) = sealed(dir.path(), true);
        // Rewritten from entry 3 on, every hash recomputed, the old seal kept: the chain holds
        // up to the seal, whose statement names the old head.
        let mut ls = lines(&path);
        let mut prev = serde_json::from_str::<Value>(&ls[1]).unwrap()["hash"]
            .as_str()
            .unwrap()
            .to_string();
        for (i, l) in ls.iter_mut().enumerate().skip(2) {
            let mut e: serde_json::Map<String, Value> = serde_json::from_str(l).unwrap();
            e.remove("hash");
            e.insert("prev".into(), prev.clone().into());
            if i == 2 {
                e.insert("n".into(), 99.into());
            }
            let body = Value::Object(e).to_string();
            let hashed = &body[..body.len() - 1];
            prev = sha256_hex(hashed.as_bytes());
            *l = format!("{hashed},\"hash\":\"{prev}\"}}\n");
        }
        rewrite(&path, &ls);
        let v = verify(&path, Some(&public), None).unwrap();
        assert_eq!((v.ok, v.first_bad), (false, Some(6)), "{v:?}");
    }

    #[test]
    fn an_unsigned_record_fails_against_a_key_and_a_prefix_verifies_unsealed() {
        let dir = tempfile::tempdir().unwrap();
        let (path, public) = sealed(dir.path(), false);
        let v = verify(&path, Some(&public), None).unwrap();
        assert_eq!((v.ok, v.first_bad), (false, Some(6)));
        assert!(v.reason.unwrap().contains("not signed"));
        assert!(verify(&path, None, Some(PATCH)).unwrap().ok);
        // The engine killed after entry 4: a valid, unsealed prefix (which names no patch).
        let ls = lines(&path);
        rewrite(&path, &ls[..4]);
        let v = verify(&path, Some(&public), None).unwrap();
        assert_eq!(
            v,
            Verdict {
                ok: true,
                sealed: false,
                entries: 4,
                first_bad: None,
                reason: None
            }
        );
        assert!(!verify(&path, None, Some(PATCH)).unwrap().ok);
        // A line cut in its middle.
        let mut cut = ls[..4].concat();
        cut.push_str(&ls[4][..20]);
        std::fs::write(&path, cut).unwrap();
        let v = verify(&path, None, None).unwrap();
        assert_eq!((v.ok, v.first_bad), (false, Some(5)));
    }

    #[test]
    fn wrong_arguments_are_errors_not_verdicts() {
        let dir = tempfile::tempdir().unwrap();
        assert!(verify(&dir.path().join("none"), None, None)
            .unwrap_err()
            .contains("cannot read"));
        let (path, _) = sealed(dir.path(), true);
        assert!(verify(&path, Some("x"), None)
            .unwrap_err()
            .starts_with("publicKey"));
    }
}
