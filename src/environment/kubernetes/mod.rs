//! The Kubernetes backend: one pod per session.

pub mod cluster;
