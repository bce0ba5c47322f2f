//! The record's seal: an in-toto Statement v1 (<https://in-toto.io/Statement/v1>) whose
//! subjects are what the session handed back (the Implementor's patch, by SHA-256, and the
//! commit its branch was made from; another role's result), and whose predicate
//! ([`PREDICATE_TYPE`]) names the session and the record it closes — its entry count and the
//! hash of its last entry, so signing the statement signs the whole chain. The statement is the
//! payload of a DSSE envelope (<https://github.com/secure-systems-lab/dsse>), signed over DSSE's
//! pre-authentication encoding with the engine's Ed25519 key; without a key the envelope has no
//! signatures (the record is then chained, not signed).

use base64::Engine as _;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivatePkcs8KeyDer, SubjectPublicKeyInfoDer};
use serde_json::{json, Value};

use super::sha256_hex;

pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// This adapter's predicate: see docs/audit.md for its fields.
pub const PREDICATE_TYPE: &str = "https://github.com/claude-runtime-adapter/audit-record/v1";
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// An Ed25519 SubjectPublicKeyInfo's DER before its 32 key bytes (RFC 8410: the sequence,
/// the algorithm id 1.3.101.112, the bit string's head).
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// The engine's Ed25519 key (`audit.signingKey`).
pub struct SigningKey {
    pair: Ed25519KeyPair,
    keyid: String,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key itself.
        write!(f, "SigningKey({})", self.keyid)
    }
}

impl SigningKey {
    /// A PEM PKCS#8 Ed25519 private key, as Node's `generateKeyPairSync('ed25519')` exports it
    /// (PKCS#8 v1, without the public key) or OpenSSL's `genpkey -algorithm ed25519` writes it.
    pub fn from_pem(pem: &str) -> Result<SigningKey, String> {
        let der = PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| format!("is not a PEM \"PRIVATE KEY\" (PKCS#8): {e}"))?;
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der())
            .map_err(|e| format!("is not an Ed25519 PKCS#8 private key: {e}"))?;
        let keyid = keyid(pair.public_key().as_ref());
        Ok(SigningKey { pair, keyid })
    }

    pub fn keyid(&self) -> &str {
        &self.keyid
    }
}

/// A key the record's signature is checked against (`verifyAuditRecord`'s `publicKey`).
#[derive(Debug)]
pub struct PublicKey {
    raw: Vec<u8>,
}

impl PublicKey {
    /// A PEM SubjectPublicKeyInfo ("PUBLIC KEY") of an Ed25519 key, as Node's
    /// `publicKey.export({ type: 'spki', format: 'pem' })` writes it.
    pub fn from_pem(pem: &str) -> Result<PublicKey, String> {
        let der = SubjectPublicKeyInfoDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| format!("is not a PEM \"PUBLIC KEY\" (SPKI): {e}"))?;
        let der = der.as_ref();
        match der.strip_prefix(&ED25519_SPKI_PREFIX[..]) {
            Some(raw) if raw.len() == 32 => Ok(PublicKey { raw: raw.to_vec() }),
            _ => Err("is not an Ed25519 public key".to_string()),
        }
    }

    fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, &self.raw)
            .verify(message, signature)
            .is_ok()
    }
}

/// The key's id in an envelope's signature: the SHA-256 of its SPKI DER (what
/// `openssl pkey -pubin -outform DER | sha256sum` prints).
fn keyid(raw: &[u8]) -> String {
    let mut der = ED25519_SPKI_PREFIX.to_vec();
    der.extend_from_slice(raw);
    sha256_hex(&der)
}

/// One subject of the statement: a name and its digests.
#[derive(Debug, Clone, PartialEq)]
pub struct Subject {
    pub name: String,
    pub digest: Vec<(&'static str, String)>,
}

impl Subject {
    /// `name` by the SHA-256 of `bytes`.
    pub fn sha256(name: &str, bytes: &[u8]) -> Subject {
        Subject {
            name: name.to_string(),
            digest: vec![("sha256", sha256_hex(bytes))],
        }
    }

    /// `name` by a git commit id.
    pub fn commit(name: &str, commit: &str) -> Subject {
        Subject {
            name: name.to_string(),
            digest: vec![("gitCommit", commit.to_string())],
        }
    }

    fn to_json(&self) -> Value {
        let digest: serde_json::Map<String, Value> = self
            .digest
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(v.as_str())))
            .collect();
        json!({ "name": self.name, "digest": digest })
    }
}

/// The statement sealing a record of `entries` entries whose last entry's hash is `head`;
/// `predicate`'s fields are the session's, `record` is added.
pub fn statement(subjects: &[Subject], mut predicate: Value, entries: u64, head: &str) -> Value {
    if !predicate.is_object() {
        predicate = json!({});
    }
    predicate["record"] = json!({ "entries": entries, "head": head });
    json!({
        "_type": STATEMENT_TYPE,
        "subject": subjects.iter().map(Subject::to_json).collect::<Vec<_>>(),
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    })
}

