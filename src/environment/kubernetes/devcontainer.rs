//! The repository's own choice of image: `.devcontainer/devcontainer.json`'s `image`, read at
//! the commit the session starts from (the file a pod would check out, not the engine's working
//! tree). Only the `image` form: a devcontainer built from a Dockerfile or a compose file would
//! need a build the adapter does not do, so it is refused with a message saying so.

use std::path::Path;

use serde_json::Value;

use crate::error::{AdapterError, ErrorCode, Result};
use crate::git::command::run_git;

/// Where the repository names its image.
pub const PATH: &str = ".devcontainer/devcontainer.json";
/// Bound on the file (a devcontainer.json is a few KiB; a larger one is not read whole).
const MAX_BYTES: usize = 1 << 20;

/// The image `.devcontainer/devcontainer.json` names at `commit`; `None` when the file is not
/// there. A file that names no image (a Dockerfile or compose devcontainer) or cannot be read
/// is `ERR_PROVISION`.
pub async fn image_at(repo_root: &Path, commit: &str) -> Result<Option<String>> {
    let spec = format!("{commit}:{PATH}");
    let exists = run_git(repo_root, &["cat-file", "-e", &spec]).await.is_ok();
    if !exists {
        return Ok(None);
    }
    let out = run_git(repo_root, &["cat-file", "blob", &spec])
        .await
        .map_err(|e| refused(format!("cannot read {PATH} at {commit}")).with_cause(e))?;
    if out.stdout.len() > MAX_BYTES {
        return Err(refused(format!(
            "{PATH} at {commit} is larger than {MAX_BYTES} bytes"
        )));
    }
    image_of(&String::from_utf8_lossy(&out.stdout)).map(Some)
}

/// The `image` of a devcontainer.json's text (JSON with comments and trailing commas).
fn image_of(text: &str) -> Result<String> {
    let value: Value = serde_json::from_str(&strip_jsonc(text))
        .map_err(|e| refused(format!("{PATH} is not valid JSON (with comments): {e}")))?;
    let Some(obj) = value.as_object() else {
        return Err(refused(format!("{PATH} is not a JSON object")));
    };
    match obj.get("image") {
        Some(Value::String(image))
            if !image.is_empty() && !image.chars().any(|c| c.is_whitespace() || c.is_control()) =>
        {
            Ok(image.clone())
        }
        Some(other) => Err(refused(format!(
            "{PATH} has an \"image\" that is not an image reference: {other}"
        ))),
        None => {
            let built = ["build", "dockerFile", "dockerfile", "dockerComposeFile"]
                .into_iter()
                .find(|k| obj.contains_key(*k));
            Err(refused(match built {
                Some(key) => format!(
                    "{PATH} builds its image (\"{key}\"): the adapter does not build images; \
                     build and push it, then name it in backend.kubernetes.image (or as the \
                     devcontainer's \"image\")"
                ),
                None => format!(
                    "{PATH} names no \"image\": name one there or in backend.kubernetes.image"
                ),
            }))
        }
    }
}

fn refused(message: String) -> AdapterError {
    AdapterError::new(
        ErrorCode::Provision,
        format!("the session's image: {message}"),
    )
}

/// JSONC as devcontainer.json allows it, made JSON: `//` and `/* */` comments become spaces
/// and a comma before `}` or `]` goes; strings are left exactly as they are.
fn strip_jsonc(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let start = i;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(bytes.len());
                out.extend_from_slice(&bytes[start..i]);
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < bytes.len() && !(bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i = (i + 2).min(bytes.len());
                out.push(b' ');
            }
            b',' => {
                if !closes_after_comments(&bytes[i + 1..]) {
                    out.push(b',');
                }
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// True when `rest` is only whitespace and comments up to a `}` or `]`.
fn closes_after_comments(rest: &[u8]) -> bool {
    let mut i = 0;
    loop {
        while i < rest.len() && rest[i].is_ascii_whitespace() {
            i += 1;
        }
        match (rest.get(i), rest.get(i + 1)) {
            (Some(b'}' | b']'), _) => return true,
            (Some(b'/'), Some(b'/')) => {
                while i < rest.len() && rest[i] != b'\n' {
                    i += 1;
                }
            }
            (Some(b'/'), Some(b'*')) => {
                i += 2;
                while i < rest.len() && !(rest[i] == b'*' && rest.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i += 2;
            }
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_of_a_devcontainer_with_comments_and_trailing_commas() {
        let text = r#"// For format details, see https://aka.ms/devcontainer.json
{
  "name": "Rust // not a comment",
  /* the team's CI image */
  "image": "ghcr.io/acme/ci:1.2", // pinned
  "features": { "a": "/* not a comment either */", },
  "customizations": [1, 2, /* three */ ],
}
"#;
        assert_eq!(image_of(text).unwrap(), "ghcr.io/acme/ci:1.2");
        let stripped: Value = serde_json::from_str(&strip_jsonc(text)).unwrap();
        assert_eq!(stripped["name"], "Rust // not a comment");
        assert_eq!(stripped["features"]["a"], "/* not a comment either */");
    }

    #[test]
    fn a_devcontainer_that_builds_its_image_is_refused_naming_why() {
        let e = image_of(r#"{ "build": { "dockerfile": "Dockerfile" } }"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::Provision);
        assert!(
            e.message.contains("builds its image (\"build\")"),
            "{}",
            e.message
        );
        assert!(e.message.contains("does not build images"), "{}", e.message);
        let e = image_of(r#"{ "dockerComposeFile": "c.yml", "service": "x" }"#).unwrap_err();
        assert!(e.message.contains("\"dockerComposeFile\""), "{}", e.message);
        let e = image_of(r#"{ "name": "x" }"#).unwrap_err();
        assert!(e.message.contains("names no \"image\""), "{}", e.message);
        let e = image_of(r#"{ "image": "a b" }"#).unwrap_err();
        assert!(
            e.message.contains("not an image reference"),
            "{}",
            e.message
        );
        let e = image_of("{ \"image\": ").unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = image_of("[1]").unwrap_err();
        assert!(e.message.contains("not a JSON object"), "{}", e.message);
    }

    #[test]
    fn stripping_never_panics_on_unterminated_input() {
        for text in ["\"abc", "/* open", "// x", "{\"a\\", ",", "{,/*", "\"\\"] {
            let _ = strip_jsonc(text);
            let _ = image_of(text);
        }
    }
}
