//! The session's side of its audit record ([`crate::audit`]): opening it beside the transcript,
//! its first entries (what the session was asked, under which settings), and its end and seal.
//! The relay, the egress proxy and the hooks append their own entries as they happen.

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::audit::{sha256_hex, AuditConfig, AuditRecord, Subject};
use crate::claude::session::SessionSpec;
use crate::clock::now_ms;
use crate::config::{AdapterConfig, BackendConfig};
use crate::deps::{LogLevel, Logger};
use crate::domain::{StartOptions, StartParams};
use crate::error::{AdapterError, ErrorCode, Result};
use crate::stats::SessionStats;
use crate::transcript;

/// Opens the session's record in `audit.dir`, named as its transcript is (`.audit.jsonl`), its
/// secrets redacted as the transcript's are; a record that cannot be made stops the session
/// before anything runs: a team that asked for a record gets one for every session.
pub fn open(
    config: &AuditConfig,
    params: &StartParams,
    session_id: &str,
    env: &[(String, String)],
    logger: Arc<dyn Logger>,
) -> Result<Arc<AuditRecord>> {
    let log_name = transcript::log_file_name(now_ms(), params, session_id);
    let name = format!("{}.audit.jsonl", log_name.trim_end_matches(".log"));
    let secrets = transcript::secrets_in(env);
    let sid = session_id.to_string();
    AuditRecord::create(
        config,
        &name,
        Box::new(move |text: &str| transcript::redact(text, &secrets)),
        Box::new(move |msg: &str| logger.log(LogLevel::Error, msg, json!({ "sessionID": sid }))),
    )
    .map_err(|e| {
        AdapterError::new(
            ErrorCode::Provision,
            format!(
                "cannot create the session's audit record in {} (config.audit.dir): {e}",
                config.dir.display()
            ),
        )
    })
}

/// The first entry: the session's params and the settings it runs under (a digest of them,
/// and the ones an auditor asks about), the commit it starts from (returned, for the seal).
pub fn start(
    record: &AuditRecord,
    config: &AdapterConfig,
    params: &StartParams,
    options: &StartOptions,
    ids: (&str, &str),
) -> Option<String> {
    let settings = settings(config);
    let base = base_commit(&config.repo_root, &config.default_branch);
    record.append(
        "start",
        json!({
            "sessionID": ids.0,
            "cliSessionID": ids.1,
            "role": params.role().as_str(),
            "params": params_json(params),
            "model": options.model,
            "maxBudgetUsd": options.max_budget_usd,
            "adapterVersion": env!("CARGO_PKG_VERSION"),
            "configSha256": sha256_hex(settings.to_string().as_bytes()),
            "config": settings,
            "baseCommit": base,
        }),
    );
    base
}

/// What the CLI was started with: the agent definition and the prompt (digests, and the
/// prompt itself, bounded), the model, where it runs.
pub fn agent(record: &AuditRecord, spec: &SessionSpec, sandbox: &str) {
    let agent = spec.agent.to_string();
    record.append(
        "agent",
        json!({
            "agentSha256": sha256_hex(agent.as_bytes()),
            "agent": spec.agent,
            "promptSha256": sha256_hex(spec.prompt.as_bytes()),
            "prompt": spec.prompt,
            "args": spec.args,
            "environment": sandbox,
        }),
    );
}

