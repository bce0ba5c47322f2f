//! What a session's disk watch costs (`sandbox.limits.diskMiB`, `diskFloorMiB`; src/disk.rs).
//!
//! `cargo bench --bench disk_watch` (figures: docs/benchmarks.md; env `BENCH_N`, default 15
//! rounds; `BENCH_TMP`, where the trees go, default the system's temp dir). For trees of 100,
//! 10,000 and 100,000 files of 1 KiB (100 per directory: what a layer's `upper` holds after a
//! small change, after a build, after an `npm install` in the checkout), one walk as the watch
//! does it ([`allocated`]), against GNU `du -s` (the same `lstat` walk, a process of its own)
//! in the same run, interleaved; the CPU share one watching session costs at the watch's
//! interval (a walk every 250 ms, or 20 walks' time for a large tree); and the `statvfs` a
//! floor-only session makes per look. Both walks must agree on the bytes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use claude_runtime_adapter::disk::{allocated, space, MAX_ENTRIES, WATCH_EVERY};

mod support;
use support::env_or;

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// `files` files of 1 KiB under `root`, 100 per directory.
fn tree(root: &Path, files: usize) {
    for i in 0..files {
        let dir = root.join(format!("d{}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&dir).unwrap();
        }
        std::fs::write(dir.join(format!("f{i}")), [b'x'; 1024]).unwrap();
    }
}

/// `du -s` in bytes of allocated blocks, and how long it took.
fn du(root: &Path) -> (u64, Duration) {
    let started = Instant::now();
    let out = Command::new("du")
        .args(["-s", "--block-size=1"])
        .arg(root)
        .output()
        .unwrap();
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    (
        text.split_whitespace().next().unwrap().parse().unwrap(),
        took,
    )
}

fn main() {
    let n = env_or("BENCH_N", 15);
    let base = std::env::var_os("BENCH_TMP").map_or_else(std::env::temp_dir, PathBuf::from);
    println!("| files | watch walk, median | `du -s`, median | ratio | one session's CPU share |");
    println!("|---|---|---|---|---|");
    for files in [100, 10_000, 100_000] {
        let dir = tempfile::tempdir_in(&base).unwrap();
        tree(dir.path(), files);
        let roots = vec![dir.path().to_path_buf()];
        // Warm: the watch walks a tree the session is writing, whose metadata is cached.
        let _ = allocated(&roots, MAX_ENTRIES);
        let (mut ours, mut peer) = (Vec::new(), Vec::new());
        for round in 0..n {
            let one = || {
                let started = Instant::now();
                let a = allocated(&roots, MAX_ENTRIES);
                (a.bytes, started.elapsed())
            };
            let (a, b) = if round % 2 == 0 {
                let a = one();
                (a, du(dir.path()))
            } else {
                let b = du(dir.path());
                (one(), b)
            };
            assert_eq!(a.0, b.0, "the walk and du disagree");
            ours.push(a.1);
            peer.push(b.1);
        }
        let (walk, du) = (median(ours), median(peer));
        let every = WATCH_EVERY.max(walk * 20);
        println!(
            "| {files} | {} | {} | {:.2}× | {:.2} % (a walk every {}) |",
            ms(walk),
            ms(du),
            walk.as_secs_f64() / du.as_secs_f64(),
            100.0 * walk.as_secs_f64() / every.as_secs_f64(),
            ms(every)
        );
    }
    let at = base.clone();
    let rounds = 10_000;
    let started = Instant::now();
    for _ in 0..rounds {
        assert!(space(&at).is_some());
    }
    println!(
        "\nstatvfs per look (a session with the floor only, far from it): {:.2} µs",
        started.elapsed().as_secs_f64() * 1e6 / rounds as f64
    );
}
