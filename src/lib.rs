//! Module map. napi lives only in `binding/`; the Claude Code CLI protocol only in `claude/`.

pub mod agent_definition;
pub mod binding;
pub mod context;
pub mod deps;
pub mod domain;
pub mod error;
pub mod params;
pub mod schema;
