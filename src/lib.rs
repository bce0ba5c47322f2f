//! Module map. napi lives only in `binding/`; the Claude Code CLI protocol only in `claude/`.

pub mod bash_validator;
pub mod binding;
pub mod deps;
pub mod domain;
pub mod error;
