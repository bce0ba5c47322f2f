//! Module map. napi lives only in `binding/`; the Claude Code CLI protocol only in `claude/`.

pub mod adapter;
pub mod agent_definition;
pub mod audit;
pub mod bash_validator;
pub mod binding;
pub mod claude;
pub mod config;
pub mod context;
pub mod deps;
pub mod domain;
pub mod environment;
pub mod error;
pub mod git;
pub mod https;
pub mod lifecycle;
pub mod logging;
pub mod otel;
pub mod output;
pub mod params;
pub mod process;
pub mod sandbox;
pub mod schema;
pub mod scratch;
pub mod spend;
pub mod stats;
pub mod transcript;
