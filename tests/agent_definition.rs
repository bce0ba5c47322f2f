//! Agent definition loading (spec 000 "Agent Definition Loading", "Project Context
//! Injection") and the two corrections the real CLI forces (lessons 6 and 7).

use std::path::Path;

use claude_runtime_adapter::agent_definition::{load, parse, AgentDefinition};
use claude_runtime_adapter::domain::Role;
use claude_runtime_adapter::error::ErrorCode;
use serde_json::json;

fn repo_with(agent: &str, files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), ".claude/agents/planner.md", agent.as_bytes());
    for (path, content) in files {
        write(dir.path(), path, content);
    }
    dir
}

fn write(root: &Path, rel: &str, content: &[u8]) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

fn parsed(text: &str) -> AgentDefinition {
    parse(".claude/agents/planner.md", text).unwrap()
}

fn parse_error(text: &str) -> String {
    let err = parse(".claude/agents/planner.md", text).unwrap_err();
    assert_eq!(err.code, ErrorCode::AgentDefinition, "{err}");
    assert!(err.message.contains(".claude/agents/planner.md"), "{err}");
    err.message
}

#[test]
fn frontmatter_fields_map_to_the_definition_and_body_becomes_the_prompt() {
    let def = parsed(
        "---\nname: planner\ndescription: Plans work\nmodel: opus\nmaxTurns: 12\n---\nYou plan.\n\nCarefully.\n",
    );
    assert_eq!(def.description, "Plans work");
    assert_eq!(def.model, "opus");
    assert_eq!(def.max_turns, Some(12));
    assert_eq!(def.prompt, "You plan.\n\nCarefully.");
    assert_eq!(def.tools, None);
    assert_eq!(def.disallowed_tools, None);
}

#[test]
fn comma_separated_tools_become_a_trimmed_list_with_structured_output_added() {
    let def = parsed("---\ndescription: d\ntools: Read,  Grep ,Bash(git diff:*) ,\n---\nP");
    assert_eq!(
        def.tools.unwrap(),
        vec!["Read", "Grep", "Bash(git diff:*)", "StructuredOutput"]
    );
}

#[test]
fn yaml_list_tools_are_used_directly() {
    let def =
        parsed("---\ndescription: d\ntools:\n  - Read\n  - StructuredOutput\n  - Edit\n---\nP");
    assert_eq!(def.tools.unwrap(), vec!["Read", "StructuredOutput", "Edit"]);
}

#[test]
fn absent_tools_stays_absent_so_the_default_tools_are_inherited() {
    let def = parsed("---\ndescription: d\n---\nP");
    assert_eq!(def.tools, None);
    assert!(def.to_cli_json().get("tools").is_none());
}

#[test]
fn disallowed_tools_are_parsed_and_never_deny_structured_output() {
    let def = parsed(
        "---\ndescription: d\ntools: Read, Bash\ndisallowedTools: Bash, StructuredOutput\n---\nP",
    );
    assert_eq!(def.disallowed_tools.unwrap(), vec!["Bash"]);
    let def = parsed("---\ndescription: d\ndisallowedTools: [WebFetch, StructuredOutput]\n---\nP");
    assert_eq!(def.disallowed_tools.unwrap(), vec!["WebFetch"]);
    assert_eq!(def.tools, None);
}

#[test]
fn model_defaults_to_inherit() {
    assert_eq!(parsed("---\ndescription: d\n---\nP").model, "inherit");
}

#[test]
fn max_turns_absent_is_none_and_quoted_integer_is_accepted() {
    assert_eq!(parsed("---\ndescription: d\n---\nP").max_turns, None);
    assert_eq!(
        parsed("---\ndescription: d\nmaxTurns: \"5\"\n---\nP").max_turns,
        Some(5)
    );
}

#[test]
fn max_turns_that_is_not_a_positive_integer_is_refused_naming_the_field() {
    for bad in [
        "0",
        "-3",
        "2.5",
        "many",
        "\"\"",
        "[1]",
        "\"5x\"",
        "99999999999",
    ] {
        let msg = parse_error(&format!("---\ndescription: d\nmaxTurns: {bad}\n---\nP"));
        assert!(msg.contains("maxTurns"), "{bad}: {msg}");
    }
}

