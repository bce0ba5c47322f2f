//! The CLI's argv and environment, built the way the official SDK builds them for the spec's
//! `query()` options (flags written `--flag=value`, stream-json both ways, no `-p`).

use serde_json::Value;

pub struct CliArgs<'a> {
    pub role: &'a str,
    pub schema: &'a Value,
    pub max_turns: Option<u32>,
    pub model: Option<&'a str>,
    pub session_id: &'a str,
}

pub fn build_args(a: &CliArgs<'_>) -> Vec<String> {
    let mut args = vec![
        "--output-format".to_string(),
        "stream-json".to_string(),
        "--verbose".to_string(),
        "--input-format".to_string(),
        "stream-json".to_string(),
    ];
    if let Some(n) = a.max_turns {
        args.push(format!("--max-turns={n}"));
    }
    if let Some(m) = a.model {
        args.push(format!("--model={m}"));
    }
    args.push(format!("--agent={}", a.role));
    args.push(format!("--json-schema={}", a.schema));
    // Empty value = load no settings at all (user, project and local are all skipped): the
    // adapter supplies agents, context, hooks and permissions itself (spec: Known Limitations).
    args.push("--setting-sources=".to_string());
    args.push("--permission-mode=bypassPermissions".to_string());
    args.push("--allow-dangerously-skip-permissions".to_string());
    args.push(format!("--session-id={}", a.session_id));
    args
}

/// `args` of a session's CLI changed to continue its conversation (`--resume`, which keeps the
/// session id and reads the conversation from the CLI's config dir) instead of starting it,
/// with `--max-turns` lowered by the `used` turns of the runs before: a resumed run never gets
/// more turns than were left. `None` when none are left.
pub fn resume_args(args: &[String], used: u64) -> Option<Vec<String>> {
    args.iter()
        .map(|a| {
            if let Some(id) = a.strip_prefix("--session-id=") {
                return Some(format!("--resume={id}"));
            }
            match a.strip_prefix("--max-turns=").map(str::parse::<u64>) {
                Some(Ok(max)) => {
                    let left = max.checked_sub(used).filter(|l| *l > 0)?;
                    Some(format!("--max-turns={left}"))
                }
                _ => Some(a.clone()),
            }
        })
        .collect()
}

/// Whether a CLI `result` says the run ended at a limit of its own (its turns, its budget, its
/// structured output retries) rather than on a failure: such a run is not resumed, whatever
/// the API did before it.
pub fn ended_at_own_limit(subtype: &str) -> bool {
    matches!(
        subtype,
        "error_max_turns" | "error_max_budget_usd" | "error_max_structured_output_retries"
    )
}

/// Variables of the engine's own environment the CLI gets; everything else stays with the
/// engine (its tokens and keys above all). The CLI needs a usable system environment (paths,
/// user, locale, terminal, temp dir, TLS trust, the proxy the host sits behind) and its own
/// configuration (`ANTHROPIC_*`, `CLAUDE_*`, `IS_SANDBOX`); `config.env` adds the rest.
/// Names compare case-insensitively (Windows spells them as it likes).
pub const ENV_ALLOWLIST: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "COLORTERM",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "TMP",
    "TEMP",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    "IS_SANDBOX",
    // A model provider's settings that name no secret (its credentials stay with the engine,
    // where the relay's credential sources read them).
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "CLOUD_ML_REGION",
    // Windows: without these, processes cannot start or find their profile.
    "SYSTEMROOT",
    "WINDIR",
    "COMSPEC",
    "PATHEXT",
    "USERPROFILE",
    "USERNAME",
    "APPDATA",
    "LOCALAPPDATA",
    "PROGRAMDATA",
    "PROGRAMFILES",
    "PROGRAMFILES(X86)",
    "HOMEDRIVE",
    "HOMEPATH",
];
/// Prefixes allowed as well: locale categories, the CLI's own settings, Vertex AI's region per
/// model.
pub const ENV_ALLOWED_PREFIXES: &[&str] = &["LC_", "ANTHROPIC_", "CLAUDE_", "VERTEX_REGION_"];

pub fn env_allowed(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ENV_ALLOWLIST.contains(&upper.as_str())
        || ENV_ALLOWED_PREFIXES.iter().any(|p| upper.starts_with(p))
}