/// The last entries: how the session ended, then the seal binding the record to what the
/// engine was handed — the Implementor's patch (the empty string's digest when the result
/// carries none) and the commit its branch started from, another role's result.
pub fn end(
    record: &AuditRecord,
    base: Option<&str>,
    params: &StartParams,
    session_id: &str,
    outcome: &Result<Value>,
    stats: &SessionStats,
) {
    let (status, code, message) = match outcome {
        Ok(_) => ("completed", None, None),
        Err(e) if matches!(e.code, ErrorCode::Cancelled | ErrorCode::Timeout) => {
            ("cancelled", Some(e.code.as_str()), Some(e.message.as_str()))
        }
        Err(e) => ("failed", Some(e.code.as_str()), Some(e.message.as_str())),
    };
    let patch = outcome
        .as_ref()
        .ok()
        .and_then(|v| v.get("patch"))
        .and_then(Value::as_str);
    let result_text = match outcome {
        Ok(v) => v.to_string(),
        Err(e) => json!({ "code": e.code.as_str(), "message": e.message }).to_string(),
    };
    record.append(
        "end",
        json!({
            "outcome": status,
            "code": code,
            "message": message,
            "patchSha256": patch.map(|p| sha256_hex(p.as_bytes())),
            "patchBytes": patch.map(str::len),
            "resultSha256": sha256_hex(result_text.as_bytes()),
            "baseCommit": base,
            "stats": stats,
        }),
    );
    let mut subjects = Vec::new();
    if let StartParams::Implementor { branch_name, .. } = params {
        subjects.push(Subject::sha256("patch", patch.unwrap_or("").as_bytes()));
        if let Some(base) = base {
            subjects.push(Subject::commit(branch_name, base));
        }
    } else {
        subjects.push(Subject::sha256("result", result_text.as_bytes()));
    }
    record.seal(
        &subjects,
        json!({
            "sessionID": session_id,
            "role": params.role().as_str(),
            "outcome": status,
            "code": code,
        }),
    );
}

fn params_json(params: &StartParams) -> Value {
    match params {
        StartParams::Planner { spec_paths } => json!({ "specPaths": spec_paths }),
        StartParams::Implementor {
            work_item_id,
            branch_name,
        } => json!({ "workItemID": work_item_id, "branchName": branch_name }),
        StartParams::Reviewer {
            work_item_id,
            revision_id,
        } => json!({ "workItemID": work_item_id, "revisionID": revision_id }),
    }
}

/// The settings that decide what a session may do and spend, as the record names them; the
/// environment by its variables' names only (their values may be secrets).
fn settings(c: &AdapterConfig) -> Value {
    let secs = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64());
    let sandbox = c.sandbox.as_ref().map(|s| {
        json!({
            "allowedDomains": s.allowed_domains,
            "allowWrite": s.allow_write,
            "allowRead": s.allow_read,
            "limits": format!("{:?}", s.limits),
            "serverTools": s.server_tools.iter().map(|t| t.name()).collect::<Vec<_>>(),
        })
    });
    let backend = match &c.backend {
        BackendConfig::Local => json!("local"),
        BackendConfig::Kubernetes(k) => json!({ "kubernetes": {
            "namespace": k.namespace, "image": k.image, "runtimeImage": k.runtime_image,
        } }),
    };
    json!({
        "repoRoot": c.repo_root,
        "defaultBranch": c.default_branch,
        "contextPaths": c.context_paths,
        "maxAgentDuration": secs(c.max_agent_duration),
        "model": c.model,
        "env": c.env.iter().map(|(k, _)| k).collect::<Vec<_>>(),
        "worktreeSetupCommand": c.worktree_setup_command,
        "sandbox": sandbox,
        "backend": backend,
        "sharedBase": c.shared_base,
        "apiOutageTolerance": c.api_outage_tolerance.as_secs_f64(),
        "maxBudgetUsd": c.max_budget_usd,
        "outputRetries": c.output_retries,
        "hookTimeout": c.hook_timeout.as_secs_f64(),
        "signed": c.audit.as_ref().and_then(|a| a.key.as_ref()).map(|k| k.keyid()),
    })
}

/// The commit `defaultBranch` names now: what an Implementor's branch starts from.
fn base_commit(repo: &Path, branch: &str) -> Option<String> {
    let repo = git2::Repository::open(repo).ok()?;
    let commit = repo.revparse_single(&format!("{branch}^{{commit}}")).ok()?;
    Some(commit.id().to_string())
}
