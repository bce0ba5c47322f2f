//! `.claude/agents/<role>.md` → the inline agent definition the CLI is given, with the
//! project context files appended to its prompt (spec 000 "Agent Definition Loading",
//! "Project Context Injection"). Everything is read fresh on every call: no caching.

use std::collections::HashMap;
use std::path::Path;

use gray_matter::engine::YAML;
use gray_matter::{Matter, Pod};
use serde_json::{json, Map, Value};

use crate::domain::Role;
use crate::error::{AdapterError, ErrorCode, Result};

/// The CLI's client-side tool that carries structured output. An allowlist without it means
/// no output can ever arrive (lesson 6), and denying it has the same effect.
pub const STRUCTURED_OUTPUT_TOOL: &str = "StructuredOutput";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentDefinition {
    pub description: String,
    /// `None` = inherit the CLI's default tools (lesson 7: absent is not `[]`).
    pub tools: Option<Vec<String>>,
    pub disallowed_tools: Option<Vec<String>>,
    pub model: String,
    /// A session option, not part of the definition sent to the CLI.
    pub max_turns: Option<u32>,
    /// The file's body with the project context appended.
    pub prompt: String,
}

pub fn load(repo_root: &Path, role: Role, context_paths: &[String]) -> Result<AgentDefinition> {
    let rel = format!(".claude/agents/{}.md", role.as_str());
    let text = read_utf8(repo_root, &rel, "agent definition")?;
    let mut def = parse(&rel, &text)?;
    let mut contexts = Vec::with_capacity(context_paths.len());
    for path in context_paths {
        contexts.push(read_utf8(repo_root, path, "context file")?);
    }
    def.prompt = append_context(&def.prompt, &contexts);
    Ok(def)
}

/// Parses an agent file's text (`file` only names it in errors). The prompt is the body alone.
pub fn parse(file: &str, text: &str) -> Result<AgentDefinition> {
    let (fields, body) = frontmatter(file, text)?;

    let description = match fields.get("description") {
        Some(Pod::String(s)) => s.clone(),
        Some(_) => return Err(field_error(file, "description", "must be a string")),
        None => return Err(field_error(file, "description", "is missing")),
    };
    let mut tools = tool_list(file, "tools", fields.get("tools"))?;
    let mut disallowed_tools = tool_list(file, "disallowedTools", fields.get("disallowedTools"))?;
    let model = match fields.get("model") {
        None | Some(Pod::Null) => "inherit".to_owned(),
        Some(Pod::String(s)) if !s.trim().is_empty() => s.trim().to_owned(),
        Some(_) => return Err(field_error(file, "model", "must be a non-empty string")),
    };
    let max_turns = max_turns(file, fields.get("maxTurns"))?;

    if let Some(tools) = tools.as_mut() {
        if !tools.iter().any(|t| t == STRUCTURED_OUTPUT_TOOL) {
            tools.push(STRUCTURED_OUTPUT_TOOL.to_owned());
        }
    }
    // Removed whether or not an allowlist exists: denying it breaks output either way.
    if let Some(denied) = disallowed_tools.as_mut() {
        denied.retain(|t| t != STRUCTURED_OUTPUT_TOOL);
    }

    Ok(AgentDefinition {
        description,
        tools,
        disallowed_tools,
        model,
        max_turns,
        prompt: body,
    })
}

/// `prompt`, then each context file's contents, all separated by a blank line ("\n\n"),
/// contents inserted as read.
pub fn append_context(prompt: &str, contexts: &[String]) -> String {
    let mut out = prompt.to_owned();
    for context in contexts {
        out.push_str("\n\n");
        out.push_str(context);
    }
    out
}

