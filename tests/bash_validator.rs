//! The shared rule set against hand-derived vectors, the hook decision, and robustness
//! properties (no panic, no hang, masked copy keeps its length).

use std::time::{Duration, Instant};

use claude_runtime_adapter::bash_validator::{
    hook_decision, mask_quotes, validate_bash_command, ALLOWLIST, BLOCKLIST, MISSING_COMMAND_REASON,
};
use claude_runtime_adapter::deps::HookDecision;
use proptest::prelude::*;
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct Vector {
    command: String,
    allowed: bool,
    reason: Option<String>,
    why: String,
}

fn vectors() -> Vec<Vector> {
    let text = include_str!("fixtures/bash_validator_vectors.json");
    serde_json::from_str(text).expect("vector file is valid JSON")
}

#[test]
fn every_vector_gets_its_hand_derived_decision_and_message() {
    let vectors = vectors();
    assert!(
        vectors.len() >= 150,
        "the vector file must stay comprehensive"
    );
    let mut failures = Vec::new();
    for v in &vectors {
        let expected = if v.allowed {
            Ok(())
        } else {
            Err(v.reason.clone().expect("blocked vectors carry a reason"))
        };
        let actual = validate_bash_command(&v.command);
        if actual != expected {
            failures.push(format!(
                "{:?} ({}): expected {:?}, got {:?}",
                v.command, v.why, expected, actual
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn vectors_cover_every_blocklist_pattern_and_allowlist_word() {
    let vectors = vectors();
    for pattern in BLOCKLIST {
        let message = format!("Blocked: matches dangerous pattern '{pattern}'");
        assert!(
            vectors
                .iter()
                .any(|v| v.reason.as_deref() == Some(&message)),
            "no vector blocks on {pattern}"
        );
    }
    for word in ALLOWLIST {
        assert!(
            vectors
                .iter()
                .any(|v| v.allowed && v.command.split(' ').next() == Some(word)),
            "no allowed vector starts with {word}"
        );
    }
}

#[test]
fn masked_copy_blanks_quoted_text_and_keeps_the_quotes() {
    assert_eq!(mask_quotes(r#"a "b c" 'd' e"#), r#"a "   " ' ' e"#);
    assert_eq!(mask_quotes(r#""x\"y" z"#), r#""    " z"#);
    assert_eq!(mask_quotes(r"'x\' z"), r"'  ' z");
    assert_eq!(mask_quotes(r#"\"rm x"#), r#"\"rm x"#);
    assert_eq!(
        mask_quotes("\"unclosed rm"),
        format!("\"{}", " ".repeat(11))
    );
    assert_eq!(mask_quotes("\"é😀\" x"), "\"  \" x");
}

#[test]
fn hook_approves_tools_other_than_bash() {
    assert_eq!(
        hook_decision("Read", &json!({ "file_path": "/etc/passwd" })),
        HookDecision::Approve
    );
    assert_eq!(
        hook_decision("bash", &json!({ "command": "rm -rf /" })),
        HookDecision::Approve
    );
}

#[test]
fn hook_approves_an_allowed_bash_command() {
    assert_eq!(
        hook_decision("Bash", &json!({ "command": "git status" })),
        HookDecision::Approve
    );
}

#[test]
fn hook_blocks_a_blocked_bash_command_with_the_validator_message() {
    assert_eq!(
        hook_decision("Bash", &json!({ "command": "rm -rf /" })),
        HookDecision::Block {
            reason: r"Blocked: matches dangerous pattern 'rm\s'".into()
        }
    );
}

#[test]
fn hook_blocks_a_bash_event_without_a_string_command() {
    let missing = HookDecision::Block {
        reason: MISSING_COMMAND_REASON.into(),
    };
    assert_eq!(hook_decision("Bash", &json!({})), missing);
    assert_eq!(hook_decision("Bash", &json!({ "command": 42 })), missing);
    assert_eq!(hook_decision("Bash", &json!({ "command": null })), missing);
    assert_eq!(
        hook_decision("Bash", &json!({ "command": ["ls"] })),
        missing
    );
    assert_eq!(hook_decision("Bash", &json!("ls")), missing);
    assert_eq!(hook_decision("Bash", &json!(null)), missing);
}

#[test]
fn ten_megabyte_commands_are_decided_quickly() {
    let cases = [
        // Long allowed command: one segment, nothing dangerous.
        format!("echo {}", "a".repeat(10 << 20)),
        // Unclosed quote masking ten megabytes.
        format!("echo \"{}", "rm -rf / ".repeat((10 << 20) / 9)),
        // Many segments.
        "ls && ".repeat((10 << 20) / 6),
        // Danger at the very end of a long line that `.*` patterns must scan.
        format!("chmod {} o+w", "x".repeat(10 << 20)),
    ];
    let expected = [
        Ok(()),
        Ok(()),
        Ok(()),
        Err(r"Blocked: matches dangerous pattern 'chmod\s+.*o\+w'".to_owned()),
    ];
    for (command, expected) in cases.iter().zip(expected) {
        let start = Instant::now();
        assert_eq!(validate_bash_command(command), expected);
        // Generous for unoptimised test builds on a shared machine; a backtracking engine
        // would take minutes here.
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "took {:?}",
            start.elapsed()
        );
    }
}

#[test]
fn deeply_nested_quotes_neither_panic_nor_recurse() {
    let nested = "\"'\\\"".repeat(1 << 20);
    let _ = validate_bash_command(&nested);
    let alternating = "'\"".repeat(1 << 20);
    assert_eq!(
        mask_quotes(&alternating).chars().count(),
        alternating.chars().count()
    );
    let _ = validate_bash_command(&alternating);
}

proptest! {
    #[test]
    fn arbitrary_strings_never_panic(command in any::<String>()) {
        let _ = validate_bash_command(&command);
    }

    #[test]
    fn shell_like_strings_never_panic_and_blocks_are_well_formed(
        command in r#"([a-z ]{0,6}|["'\\;&|\n\r\t]|rm |sudo|git |chmod |\u{2028}|é|😀){0,40}"#
    ) {
        if let Err(reason) = validate_bash_command(&command) {
            prop_assert!(reason.starts_with("Blocked: "));
        }
    }

    #[test]
    fn masked_copy_has_as_many_chars_as_the_command(command in any::<String>()) {
        prop_assert_eq!(mask_quotes(&command).chars().count(), command.chars().count());
    }

    #[test]
    fn masked_copy_only_blanks_characters(
        command in r#"([a-z ]{0,4}|["'\\]|é|😀){0,30}"#
    ) {
        for (original, masked) in command.chars().zip(mask_quotes(&command).chars()) {
            prop_assert!(masked == original || masked == ' ');
        }
    }

    #[test]
    fn quoting_any_text_after_an_allowed_word_never_blocks(text in "[^\"\\\\]{0,60}") {
        let command = format!("echo \"{text}\"");
        prop_assert_eq!(validate_bash_command(&command), Ok(()));
    }
}

#[test]
fn native_hook_answers_like_hook_decision() {
    use claude_runtime_adapter::bash_validator::NativeBashHook;
    use claude_runtime_adapter::deps::BashHook;
    let hook = NativeBashHook;
    let run = |name: &str, input: serde_json::Value| {
        futures::executor::block_on(hook.validate(name.into(), input)).expect("never fails")
    };
    assert_eq!(
        run("Bash", json!({ "command": "ls" })),
        HookDecision::Approve
    );
    assert_eq!(run("Edit", json!({})), HookDecision::Approve);
    assert_eq!(
        run("Bash", json!({ "command": "sudo ls" })),
        HookDecision::Block {
            reason: r"Blocked: matches dangerous pattern '\bsudo\b'".into()
        }
    );
}