/// DSSE's pre-authentication encoding: what is signed.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// The DSSE envelope of the [`statement`], signed with `key` when there is one.
pub fn envelope(
    subjects: &[Subject],
    predicate: Value,
    entries: u64,
    head: &str,
    key: Option<&SigningKey>,
) -> Value {
    let payload = statement(subjects, predicate, entries, head).to_string();
    let b64 = base64::engine::general_purpose::STANDARD;
    let signatures: Vec<Value> = key
        .map(|k| {
            let sig = k.pair.sign(&pae(PAYLOAD_TYPE, payload.as_bytes()));
            json!({ "keyid": k.keyid, "sig": b64.encode(sig.as_ref()) })
        })
        .into_iter()
        .collect();
    json!({
        "payloadType": PAYLOAD_TYPE,
        "payload": b64.encode(payload.as_bytes()),
        "signatures": signatures,
    })
}

/// An envelope read back: its statement, and whether a signature in it verifies with `key`
/// (`None` without a key to check).
pub struct Opened {
    pub statement: Value,
    pub signed: bool,
    pub verified: Option<bool>,
}

/// Reads an envelope: `Err` names what is malformed.
pub fn open(envelope: &Value, key: Option<&PublicKey>) -> Result<Opened, String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let payload_type = envelope
        .get("payloadType")
        .and_then(Value::as_str)
        .ok_or("the seal's envelope has no payloadType")?;
    if payload_type != PAYLOAD_TYPE {
        return Err(format!(
            "the seal's envelope carries {payload_type:?}, not an in-toto statement"
        ));
    }
    let payload = envelope
        .get("payload")
        .and_then(Value::as_str)
        .and_then(|p| b64.decode(p).ok())
        .ok_or("the seal's envelope has no base64 payload")?;
    let statement: Value = serde_json::from_slice(&payload)
        .map_err(|e| format!("the seal's statement is not JSON: {e}"))?;
    let signatures: Vec<Vec<u8>> = envelope
        .get("signatures")
        .and_then(Value::as_array)
        .ok_or("the seal's envelope has no signatures list")?
        .iter()
        .filter_map(|s| b64.decode(s.get("sig")?.as_str()?).ok())
        .collect();
    let message = pae(payload_type, &payload);
    let verified = key.map(|k| signatures.iter().any(|s| k.verifies(&message, s)));
    Ok(Opened {
        statement,
        signed: !signatures.is_empty(),
        verified,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A key made by OpenSSL (`openssl genpkey -algorithm ed25519`): PKCS#8 v1, as Node exports
    /// too. The refused public key is an X25519 one (`genpkey -algorithm x25519`, `pkey -pubout`).
    pub(crate) const PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIB0tDPQSTGZpUWNkrnqe65Ns+2uJS49WKmHJJZsj3w4G\n-----END PRIVATE KEY-----\n";

    #[test]
    fn pae_is_dsse_v1s_encoding() {
        // The example of DSSE's protocol.md.
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
    }

    #[test]
    fn a_signed_envelope_verifies_with_its_key_only() {
        let key = SigningKey::from_pem(PRIVATE).unwrap();
        let envelope = envelope(
            &[Subject::sha256("patch", b"diff")],
            json!({ "sessionID": "s" }),
            3,
            "ab",
            Some(&key),
        );
        let public = public_of(&key);
        let opened = open(&envelope, Some(&public)).unwrap();
        assert_eq!(opened.verified, Some(true));
        assert_eq!(opened.statement["predicate"]["record"]["entries"], 3);
        assert_eq!(
            opened.statement["subject"][0]["digest"]["sha256"],
            sha256_hex(b"diff")
        );
        // Another key: not verified.
        let other = PublicKey { raw: vec![7; 32] };
        assert_eq!(open(&envelope, Some(&other)).unwrap().verified, Some(false));
        // Unsigned: no signature to verify.
        let bare = super::envelope(&[], json!({}), 1, "ab", None);
        let opened = open(&bare, Some(&public)).unwrap();
        assert!(!opened.signed);
        assert_eq!(opened.verified, Some(false));
    }

    #[test]
    fn keys_that_are_not_ed25519_pem_are_refused_naming_why() {
        assert!(SigningKey::from_pem("nonsense")
            .unwrap_err()
            .contains("PKCS#8"));
        assert!(PublicKey::from_pem("-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VuAyEAmMEwsd4upOB/u62fu3yymbMxB0IHOC+i914rUw+Z/Fc=\n-----END PUBLIC KEY-----\n")
            .unwrap_err()
            .contains("Ed25519"));
    }

    fn public_of(key: &SigningKey) -> PublicKey {
        PublicKey {
            raw: key.pair.public_key().as_ref().to_vec(),
        }
    }

    /// `key`'s public half as a PEM SPKI, as Node exports it.
    pub(crate) fn public_pem(key: &SigningKey) -> String {
        let mut der = ED25519_SPKI_PREFIX.to_vec();
        der.extend_from_slice(key.pair.public_key().as_ref());
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        format!("-----BEGIN PUBLIC KEY-----\n{b64}\n-----END PUBLIC KEY-----\n")
    }

    #[test]
    fn a_public_key_pem_reads_back_to_the_signing_keys_half() {
        let key = SigningKey::from_pem(PRIVATE).unwrap();
        assert_eq!(
            PublicKey::from_pem(&public_pem(&key)).unwrap().raw,
            public_of(&key).raw
        );
    }
}
