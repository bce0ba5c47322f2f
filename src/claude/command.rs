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

/// `process.env` merged with `config.env`, minus what the SDK also strips: `NODE_OPTIONS`
/// (the CLI is not our Node) and `DEBUG` (it would turn on the CLI's own debug output).
pub fn build_env(
    base: impl IntoIterator<Item = (String, String)>,
    overrides: &[(String, String)],
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = base
        .into_iter()
        .filter(|(k, _)| k != "NODE_OPTIONS" && k != "DEBUG")
        .collect();
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