/// The allowlisted part of `base` (the engine's `process.env`) with `config.env` on top.
/// `NODE_OPTIONS` and `DEBUG` are not on the list, as the SDK strips them too (the CLI is not
/// our Node; `DEBUG` would turn on the CLI's own debug output), unless `config.env` sets them.
pub fn build_env(
    base: impl IntoIterator<Item = (String, String)>,
    overrides: &[(String, String)],
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = base.into_iter().filter(|(k, _)| env_allowed(k)).collect();
    for (k, v) in overrides {
        env.retain(|(ek, _)| ek != k);
        env.push((k.clone(), v.clone()));
    }
    if !env.iter().any(|(k, _)| k == "CLAUDE_CODE_ENTRYPOINT") {
        // The CLI tailors SDK-mode behaviour to its entrypoint; we speak the same protocol as
        // the TypeScript SDK, so we announce the same one.
        env.push(("CLAUDE_CODE_ENTRYPOINT".into(), "sdk-ts".into()));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_run_gets_only_the_turns_that_were_left() {
        let schema = serde_json::json!({"type": "object"});
        let args = build_args(&CliArgs {
            role: "implementor",
            schema: &schema,
            max_turns: Some(10),
            model: None,
            session_id: "s1",
        });
        let resumed = resume_args(&args, 4).unwrap();
        assert!(
            resumed.contains(&"--max-turns=6".to_string()),
            "{resumed:?}"
        );
        assert!(resumed.contains(&"--resume=s1".to_string()));
        assert!(!resumed.iter().any(|a| a.starts_with("--session-id")));
        assert_eq!(resume_args(&args, 10), None);
        assert_eq!(resume_args(&args, 12), None);
        // Without a turn limit there is nothing to lower.
        let unlimited = build_args(&CliArgs {
            role: "implementor",
            schema: &schema,
            max_turns: None,
            model: None,
            session_id: "s1",
        });
        let resumed = resume_args(&unlimited, 40).unwrap();
        assert!(!resumed.iter().any(|a| a.starts_with("--max-turns")));
        assert!(ended_at_own_limit("error_max_turns"));
        assert!(!ended_at_own_limit("error_during_execution"));
        assert!(!ended_at_own_limit("success"));
    }

    #[test]
    fn max_turns_and_model_only_when_given() {
        let schema = serde_json::json!({"type": "object"});
        let without = build_args(&CliArgs {
            role: "planner",
            schema: &schema,
            max_turns: None,
            model: None,
            session_id: "s",
        });
        assert!(!without
            .iter()
            .any(|a| a.starts_with("--max-turns") || a.starts_with("--model")));
        let with = build_args(&CliArgs {
            role: "planner",
            schema: &schema,
            max_turns: Some(7),
            model: Some("opus"),
            session_id: "s",
        });
        assert!(with.contains(&"--max-turns=7".to_string()));
        assert!(with.contains(&"--model=opus".to_string()));
        assert!(with.contains(&"--agent=planner".to_string()));
        assert!(with.contains(&"--setting-sources=".to_string()));
        assert!(with.contains(&r#"--json-schema={"type":"object"}"#.to_string()));
    }

    #[test]
    fn only_allowlisted_engine_variables_reach_the_cli_and_config_env_adds_any() {
        let env = build_env(
            vec![
                ("PATH".into(), "/bin".into()),
                ("LC_ALL".into(), "C".into()),
                ("ANTHROPIC_API_KEY".into(), "k".into()),
                ("GITHUB_TOKEN".into(), "t".into()),
                ("AWS_SECRET_ACCESS_KEY".into(), "s".into()),
            ],
            &[("GH_HOST".into(), "h".into())],
        );
        let keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        for k in ["PATH", "LC_ALL", "ANTHROPIC_API_KEY", "GH_HOST"] {
            assert!(keys.contains(&k), "{k} missing from {keys:?}");
        }
        for k in ["GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY"] {
            assert!(!keys.contains(&k), "{k} leaked");
        }
    }

    #[test]
    fn config_env_overrides_process_env_and_node_options_is_dropped() {
        let env = build_env(
            vec![
                ("A".into(), "1".into()),
                ("NODE_OPTIONS".into(), "--x".into()),
                ("DEBUG".into(), "*".into()),
            ],
            &[("A".into(), "2".into())],
        );
        assert_eq!(
            env.iter().filter(|(k, _)| k == "A").collect::<Vec<_>>(),
            vec![&("A".to_string(), "2".to_string())]
        );
        assert!(!env.iter().any(|(k, _)| k == "NODE_OPTIONS" || k == "DEBUG"));
    }
}
