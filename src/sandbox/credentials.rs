//! What counts as a credential: the home directory's credential stores (absent from a
//! session's private home, unreadable to the CLI's own read tools) and the environment
//! variables that carry secrets (never passed into a sandbox).

use std::path::PathBuf;

/// Credential stores under the home directory that agent commands may not read.
pub const HOME_CREDENTIALS: &[&str] = &[
    ".ssh",
    ".aws",
    ".azure",
    ".gnupg",
    ".kube",
    ".docker/config.json",
    ".config/gcloud",
    ".config/gh",
    ".config/hub",
    ".config/git/credentials",
    ".git-credentials",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".claude/.credentials.json",
];

/// True for names that carry secrets by convention; such variables are unset for agent
/// commands (the CLI itself keeps them, e.g. the model API key).
pub fn is_credential_var(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    const MARKERS: &[&str] = &[
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "API_KEY",
        "APIKEY",
        "PRIVATE_KEY",
        "ACCESS_KEY",
    ];
    n.starts_with("ANTHROPIC_") && n != "ANTHROPIC_BASE_URL"
        || n.ends_with("_KEY")
        || n.ends_with("_AUTH")
        || MARKERS.iter().any(|m| n.contains(m))
}

/// Where the credential stores of the CLI's environment are (existing or not): its `HOME`'s
/// [`HOME_CREDENTIALS`] and the Claude login of its `CLAUDE_CONFIG_DIR`. Agent commands may not
/// read them (`denyRead`), nor may the CLI's own read tools ([`super::ReadGuard`]).
pub fn credential_stores(cli_env: &[(String, String)]) -> Vec<PathBuf> {
    let home = env_value(cli_env, "HOME").map(PathBuf::from);
    let config_dir = env_value(cli_env, "CLAUDE_CONFIG_DIR").map(PathBuf::from);
    home.iter()
        .flat_map(|h| HOME_CREDENTIALS.iter().map(move |c| h.join(c)))
        .chain(config_dir.map(|d| d.join(".credentials.json")))
        .collect()
}

pub fn env_value<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
    env.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_credentials_and_conventional_secrets_are_scrubbed_but_not_ordinary_vars() {
        for secret in [
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_AUTH_TOKEN",
            "CLAUDE_CODE_OAUTH_TOKEN",
            "GITHUB_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "NPM_AUTH",
            "DB_PASSWORD",
        ] {
            assert!(is_credential_var(secret), "{secret}");
        }
        for plain in [
            "PATH",
            "HOME",
            "GIT_AUTHOR_NAME",
            "ANTHROPIC_BASE_URL",
            "LANG",
            "KEYBOARD",
            "TMPDIR",
        ] {
            assert!(!is_credential_var(plain), "{plain}");
        }
    }
}
