//! Processes and their owners, below everything that starts one: [`tree`] finds and kills
//! everything a started process started in turn; [`owner`] records which process (pid, start
//! time, host) made something the adapter leaves on disk or in a cluster, so the next adapter
//! can tell a dead engine's leftovers from a live one's.

pub mod owner;
pub mod tree;

pub use owner::Owner;
