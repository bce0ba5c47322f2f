//! A session's audit record (`config.audit`): what the session was asked, every model request
//! and answer the relay saw, every tool call the hooks saw with its verdict, every host the
//! egress proxy allowed or refused, outage holds and resumes, a budget stop, and its end — one
//! JSON entry a line, each chained to the one before it by hash, written only by the engine
//! (the relay, the proxy and the hook bridge all run outside the sandbox), in `audit.dir`,
//! which no session's sandbox shows. At the end the record is sealed ([`seal`]): an in-toto
//! Statement binding it to the session's patch (or result), in a DSSE envelope signed with the
//! engine's Ed25519 key when one is configured. [`verify`] checks a record.
//!
//! A line is `{"seq":N,"time":MS,"kind":K,…fields…,"prev":P,"hash":H}`: `seq` counts from 1,
//! `time` is milliseconds since the Unix epoch, `prev` is the previous entry's `hash` (64 zeros
//! for the first), and `hash` is the SHA-256 (hex) of the line's bytes up to the `,"hash":`
//! that ends it. The hash is over bytes, not over a canonical form, so a verifier needs no
//! JSON canonicalization: any changed byte changes it. Each line is one `write` to a file
//! opened for appending, so an engine killed mid-session leaves whole lines: a valid, unsealed
//! prefix.

pub mod seal;
pub mod verify;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use crate::clock::now_ms;

pub use seal::{PublicKey, SigningKey, Subject};
pub use verify::{verify, Verdict};

/// The `prev` of the first entry.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// What every line ends with after its hashed part: `,"hash":"<64 hex>"}`.
const HASH_TAIL_LEN: usize = ",\"hash\":\"\"}".len() + 64;
/// A string in an entry (a tool's input, a command) longer than this is cut, with the full
/// value's length and SHA-256 beside it: the record stays a record, not a copy of every file
/// an agent wrote.
pub const MAX_STRING: usize = 64 * 1024;

/// `config.audit`: where records go, and the key that seals them.
#[derive(Debug, Clone)]
pub struct AuditConfig {
    pub dir: PathBuf,
    pub key: Option<Arc<SigningKey>>,
}

/// Turns text into what may be written (the session's known secrets replaced).
pub type Redactor = Box<dyn Fn(&str) -> String + Send + Sync>;
/// Told when the record could not be written (once): the session goes on without it.
pub type OnError = Box<dyn Fn(&str) + Send + Sync>;

/// One session's record, appended to from any thread (the relay's, the proxy's, the hooks').
pub struct AuditRecord {
    path: PathBuf,
    key: Option<Arc<SigningKey>>,
    redact: Redactor,
    on_error: OnError,
    chain: Mutex<Chain>,
}

struct Chain {
    /// `None` once a write failed or the record was sealed: nothing more is appended.
    file: Option<File>,
    seq: u64,
    head: String,
}