#[test]
fn tools_of_the_wrong_type_are_refused_naming_the_field() {
    assert!(parse_error("---\ndescription: d\ntools: 5\n---\nP").contains("`tools`"));
    assert!(parse_error("---\ndescription: d\ntools: [Read, 3]\n---\nP").contains("`tools`"));
    assert!(
        parse_error("---\ndescription: d\ndisallowedTools: {a: b}\n---\nP")
            .contains("`disallowedTools`")
    );
    assert!(parse_error("---\ndescription: d\nmodel: [opus]\n---\nP").contains("`model`"));
}

#[test]
fn missing_or_non_string_description_is_refused() {
    assert!(parse_error("---\nmodel: opus\n---\nP").contains("`description`"));
    assert!(parse_error("---\ndescription: [a]\n---\nP").contains("`description`"));
}

#[test]
fn malformed_yaml_is_reported_not_ignored() {
    parse_error("---\ndescription: d\ntools: [Read, Grep\n---\nP");
    parse_error("---\ndescription: \"unterminated\n---\nP");
    parse_error("---\ndescription: d\n\tmodel: opus\n---\nP");
}

#[test]
fn unterminated_frontmatter_or_none_at_all_is_refused() {
    assert!(parse_error("---\ndescription: d\nbody without end").contains("unterminated"));
    assert!(parse_error("Just a prompt.\n").contains("no YAML frontmatter"));
    assert!(parse_error("---\njust a scalar\n---\nP").contains("not a mapping"));
}

#[test]
fn cli_json_has_description_prompt_tools_disallowed_and_model_but_not_max_turns() {
    let def =
        parsed("---\ndescription: d\ntools: Read\ndisallowedTools: Bash\nmaxTurns: 3\n---\nP");
    assert_eq!(
        def.to_cli_json(),
        json!({
            "description": "d",
            "prompt": "P",
            "tools": ["Read", "StructuredOutput"],
            "disallowedTools": ["Bash"],
            "model": "inherit"
        })
    );
}

#[test]
fn load_appends_context_files_after_the_prompt_separated_by_double_newlines() {
    let dir = repo_with(
        "---\ndescription: d\n---\nYou plan.\n",
        &[
            (".claude/CLAUDE.md", b"# Conventions\n"),
            ("docs/extra.md", b"Extra."),
        ],
    );
    let paths = vec![".claude/CLAUDE.md".to_owned(), "docs/extra.md".to_owned()];
    let def = load(dir.path(), Role::Planner, &paths).unwrap();
    assert_eq!(def.prompt, "You plan.\n\n# Conventions\n\n\nExtra.");
}

#[test]
fn load_with_no_context_paths_keeps_the_prompt_as_is() {
    let dir = repo_with("---\ndescription: d\n---\nYou plan.", &[]);
    assert_eq!(
        load(dir.path(), Role::Planner, &[]).unwrap().prompt,
        "You plan."
    );
}

#[test]
fn load_reads_the_file_fresh_every_time() {
    let dir = repo_with("---\ndescription: one\n---\nP", &[]);
    assert_eq!(
        load(dir.path(), Role::Planner, &[]).unwrap().description,
        "one"
    );
    write(
        dir.path(),
        ".claude/agents/planner.md",
        b"---\ndescription: two\n---\nP",
    );
    assert_eq!(
        load(dir.path(), Role::Planner, &[]).unwrap().description,
        "two"
    );
}

#[test]
fn missing_agent_file_is_err_agent_definition_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = load(dir.path(), Role::Reviewer, &[]).unwrap_err();
    assert_eq!(err.code, ErrorCode::AgentDefinition);
    assert!(err.message.contains(".claude/agents/reviewer.md"), "{err}");
    assert!(err.cause.is_some());
}

#[test]
fn missing_or_non_utf8_context_file_is_err_agent_definition_naming_the_file() {
    let dir = repo_with("---\ndescription: d\n---\nP", &[("bad.md", b"\xff\xfe")]);
    let err = load(dir.path(), Role::Planner, &["gone.md".to_owned()]).unwrap_err();
    assert_eq!(err.code, ErrorCode::AgentDefinition);
    assert!(err.message.contains("gone.md"), "{err}");
    let err = load(dir.path(), Role::Planner, &["bad.md".to_owned()]).unwrap_err();
    assert_eq!(err.code, ErrorCode::AgentDefinition);
    assert!(
        err.message.contains("bad.md") && err.message.contains("UTF-8"),
        "{err}"
    );
}

#[test]
fn non_utf8_agent_file_is_err_agent_definition() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        ".claude/agents/planner.md",
        b"---\ndescription: \xff\n---\n",
    );
    let err = load(dir.path(), Role::Planner, &[]).unwrap_err();
    assert_eq!(err.code, ErrorCode::AgentDefinition);
}
