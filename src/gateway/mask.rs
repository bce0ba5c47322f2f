//! Every secret the relay knows (the placeholders' secrets, the gateway's headers, the
//! provider's current credentials) masked in what goes back to the CLI: each occurrence
//! becomes as many `*`, in headers and bodies, streamed ones too, also when a secret is split
//! across chunks.

use std::sync::Arc;

/// Where `needle` first occurs in `haystack`.
pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Every header value of `headers` with `secrets` masked (a value masking leaves invalid is
/// emptied).
pub(crate) fn mask_headers(headers: &mut http::HeaderMap, secrets: &Arc<Vec<Vec<u8>>>) {
    for value in headers.values_mut() {
        let masked = Masker::new(secrets.clone()).push(value.as_bytes(), true);
        if masked != value.as_bytes() {
            *value = http::HeaderValue::from_bytes(&masked)
                .unwrap_or(http::HeaderValue::from_static(""));
        }
    }
}

/// Masks secrets in a stream of chunks: each occurrence becomes as many `*`, so lengths (and a
/// `Content-Length`) stay right. A chunk's end that may be the start of a secret is held until
/// the next chunk says whether it is.
pub(crate) struct Masker {
    secrets: Arc<Vec<Vec<u8>>>,
    held: Vec<u8>,
}

impl Masker {
    pub(crate) fn new(secrets: Arc<Vec<Vec<u8>>>) -> Self {
        Masker {
            secrets,
            held: Vec::new(),
        }
    }

    /// The masked bytes that are settled after `chunk`; `last` settles everything.
    pub(crate) fn push(&mut self, chunk: &[u8], last: bool) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        while i < buf.len() {
            let rest = &buf[i..];
            if let Some(secret) = self.secrets.iter().find(|s| rest.starts_with(s)) {
                out.resize(out.len() + secret.len(), b'*');
                i += secret.len();
                continue;
            }
            if !last
                && self
                    .secrets
                    .iter()
                    .any(|s| s.len() > rest.len() && s.starts_with(rest))
            {
                self.held = rest.to_vec();
                break;
            }
            out.push(buf[i]);
            i += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masking_holds_back_only_what_may_begin_a_secret() {
        let mut m = Masker::new(Arc::new(vec![b"secret".to_vec()]));
        assert_eq!(m.push(b"a sec", false), b"a ");
        assert_eq!(m.push(b"re", false), b"");
        assert_eq!(m.push(b"t, se", false), b"******, ");
        assert_eq!(m.push(b"x", false), b"sex");
        assert_eq!(m.push(b"secre", false), b"");
        assert_eq!(m.push(b"", true), b"secre");
    }
}