impl AuditRecord {
    /// Creates `dir/name` (which must not exist: a record is never appended to by two
    /// sessions), mode 0600.
    pub fn create(
        config: &AuditConfig,
        name: &str,
        redact: Redactor,
        on_error: OnError,
    ) -> std::io::Result<Arc<AuditRecord>> {
        std::fs::create_dir_all(&config.dir)?;
        let path = config.dir.join(name);
        let mut options = OpenOptions::new();
        options.append(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options.open(&path)?;
        Ok(Arc::new(AuditRecord {
            path,
            key: config.key.clone(),
            redact,
            on_error,
            chain: Mutex::new(Chain {
                file: Some(file),
                seq: 0,
                head: GENESIS.to_string(),
            }),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends an entry of `kind` with `fields` (an object; anything else is kept under
    /// `"value"`). Strings are redacted and bounded ([`MAX_STRING`]).
    pub fn append(&self, kind: &str, fields: Value) {
        let fields = self.bounded(fields);
        let mut chain = self.chain.lock().unwrap_or_else(|e| e.into_inner());
        self.write(&mut chain, kind, fields);
    }

    /// Appends the seal ([`seal::statement`] over the record so far and `subjects`) and closes
    /// the record: nothing is appended after it.
    pub fn seal(&self, subjects: &[Subject], predicate: Value) {
        let mut chain = self.chain.lock().unwrap_or_else(|e| e.into_inner());
        if chain.file.is_none() {
            return;
        }
        let envelope = seal::envelope(
            subjects,
            predicate,
            chain.seq,
            &chain.head,
            self.key.as_deref(),
        );
        let mut fields = Map::new();
        fields.insert("envelope".into(), envelope);
        self.write(&mut chain, "seal", Value::Object(fields));
        if let Some(file) = chain.file.take() {
            if let Err(e) = file.sync_all() {
                (self.on_error)(&format!(
                    "cannot sync the audit record {}: {e}",
                    self.path.display()
                ));
            }
        }
    }

    fn write(&self, chain: &mut Chain, kind: &str, fields: Value) {
        let Some(file) = chain.file.as_mut() else {
            return;
        };
        let seq = chain.seq + 1;
        let (line, hash) = entry_line(seq, now_ms(), kind, fields, &chain.head);
        match file.write_all(line.as_bytes()) {
            Ok(()) => {
                chain.seq = seq;
                chain.head = hash;
            }
            Err(e) => {
                // A partly written line ends the record there: what follows could not chain.
                chain.file = None;
                (self.on_error)(&format!(
                    "cannot write the audit record {} (entry {seq}, {kind}): {e}; it ends here, unsealed",
                    self.path.display()
                ));
            }
        }
    }

    /// `v` with its strings redacted and cut to [`MAX_STRING`] bytes.
    fn bounded(&self, v: Value) -> Value {
        match v {
            Value::String(s) => Value::String(bounded_string(&(self.redact)(&s))),
            Value::Array(a) => Value::Array(a.into_iter().map(|v| self.bounded(v)).collect()),
            Value::Object(o) => {
                Value::Object(o.into_iter().map(|(k, v)| (k, self.bounded(v))).collect())
            }
            other => other,
        }
    }
}

/// A string of at most [`MAX_STRING`] bytes: a longer one is cut at a character boundary and
/// says how long it was and what the whole hashed to.
fn bounded_string(s: &str) -> String {
    if s.len() <= MAX_STRING {
        return s.to_string();
    }
    let mut end = MAX_STRING;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{} … [cut: {} bytes in all, sha256 {}]",
        &s[..end],
        s.len(),
        sha256_hex(s.as_bytes())
    )
}

/// One entry's line (newline included) and its hash.
fn entry_line(seq: u64, time: u64, kind: &str, fields: Value, prev: &str) -> (String, String) {
    let mut entry = Map::new();
    entry.insert("seq".into(), seq.into());
    entry.insert("time".into(), Value::from(time));
    entry.insert("kind".into(), kind.into());
    let fields = match fields {
        Value::Object(o) => o,
        Value::Null => Map::new(),
        other => Map::from_iter([("value".to_string(), other)]),
    };
    for (k, v) in fields {
        // The chain's own fields are not an entry's to set.
        if !matches!(k.as_str(), "seq" | "time" | "kind" | "prev" | "hash") {
            entry.insert(k, v);
        }
    }
    entry.insert("prev".into(), prev.into());
    let text = Value::Object(entry).to_string();
    // The object without its closing brace is what is hashed; the hash closes it.
    let hashed = &text[..text.len() - 1];
    let hash = sha256_hex(hashed.as_bytes());
    (format!("{hashed},\"hash\":\"{hash}\"}}\n"), hash)
}

/// The SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

/// A running SHA-256 over bytes that come in pieces (a streamed answer).
pub struct Digest(ring::digest::Context);

impl Default for Digest {
    fn default() -> Self {
        Digest(ring::digest::Context::new(&ring::digest::SHA256))
    }
}

impl Digest {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> String {
        hex(self.0.finish().as_ref())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(dir: &Path, key: Option<Arc<SigningKey>>) -> Arc<AuditRecord> {
        let config = AuditConfig {
            dir: dir.to_path_buf(),
            key,
        };
        AuditRecord::create(
            &config,
            "r.audit.jsonl",
            Box::new(|s| s.replace("s3cret-value", "[REDACTED]")),
            Box::new(|e| panic!("{e}")),
        )
        .unwrap()
    }

    #[test]
    fn each_line_chains_to_the_one_before_and_hashes_its_own_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let r = record(dir.path(), None);
        r.append("start", json!({ "role": "planner" }));
        r.append(
            "tool_use",
            json!({ "name": "Bash", "input": { "command": "ls" } }),
        );
        let text = std::fs::read_to_string(r.path()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        let first: Value = serde_json::from_str(lines[0]).unwrap();
        let second: Value = serde_json::from_str(lines[1]).unwrap();
        assert_eq!(first["seq"], 1);
        assert_eq!(first["prev"], GENESIS);
        assert_eq!(second["prev"], first["hash"]);
        let hashed = &lines[0][..lines[0].len() - HASH_TAIL_LEN];
        assert_eq!(first["hash"], sha256_hex(hashed.as_bytes()));
        assert_eq!(second["input"]["command"], "ls");
    }

    #[test]
    fn the_chain_fields_cannot_be_set_by_an_entry_and_secrets_and_huge_strings_are_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let r = record(dir.path(), None);
        let huge = "x".repeat(MAX_STRING * 2);
        r.append(
            "tool_use",
            json!({ "seq": 99, "prev": "forged", "hash": "forged", "input": { "command": "echo s3cret-value" }, "content": huge }),
        );
        let line = std::fs::read_to_string(r.path()).unwrap();
        let entry: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(entry["seq"], 1);
        assert_eq!(entry["prev"], GENESIS);
        assert_eq!(entry["input"]["command"], "echo [REDACTED]");
        let content = entry["content"].as_str().unwrap();
        assert!(content.len() < MAX_STRING + 200, "{}", content.len());
        assert!(content.contains(&format!("{} bytes in all", MAX_STRING * 2)));
        assert!(!line.contains("s3cret-value"));
    }

    #[test]
    fn a_record_is_never_opened_twice_and_nothing_is_appended_after_its_seal() {
        let dir = tempfile::tempdir().unwrap();
        let r = record(dir.path(), None);
        let again = AuditRecord::create(
            &AuditConfig {
                dir: dir.path().to_path_buf(),
                key: None,
            },
            "r.audit.jsonl",
            Box::new(str::to_string),
            Box::new(|_| {}),
        );
        assert!(again.is_err());
        r.append("start", json!({}));
        r.seal(&[Subject::sha256("result", b"{}")], json!({}));
        r.append("late", json!({}));
        let text = std::fs::read_to_string(r.path()).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text.lines().last().unwrap().contains("\"kind\":\"seal\""));
    }
}
