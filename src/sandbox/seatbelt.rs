//! macOS: bubblewrap does not exist there, so the agent's commands run in Claude Code's own
//! Seatbelt sandbox, configured through `--settings` (the README's "macOS" paragraph).

use super::credential_stores;
use crate::config::SandboxConfig;

/// The CLI's `--settings` argument. Writes: the working directory and `allowWrite`; reads: not
/// the credential stores; network: `allowedDomains` through the CLI's proxy; no command may
/// run unsandboxed, and a CLI that cannot sandbox fails instead of running without.
pub fn seatbelt_settings(cfg: &SandboxConfig, cli_env: &[(String, String)]) -> String {
    let deny_read: Vec<String> = credential_stores(cli_env)
        .into_iter()
        .filter(|p| p.exists())
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let allow_write: Vec<String> = cfg
        .allow_write
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let settings = serde_json::json!({ "sandbox": {
        "enabled": true,
        "failIfUnavailable": true,
        "allowUnsandboxedCommands": false,
        "network": { "allowedDomains": cfg.allowed_domains },
        "filesystem": { "allowWrite": allow_write, "denyRead": deny_read },
    }});
    format!("--settings={settings}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn settings(cfg: &SandboxConfig, env: &[(String, String)]) -> serde_json::Value {
        let arg = seatbelt_settings(cfg, env);
        let json = arg.strip_prefix("--settings=").expect(&arg);
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn seatbelt_settings_fail_closed_with_the_configs_domains_and_writes_and_no_credential_reads() {
        let home = tempfile::tempdir().unwrap();
        let config = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".ssh")).unwrap();
        std::fs::write(home.path().join(".netrc"), "machine x").unwrap();
        std::fs::write(config.path().join(".credentials.json"), "{}").unwrap();
        let env = vec![
            ("HOME".to_string(), home.path().display().to_string()),
            (
                "CLAUDE_CONFIG_DIR".to_string(),
                config.path().display().to_string(),
            ),
        ];
        let cfg = SandboxConfig {
            allowed_domains: vec!["registry.npmjs.org".into(), "*.github.com".into()],
            allow_write: vec![PathBuf::from("/var/cache/build")],
            allow_read: vec![PathBuf::from("/opt/data")],
            ..SandboxConfig::default()
        };
        let s = settings(&cfg, &env);
        let path = |p: PathBuf| p.display().to_string();
        assert_eq!(
            s,
            serde_json::json!({ "sandbox": {
                "enabled": true,
                "failIfUnavailable": true,
                "allowUnsandboxedCommands": false,
                "network": { "allowedDomains": ["registry.npmjs.org", "*.github.com"] },
                "filesystem": {
                    "allowWrite": ["/var/cache/build"],
                    // Only the stores that exist (the others cannot be read anyway).
                    "denyRead": [
                        path(home.path().join(".ssh")),
                        path(home.path().join(".netrc")),
                        path(config.path().join(".credentials.json")),
                    ],
                },
            }})
        );
        // The default config: sandbox on, no network beyond the model API, nothing extra.
        let s = settings(&SandboxConfig::default(), &[]);
        assert_eq!(s["sandbox"]["enabled"], true);
        assert_eq!(
            s["sandbox"]["network"]["allowedDomains"],
            serde_json::json!([])
        );
        assert_eq!(
            s["sandbox"]["filesystem"]["allowWrite"],
            serde_json::json!([])
        );
        assert_eq!(
            s["sandbox"]["filesystem"]["denyRead"],
            serde_json::json!([])
        );
    }
}
