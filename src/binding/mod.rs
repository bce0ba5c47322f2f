//! The napi skin: the only place that imports napi. One file per exported concept.

pub mod adapter;
pub mod audit;
pub mod deps;
pub mod error;
pub mod handle;
pub mod js;
pub mod schemas;
pub mod validator;
