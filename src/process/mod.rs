//! Processes and their owners, below everything that starts one: [`tree`] finds and kills
//! everything a started process started in turn; [`owner`] records which process (pid, start
//! time, host) made something the adapter leaves on disk or in a cluster, so the next adapter
//! can tell a dead engine's leftovers from a live one's.

pub mod owner;
pub mod tree;

pub use owner::Owner;

/// The value of `key` in an environment the adapter builds for a process it starts (the CLI's,
/// a command's): a list of settings in which a later one of a name overrides an earlier one, as
/// it would in the process. Here, below everything that reads one (the sandbox, the model
/// gateway, the environments).
pub fn env_value<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
    env.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The tests' shorthand for an environment.
#[cfg(test)]
pub(crate) mod tests {
    /// An environment of `pairs`, in their order.
    pub(crate) fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}
