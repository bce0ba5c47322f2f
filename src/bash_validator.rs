//! The shared Bash validator rule set (`reference/bash-validator-rules.md`), without napi.
//!
//! Two other implementations (TypeScript and a shell script) must reach the same decisions, so
//! this module follows the reference literally and reproduces JavaScript `RegExp` semantics on
//! top of the `regex` crate: the pattern sources are kept verbatim (they appear in the block
//! messages) and translated once into equivalent Rust syntax.
//!
//! The walkers work on `char`s, so every masked or split position is a whole code point. A JS
//! implementation walks UTF-16 code units instead; the only difference is that a masked astral
//! character becomes one space here and two there. No pattern can tell: a masked run only ever
//! meets `\s` (one blank matches as well as two), `\s+`, `\s*` or `.*`, and `\b` sees blanks
//! either way.

use std::sync::LazyLock;

use regex::RegexSet;
use serde_json::Value;

use crate::deps::{BashHook, HookDecision};

/// Blocklist pattern sources (JavaScript syntax), in evaluation order. The text is also the
/// `<pattern source>` of the block message, so it must stay byte-for-byte the reference's.
pub const BLOCKLIST: [&str; 21] = [
    // Git destructive
    r"git\s+reset\s+--hard",
    r"git\s+clean\s+-[a-zA-Z]*f",
    r"git\s+checkout\s+\.",
    r"git\s+restore\s+\.",
    r"git\s+branch\s+.*-D\b",
    // File deletion
    r"rm\s",
    // Privilege escalation
    r"\bsudo\b",
    // Remote code execution
    r"curl\s.*\|\s*(bash|sh|zsh)",
    r"wget\s.*\|\s*(bash|sh|zsh)",
    r"\beval\b",
    // System modification
    r"\bdd\s+if=",
    r"\bmkfs\b",
    r"\bfdisk\b",
    r"chmod\s+-R",
    r"chmod\s+777",
    r"chmod\s+.*o\+w",
    r"chmod\s+.*a\+w",
    r"\bchown\b",
    // Process management
    r"\bkill\b",
    r"\bpkill\b",
    r"\bkillall\b",
];

/// Exact first words that may start a segment.
pub const ALLOWLIST: [&str; 39] = [
    // Git
    "git",
    "scripts/workflow/gh.sh",
    "./scripts/workflow/gh.sh",
    // Node
    "yarn",
    // Text
    "head",
    "tail",
    "grep",
    "rg",
    "awk",
    "sed",
    "tr",
    "cut",
    "sort",
    "uniq",
    "wc",
    "jq",
    "xargs",
    "diff",
    "tee",
    // Shell utilities
    "echo",
    "printf",
    "ls",
    "pwd",
    "which",
    "command",
    "test",
    "true",
    "false",
    "env",
    "date",
    "basename",
    "dirname",
    "realpath",
    "find",
    // File operations (chmod still goes through the blocklist)
    "chmod",
    "mkdir",
    "touch",
    "cp",
    "mv",
];

/// ECMAScript `WhiteSpace` + `LineTerminator`: what JS `\s` and `String.prototype.trimStart`
/// use. Rust's Unicode `\s` differs (it has U+0085 and lacks U+FEFF), so it is spelled out.
const JS_WHITESPACE_ITEMS: &str = r"\t\n\x0B\x0C\r \x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF}";

/// Whether `c` is in the JS `\s` set (see [`JS_WHITESPACE_ITEMS`]).
pub fn is_js_whitespace(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\u{0B}' | '\u{0C}' | '\r' | ' ' | '\u{A0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200A}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202F}'
                | '\u{205F}'
                | '\u{3000}'
                | '\u{FEFF}'
    )
}

/// Translates a JavaScript pattern source (no flags) into `regex` syntax with the same meaning:
/// `\s` → the JS whitespace set, `.` → anything but a JS line terminator, `\b` → ASCII word
/// boundary (JS word characters are `[A-Za-z0-9_]`). Everything else in the blocklist already
/// means the same in both dialects.
fn js_pattern_to_rust(source: &str) -> String {
    let mut out = String::with_capacity(source.len() * 2);
    let mut in_class = false;
    let mut chars = source.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('s') if in_class => out.push_str(JS_WHITESPACE_ITEMS),
                Some('s') => {
                    out.push('[');
                    out.push_str(JS_WHITESPACE_ITEMS);
                    out.push(']');
                }
                Some('b') if !in_class => out.push_str(r"(?-u:\b)"),
                Some(next) => {
                    out.push('\\');
                    out.push(next);
                }
                None => out.push_str(r"\\"),
            },
            '[' if !in_class => {
                in_class = true;
                out.push(c);
            }
            ']' if in_class => {
                in_class = false;
                out.push(c);
            }
            '.' if !in_class => out.push_str(r"[^\n\r\x{2028}\x{2029}]"),
            _ => out.push(c),
        }
    }
    out
}

/// All blocklist patterns in one automaton: one pass over the masked copy answers every
/// pattern, and the lowest matching index is the first pattern in evaluation order.
static BLOCKLIST_SET: LazyLock<RegexSet> = LazyLock::new(|| {
    RegexSet::new(BLOCKLIST.iter().map(|source| js_pattern_to_rust(source)))
        .expect("blocklist patterns are constants and compile")
});

