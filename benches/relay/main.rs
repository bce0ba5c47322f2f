//! The model relay's upstream connections per session, against a local TLS upstream (hyper
//! over rustls, keep-alive like the real API): a session of `BENCH_TURNS` requests (default
//! 50), each on a fresh client connection as the CLI's arrive through the sandbox's bridge,
//! beside the peer — one TLS connection per request, which is what the relay did before its
//! pool (`Connection: close` upstream). Prints connections opened and time per request of
//! both, and their ratios (no asserts).
//!
//! `cargo bench --bench relay`

#[cfg(unix)]
mod unix;

#[cfg(unix)]
fn main() {
    unix::main();
}

#[cfg(not(unix))]
fn main() {
    eprintln!("the relay bench runs where the relay listens on a unix socket (not on this system)");
}
