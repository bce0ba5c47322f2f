//! The end of an Implementor on a copy-on-write layer: reading its work out.
//!
//! `cargo bench --bench layer_end` (figures: docs/benchmarks.md; env `BENCH_FILES`, default 100,000 generated files;
//! `BENCH_N`, default 5 rounds; `BENCH_TMP`, where the repository goes, default the system's
//! temp dir; `BENCH_GIT_STATUS`, see below). One layered checkout over the base of the repository's commit; the "agent" (a
//! shell in the checkout's own jail) changes one file; then, alternating which goes first, the
//! extraction as the adapter does it now and the full walk it did before (every file staged
//! through the overlay), measured in the same run. Both patches must be byte-identical.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use claude_runtime_adapter::git::{
    CloneMounts, Confiner, ProvisionRequest, RepoGit, SessionRecord,
};
use claude_runtime_adapter::sandbox::GitJails;
use tokio_util::sync::CancellationToken;

mod support;
use support::{env_or, git};

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// Median, min and max.
fn spread(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// A repository of `files` generated source files in one commit, by one `git fast-import`.
fn generate(root: &Path, files: usize) {
    std::fs::create_dir_all(root).unwrap();
    git(root, &["init", "-q", "-b", "main"]);
    for (k, v) in [
        ("user.name", "Bench"),
        ("user.email", "b@example.com"),
        ("gc.auto", "0"),
    ] {
        git(root, &["config", k, v]);
    }
    let mut stream = String::new();
    let data = |s: &str| format!("data {}\n{s}\n", s.len());
    stream.push_str("commit refs/heads/main\ncommitter Bench <b@example.com> 1700000000 +0000\n");
    stream.push_str(&data("synthetic tree"));
    stream.push_str("M 100644 inline README.md\n");
    stream.push_str(&data("# synthetic\n"));
    for i in 0..files {
        let path = format!(
            "src/m{:02}/s{}/f{:03}.rs",
            i % 100,
            (i / 100) % 10,
            i / 1000
        );
        let body = format!("// generated file {i}\npub fn f{i}() -> u64 {{\n    {i}\n}}\n");
        stream.push_str(&format!("M 100644 inline {path}\n"));
        stream.push_str(&data(&body));
    }
    stream.push_str("done\n");
    let mut child = Command::new("git")
        .args([
            "-c",
            "pack.compression=1",
            "fast-import",
            "--quiet",
            "--done",
        ])
        .current_dir(root)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), stream.as_bytes()).unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    git(root, &["reset", "-q", "--hard", "main"]);
}

fn main() {
    let files = env_or("BENCH_FILES", 100_000);
    let rounds = env_or("BENCH_N", 5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tmp = match std::env::var_os("BENCH_TMP") {
        Some(d) => tempfile::tempdir_in(d).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let root = tmp.path().join("repo");
    let t = Instant::now();
    generate(&root, files);
    let root = std::fs::canonicalize(&root).unwrap();
    println!(
        "repository: {files} files, generated in {}",
        ms(t.elapsed())
    );

    let rg = RepoGit::for_repo(&root);
    let request = ProvisionRequest {
        branch: "agent".into(),
        default_branch: "main".into(),
        setup: None,
        env: std::env::vars().collect(),
        setup_timeout: Duration::from_secs(600),
        session: SessionRecord::default(),
        extraction_timeout: Duration::from_secs(600),
        layered: true,
        continue_within: None,
        model: None,
    };
    let go = CancellationToken::new();
    let t = Instant::now();
    let wt = rt.block_on(rg.provision(&request, &GitJails, &go)).unwrap();
    println!("layered checkout (base made): {}", ms(t.elapsed()));
    let layer = wt
        .layer
        .clone()
        .expect("a layered checkout (overlayfs in a user namespace)");

    // The agent: one file changed, through the overlay, in the checkout's own jail.
    let jail = GitJails.confine(&CloneMounts {
        clone: wt.path.clone(),
        objects: vec![root.join(".git/objects")],
        layer: Some(layer.mounts(&wt.path)),
    });
    // `BENCH_GIT_STATUS=1`: the agent also runs `git status` first, as the CLI does when it
    // starts, which rewrites the checkout's index (its racily clean entries refreshed): the
    // extraction then compares that index with the base's.
    let script = if std::env::var_os("BENCH_GIT_STATUS").is_some() {
        "git status --short >/dev/null && printf '// changed by the agent\\n' >> src/m42/s7/f042.rs"
    } else {
        "printf '// changed by the agent\\n' >> src/m42/s7/f042.rs"
    };
    let out = rt
        .block_on(async {
            jail.command("sh".as_ref(), &["-c".into(), script.into()])
                .current_dir(&wt.path)
                .output()
                .await
        })
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Extraction comes seconds after the agent's last edit, as in a session; by then the
    // base's one verification (in the background since the base was made) is done.
    let t = Instant::now();
    assert!(
        rt.block_on(wt.layer_verified(Duration::from_secs(600))),
        "the base was not verified"
    );
    println!("base verified {} after the edit", ms(t.elapsed()));
    std::thread::sleep(Duration::from_secs(2));

    let (mut new, mut old) = (Vec::new(), Vec::new());
    let mut patches: Vec<String> = Vec::new();
    for round in 0..=rounds {
        let run_new = || {
            let t = Instant::now();
            let p = rt
                .block_on(wt.extract_patch_from_layer())
                .unwrap()
                .expect("read from the layer");
            (t.elapsed(), p)
        };
        let run_old = || {
            let t = Instant::now();
            let p = rt.block_on(wt.extract_patch_walking_the_tree()).unwrap();
            (t.elapsed(), p)
        };
        let ((dn, pn), (dold, pold)) = if round % 2 == 0 {
            let n = run_new();
            (n, run_old())
        } else {
            let o = run_old();
            (run_new(), o)
        };
        assert_eq!(pn, pold, "the two extractions differ");
        patches.push(pn);
        // Round 0 warms the page cache for both.
        if round > 0 {
            new.push(dn);
            old.push(dold);
        }
    }
    assert!(
        patches[0].contains("+// changed by the agent"),
        "{}",
        patches[0]
    );
    let (nm, nlo, nhi) = spread(new);
    let (om, olo, ohi) = spread(old);
    println!(
        "extraction, one file changed of {files} (median of {rounds}, min-max): from the layer \
         {} ({}-{}), walking the tree {} ({}-{}) -> {:.3}x",
        ms(nm),
        ms(nlo),
        ms(nhi),
        ms(om),
        ms(olo),
        ms(ohi),
        nm.as_secs_f64() / om.as_secs_f64()
    );
    rt.block_on(wt.cleanup()).unwrap();
    rt.block_on(rg.release_unused_bases());
    let _: PathBuf = root;
}