/// The quote-masked copy: every character inside `"…"` or `'…'` becomes a space, quote
/// characters stay, the result has exactly as many `char`s as the input.
///
/// Inside double quotes a backslash and the character it escapes are both masked (so `\"` does
/// not close the string); inside single quotes a backslash is literal. Outside quotes a
/// backslash escape is copied as is, and the escaped character cannot open a quote. An unclosed
/// quote masks to the end.
pub fn mask_quotes(command: &str) -> String {
    let mut out = String::with_capacity(command.len());
    let mut quote: Option<char> = None;
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) if c == q => {
                out.push(c);
                quote = None;
            }
            Some('"') if c == '\\' => {
                out.push(' ');
                if chars.next().is_some() {
                    out.push(' ');
                }
            }
            Some(_) => out.push(' '),
            None if c == '\\' => {
                out.push(c);
                if let Some(escaped) = chars.next() {
                    out.push(escaped);
                }
            }
            None => {
                if c == '"' || c == '\'' {
                    quote = Some(c);
                }
                out.push(c);
            }
        }
    }
    out
}

/// Splits the original command on `&&`, `||`, `;`, `|` and newline outside quotes, with the
/// same quote and escape rules as [`mask_quotes`]. Segments borrow from `command`; empty ones
/// are kept (the caller skips them).
pub fn split_segments(command: &str) -> Vec<&str> {
    let mut segments = Vec::new();
    let mut start = 0;
    let mut quote: Option<char> = None;
    let mut iter = command.char_indices().peekable();
    while let Some((i, c)) = iter.next() {
        match quote {
            Some(q) if c == q => quote = None,
            Some('"') if c == '\\' => {
                iter.next();
            }
            Some(_) => {}
            None => match c {
                '\\' => {
                    iter.next();
                }
                '"' | '\'' => quote = Some(c),
                // Two-character operators first, so `&&`/`||` are one separator each.
                '&' | '|' if iter.peek().map(|&(_, n)| n) == Some(c) => {
                    iter.next();
                    segments.push(&command[start..i]);
                    start = i + 2;
                }
                ';' | '|' | '\n' => {
                    segments.push(&command[start..i]);
                    start = i + c.len_utf8();
                }
                _ => {}
            },
        }
    }
    segments.push(&command[start..]);
    segments
}

/// The word the allowlist judges: first line, leading JS white space trimmed, up to the next
/// JS white space. Empty when the segment has nothing on its first line.
pub fn first_word(segment: &str) -> &str {
    let first_line = segment.split('\n').next().unwrap_or("");
    let trimmed = first_line.trim_start_matches(is_js_whitespace);
    trimmed.split(is_js_whitespace).next().unwrap_or("")
}

/// Decides one command: `Ok(())` allows it, `Err` carries the exact `Blocked: …` reason.
pub fn validate_bash_command(command: &str) -> Result<(), String> {
    if command.is_empty() {
        return Ok(());
    }

    // Blocklist first, on the masked copy, so quoted text never trips a pattern.
    let masked = mask_quotes(command);
    if let Some(index) = BLOCKLIST_SET.matches(&masked).iter().next() {
        let source = BLOCKLIST[index];
        return Err(format!("Blocked: matches dangerous pattern '{source}'"));
    }

    for segment in split_segments(command) {
        let word = first_word(segment);
        if word.is_empty() {
            continue;
        }
        if !ALLOWLIST.contains(&word) {
            return Err(format!(
                "Blocked: '{word}' is not in the allowed command list"
            ));
        }
    }
    Ok(())
}

/// Reason given when a Bash event carries no string `command`: there is nothing to judge, and
/// the rule set fails closed.
pub const MISSING_COMMAND_REASON: &str =
    "Blocked: Bash tool_input.command is missing or not a string";

/// The PreToolUse hook's answer for one tool-use event: Bash commands go through the rule set,
/// every other tool is approved (the hook is registered for Bash only; anything else reaching
/// it is not this rule set's business).
pub fn hook_decision(tool_name: &str, tool_input: &Value) -> HookDecision {
    if tool_name != "Bash" {
        return HookDecision::Approve;
    }
    match tool_input.get("command") {
        Some(Value::String(command)) => match validate_bash_command(command) {
            Ok(()) => HookDecision::Approve,
            Err(reason) => HookDecision::Block { reason },
        },
        _ => HookDecision::Block {
            reason: MISSING_COMMAND_REASON.to_owned(),
        },
    }
}

/// Reason given when the hook is called with something that is not a `{tool_name, tool_input}`
/// event (no string `tool_name`): it cannot be told apart from a Bash call, so it blocks.
pub const INVALID_EVENT_REASON: &str = "Blocked: the hook event has no string tool_name";

/// The rule set as the core's [`BashHook`]: what the adapter runs when the engine hands it the
/// hook from `createBashValidatorHook()`, answering without a round trip through JS.
#[derive(Debug, Clone, Copy, Default)]
pub struct NativeBashHook;

impl BashHook for NativeBashHook {
    fn validate(
        &self,
        tool_name: String,
        tool_input: Value,
    ) -> futures::future::BoxFuture<'static, crate::error::Result<HookDecision>> {
        let decision = hook_decision(&tool_name, &tool_input);
        Box::pin(std::future::ready(Ok(decision)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_blocklist_pattern_translates_to_a_valid_rust_regex() {
        assert_eq!(BLOCKLIST_SET.len(), 21);
    }

    #[test]
    fn translation_replaces_js_only_constructs() {
        assert_eq!(
            js_pattern_to_rust(r"a.\b"),
            r"a[^\n\r\x{2028}\x{2029}](?-u:\b)"
        );
        assert_eq!(
            js_pattern_to_rust(r"[a\s]"),
            format!("[a{JS_WHITESPACE_ITEMS}]")
        );
    }
}