impl AgentDefinition {
    /// The inline agent definition for the CLI's initialize request. Absent lists stay
    /// absent (inherit); `maxTurns` is a session option and is not included.
    pub fn to_cli_json(&self) -> Value {
        let mut obj = Map::new();
        obj.insert("description".into(), json!(self.description));
        obj.insert("prompt".into(), json!(self.prompt));
        if let Some(tools) = &self.tools {
            obj.insert("tools".into(), json!(tools));
        }
        if let Some(denied) = &self.disallowed_tools {
            obj.insert("disallowedTools".into(), json!(denied));
        }
        obj.insert("model".into(), json!(self.model));
        Value::Object(obj)
    }
}

fn read_utf8(repo_root: &Path, rel: &str, what: &str) -> Result<String> {
    let path = repo_root.join(rel);
    let bytes = std::fs::read(&path).map_err(|e| {
        definition_error(
            rel,
            format!("{what} could not be read at {}: {e}", path.display()),
        )
        .with_cause(e)
    })?;
    String::from_utf8(bytes)
        .map_err(|e| definition_error(rel, format!("{what} is not UTF-8")).with_cause(e))
}

/// The frontmatter mapping and the body. gray_matter is lenient in ways that would hide a broken file:
/// an unclosed `---` block is silently treated as body, a scalar document passes as data,
/// and a file without frontmatter parses fine. Those are refused here.
fn frontmatter(file: &str, text: &str) -> Result<(HashMap<String, Pod>, String)> {
    let mut lines = text.lines();
    let opens = lines.next().is_some_and(|l| l.trim_end() == "---");
    if !opens {
        return Err(definition_error(
            file,
            "has no YAML frontmatter (it must start with '---')",
        ));
    }
    if !lines.any(|l| l.trim_end() == "---") {
        return Err(definition_error(
            file,
            "has an unterminated YAML frontmatter block",
        ));
    }
    let parsed = Matter::<YAML>::new()
        .parse::<Pod>(text)
        .map_err(|e| definition_error(file, format!("malformed YAML frontmatter: {e}")))?;
    let fields = match parsed.data {
        Some(Pod::Hash(map)) => map,
        None | Some(Pod::Null) => HashMap::new(),
        Some(_) => return Err(definition_error(file, "YAML frontmatter is not a mapping")),
    };
    Ok((fields, parsed.content))
}

/// A comma-separated string or a YAML list of strings; entries trimmed, empty ones dropped.
/// YAML `null` (a key with no value) counts as absent.
fn tool_list(file: &str, field: &str, value: Option<&Pod>) -> Result<Option<Vec<String>>> {
    match value {
        None | Some(Pod::Null) => Ok(None),
        Some(Pod::String(s)) => Ok(Some(
            s.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect(),
        )),
        Some(Pod::Array(items)) => items
            .iter()
            .map(|item| match item {
                Pod::String(s) if !s.trim().is_empty() => Ok(s.trim().to_owned()),
                _ => Err(field_error(file, field, "must list non-empty strings")),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some),
        Some(_) => Err(field_error(
            file,
            field,
            "must be a comma-separated string or a list of strings",
        )),
    }
}

/// A positive integer. A quoted number (`maxTurns: "5"`) is accepted too: "parsed as
/// integer" in the spec, and quoting is a common YAML habit. Zero, negatives, fractions and
/// anything else are refused rather than guessed at.
fn max_turns(file: &str, value: Option<&Pod>) -> Result<Option<u32>> {
    let invalid = || field_error(file, "maxTurns", "must be a positive integer");
    match value {
        None | Some(Pod::Null) => Ok(None),
        Some(Pod::Integer(n)) => u32::try_from(*n)
            .ok()
            .filter(|n| *n > 0)
            .map(Some)
            .ok_or_else(invalid),
        Some(Pod::String(s)) => {
            let s = s.trim();
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid());
            }
            s.parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .map(Some)
                .ok_or_else(invalid)
        }
        Some(_) => Err(invalid()),
    }
}

fn definition_error(file: &str, why: impl std::fmt::Display) -> AdapterError {
    AdapterError::new(ErrorCode::AgentDefinition, format!("{file}: {why}"))
}

fn field_error(file: &str, field: &str, why: &str) -> AdapterError {
    definition_error(file, format!("frontmatter field `{field}` {why}"))
}
