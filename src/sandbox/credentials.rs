//! What counts as a credential: the home directory's credential stores (absent from a
//! session's private home, unreadable to the CLI's own read tools) and the environment
//! variables that carry secrets (never passed into a sandbox).

use std::path::PathBuf;

use crate::process::env_value;

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

/// Variables naming a model provider's credential file (Google's key file, the AWS shared
/// files, a web identity token): the file is hidden in the sandbox and unreadable to the CLI's
/// read tools, wherever it is.
const CREDENTIAL_FILE_VARS: &[&str] = &[
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AZURE_FEDERATED_TOKEN_FILE",
    // The key of a client certificate for the telemetry collector.
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_LOGS_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
];

/// Claude Code's settings under `ANTHROPIC_` that carry no secret (the model choice, the Vertex
/// project): they pass into the sandbox. Every other `ANTHROPIC_` variable is taken for a
/// secret (the keys, tokens, `ANTHROPIC_CUSTOM_HEADERS`).
const ANTHROPIC_SETTINGS: &[&str] = &[
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL_AWS_REGION",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_VERTEX_PROJECT_ID",
];

/// True for names that carry secrets by convention; such variables are unset for agent
/// commands (the CLI itself keeps them, e.g. the model API key).
pub fn is_credential_var(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    if ANTHROPIC_SETTINGS.contains(&n.as_str()) {
        return false;
    }
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
    n.starts_with("ANTHROPIC_")
        || CREDENTIAL_FILE_VARS.contains(&n.as_str())
        || n.ends_with("_KEY")
        || n.ends_with("_AUTH")
        // Header lists carry a service's credential (`OTEL_EXPORTER_OTLP_HEADERS`: the
        // collector's, added outside by the telemetry forwarder).
        || n.ends_with("_HEADERS")
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
        .chain(provider_credential_files(cli_env))
        .collect()
}

/// The credential files [`CREDENTIAL_FILE_VARS`] name, in the CLI's environment or the
/// engine's own (where the relay's credential sources look).
pub fn provider_credential_files(cli_env: &[(String, String)]) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = CREDENTIAL_FILE_VARS
        .iter()
        .flat_map(|k| {
            let engine = std::env::var_os(k).map(PathBuf::from);
            env_value(cli_env, k)
                .map(PathBuf::from)
                .into_iter()
                .chain(engine)
        })
        .filter(|p| p.is_absolute())
        .collect();
    files.sort();
    files.dedup();
    files
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
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
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
