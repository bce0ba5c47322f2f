//! What a request asks the model API to reach on the agent's behalf. A command inside the
//! sandbox can post its own request through the relay (it needs no key: the relay adds it), and
//! some of the API's features make the API's servers contact hosts the request names: the MCP
//! connector (`mcp_servers`), the server tools (`web_search`, `web_fetch`, `code_execution`, a
//! code-execution `container`). Each is a way past the egress allowlist, so the relay forwards
//! a request that asks for one only when `sandbox.serverTools` allows it. What the CLI sends for
//! its own tools needs none of them, except its WebSearch (a `web_search` server tool). A tool
//! type the relay does not know is refused like one it does: fail closed.
//!
//! The request's fields are what is checked, not its `anthropic-beta` values: a beta turns a
//! feature on only for a request that also asks for it in those fields (and the CLI sends the
//! web-search beta with every request to Vertex AI and Foundry, used or not).

use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::config::ServerTool;

/// The parts of a request body that ask the API to reach out; everything else is skipped.
#[derive(Deserialize)]
struct Asks {
    mcp_servers: Option<IgnoredAny>,
    /// A code-execution container to reuse.
    container: Option<IgnoredAny>,
    tools: Option<Vec<Tool>>,
}

#[derive(Deserialize)]
struct Tool {
    #[serde(rename = "type")]
    kind: Option<String>,
}

/// Tool types of the API's own that the client runs (as the CLI runs its tools): they reach
/// nothing by themselves.
const CLIENT_TOOLS: &[&str] = &["custom", "bash_", "text_editor_", "computer_", "memory_"];

/// Server-tool types, by prefix, and the feature each is.
const SERVER_TOOLS: &[(&str, ServerTool)] = &[
    ("web_search_", ServerTool::WebSearch),
    ("web_fetch_", ServerTool::WebFetch),
    ("code_execution_", ServerTool::CodeExecution),
    ("mcp_toolset", ServerTool::McpServers),
];

/// Why the relay refuses the request with `body`, or `None` to forward it. `allowed`: the
/// features `sandbox.serverTools` allows; `None` when the session has no sandbox
/// (`sandbox: false`, knowingly open), where nothing is refused.
pub(super) fn refusal(allowed: Option<&[ServerTool]>, body: &[u8]) -> Option<String> {
    let allowed = allowed?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    // A body the relay cannot read is not forwarded either (a key it would not see twice).
    let asks = match serde_json::from_slice::<Asks>(body) {
        Ok(asks) => asks,
        Err(e) => {
            return Some(format!(
                "the request body is not JSON the sandbox's relay can check: {e}"
            ))
        }
    };
    let refuse = |tool: ServerTool, what: &str| -> Option<String> {
        (!allowed.contains(&tool)).then(|| {
            format!(
                "the sandbox's relay does not forward {what}: it makes the API's servers reach hosts the agent names; sandbox.serverTools may allow \"{}\"",
                tool.name()
            )
        })
    };
    if asks.mcp_servers.is_some() {
        if let Some(why) = refuse(ServerTool::McpServers, "mcp_servers") {
            return Some(why);
        }
    }
    if asks.container.is_some() {
        if let Some(why) = refuse(ServerTool::CodeExecution, "a code-execution container") {
            return Some(why);
        }
    }
    for kind in asks
        .tools
        .iter()
        .flatten()
        .filter_map(|t| t.kind.as_deref())
    {
        if CLIENT_TOOLS.iter().any(|p| kind.starts_with(p)) {
            continue;
        }
        let Some((_, tool)) = SERVER_TOOLS.iter().find(|(p, _)| kind.starts_with(p)) else {
            return Some(format!(
                "the sandbox's relay does not forward the tool type {kind:?}: a server tool it does not know may reach hosts the agent names"
            ));
        };
        if let Some(why) = refuse(*tool, &format!("the server tool {kind:?}")) {
            return Some(why);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(allowed: &[ServerTool], body: &str) -> Option<String> {
        refusal(Some(allowed), body.as_bytes())
    }

    #[test]
    fn what_the_cli_sends_for_its_own_tools_is_forwarded() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"mcp_servers web_fetch_20250910"}],"tools":[{"name":"Bash","input_schema":{}},{"name":"X","type":"custom","input_schema":{}}],"stream":true}"#;
        assert_eq!(check(&[], body), None);
        assert_eq!(check(&[], ""), None);
        // Bedrock's and Vertex AI's betas ride in the body; the web-search beta alone asks for
        // nothing (the CLI sends it to Vertex AI and Foundry with every request).
        let betas =
            r#"{"anthropic_beta":["claude-code-20250219","web-search-2025-03-05"],"messages":[]}"#;
        assert_eq!(check(&[], betas), None);
    }

    #[test]
    fn each_feature_that_reaches_out_is_refused_unless_allowed_naming_what_allows_it() {
        let cases = [
            (
                r#"{"mcp_servers":[{"type":"url","url":"https://evil.example/mcp","name":"x"}]}"#,
                ServerTool::McpServers,
            ),
            (
                r#"{"tools":[{"type":"web_fetch_20250910","name":"web_fetch"}]}"#,
                ServerTool::WebFetch,
            ),
            (
                r#"{"tools":[{"type":"web_search_20250305","name":"web_search"}]}"#,
                ServerTool::WebSearch,
            ),
            (
                r#"{"tools":[{"type":"code_execution_20250825","name":"code_execution"}]}"#,
                ServerTool::CodeExecution,
            ),
            (r#"{"container":"container_1"}"#, ServerTool::CodeExecution),
            (
                r#"{"tools":[{"type":"mcp_toolset","mcp_server_name":"x"}]}"#,
                ServerTool::McpServers,
            ),
        ];
        for (body, tool) in cases {
            let why = check(&[], body).unwrap_or_else(|| panic!("{body} was forwarded"));
            assert!(why.contains(&format!("\"{}\"", tool.name())), "{why}");
            assert_eq!(check(&[tool], body), None, "{body}");
        }
    }

    #[test]
    fn an_unknown_server_tool_and_an_unreadable_body_are_refused_and_no_sandbox_refuses_nothing() {
        let unknown = r#"{"tools":[{"type":"browser_20270101","name":"b"}]}"#;
        assert!(check(&[], unknown).unwrap().contains("browser_20270101"));
        let duplicate = r#"{"tools":[],"tools":[{"type":"web_fetch_20250910"}]}"#;
        assert!(check(&[], duplicate).unwrap().contains("not JSON"));
        assert!(check(&[], "not json").unwrap().contains("not JSON"));
        let everything = r#"{"mcp_servers":[],"tools":[{"type":"browser_20270101"}]}"#;
        assert_eq!(refusal(None, everything.as_bytes()), None);
    }
}
