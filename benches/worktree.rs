//! Worktree and patch figures against plain git, measured in the same run (prints, no asserts).
//!
//! `cargo bench --bench worktree` (env `BENCH_FILES`, `BENCH_FILE_KB`, `BENCH_CHANGED` scale it;
//! defaults: 10,000 files of 10 KiB ≈ 100 MB, 5,000 changed files).

use std::path::Path;
use std::time::{Duration, Instant};

use claude_runtime_adapter::git::{ProvisionRequest, RepoGit, SessionRecord, ViewRequest};
use claude_runtime_adapter::sandbox::GitJails;
use tokio_util::sync::CancellationToken;

mod support;
use support::{env_or, git};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let files = env_or("BENCH_FILES", 10_000);
    let kb = env_or("BENCH_FILE_KB", 10);
    let changed = env_or("BENCH_CHANGED", 5_000).min(files);
    let rounds = 3;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    std::fs::create_dir(&root).unwrap();
    git(&root, &["init", "-q", "-b", "main"]);
    for (k, v) in [
        ("user.name", "Bench"),
        ("user.email", "b@example.com"),
        ("gc.auto", "0"),
    ] {
        git(&root, &["config", k, v]);
    }
    let t = Instant::now();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..files {
        let dir = root.join(format!("d{:02}/s{:02}", i % 50, (i / 50) % 20));
        std::fs::create_dir_all(&dir).unwrap();
        let mut body = String::with_capacity(kb * 1024);
        while body.len() < kb * 1024 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            body.push_str(&format!(
                "{i} {seed:016x} some source text for the benchmark\n"
            ));
        }
        std::fs::write(dir.join(format!("f{i}.rs")), body).unwrap();
    }
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-q", "-m", "base"]);
    let root = std::fs::canonicalize(&root).unwrap();
    println!(
        "repository: {files} files x {kb} KiB ({} MB), generated in {}",
        files * kb / 1024,
        ms(t.elapsed())
    );

    // --- base resolution: git2 vs CLI -----------------------------------------------------
    let n = 200;
    let t = Instant::now();
    for _ in 0..n {
        let r = git2::Repository::open(&root).unwrap();
        r.revparse_single("main^{commit}").unwrap();
    }
    let g2 = t.elapsed() / n;
    let t = Instant::now();
    for _ in 0..n {
        git(&root, &["rev-parse", "--verify", "main^{commit}"]);
    }
    let cli = t.elapsed() / n;
    println!(
        "resolve default branch: git2 {:.3} ms, git rev-parse {:.3} ms ({:.1}x)",
        g2.as_secs_f64() * 1e3,
        cli.as_secs_f64() * 1e3,
        cli.as_secs_f64() / g2.as_secs_f64()
    );

    // --- single provision vs `git worktree add` -------------------------------------------
    let rg = RepoGit::for_repo(&root);
    let env: Vec<(String, String)> = std::env::vars().collect();
    let request = |branch: String| ProvisionRequest {
        branch,
        default_branch: "main".into(),
        setup: None,
        env: env.clone(),
        setup_timeout: Duration::from_secs(600),
        session: SessionRecord::default(),
        extraction_timeout: Duration::from_secs(300),
        layered: false,
        continue_within: None,
        model: None,
    };
    let go = CancellationToken::new();
    let (mut plain, mut ours) = (Vec::new(), Vec::new());
    for round in 0..=rounds {
        // Alternate which goes first: the second one pays for the first one's dirty-page
        // writeback, a bias that otherwise lands on one side every time.
        let run_plain = || {
            let p = format!(".worktrees/plain{round}");
            let t = Instant::now();
            git(
                &root,
                &[
                    "worktree",
                    "add",
                    "-q",
                    "-B",
                    &format!("plain{round}"),
                    &p,
                    "main",
                ],
            );
            let d = t.elapsed();
            git(&root, &["worktree", "remove", "--force", &p]);
            git(&root, &["branch", "-D", &format!("plain{round}")]);
            d
        };
        let run_ours = || {
            let t = Instant::now();
            let wt = rt
                .block_on(rg.provision(&request(format!("ours{round}")), &GitJails, &go))
                .unwrap();
            let d = t.elapsed();
            rt.block_on(wt.cleanup()).unwrap();
            d
        };
        let (d_plain, d_ours) = if round % 2 == 0 {
            let p = run_plain();
            (p, run_ours())
        } else {
            let o = run_ours();
            (run_plain(), o)
        };
        if round > 0 {
            // round 0 warms the page cache for both
            plain.push(d_plain);
            ours.push(d_ours);
        }
    }
    let (p, o) = (median(plain), median(ours));
    println!(
        "provision (median of {rounds}): ours {}, git worktree add {} -> ratio {:.2}",
        ms(o),
        ms(p),
        o.as_secs_f64() / p.as_secs_f64()
    );

    // --- a Planner's/Reviewer's view vs an Implementor's clone (before this: no view at all) -
    let view_request = ViewRequest {
        default_branch: "main".into(),
        session: SessionRecord::default(),
        sandboxed: true,
    };
    let (mut views, mut clones, mut view_cleanups) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..=rounds {
        let run_view = || {
            let t = Instant::now();
            let v = rt.block_on(rg.provision_view(&view_request, &go)).unwrap();
            let d = t.elapsed();
            let t = Instant::now();
            rt.block_on(v.cleanup()).unwrap();
            (d, t.elapsed())
        };
        let run_clone = || {
            let t = Instant::now();
            let wt = rt
                .block_on(rg.provision(&request(format!("viewpeer{round}")), &GitJails, &go))
                .unwrap();
            let d = t.elapsed();
            rt.block_on(wt.cleanup()).unwrap();
            d
        };
        let ((d_view, d_rm), d_clone) = if round % 2 == 0 {
            let v = run_view();
            (v, run_clone())
        } else {
            let c = run_clone();
            (run_view(), c)
        };
        if round > 0 {
            views.push(d_view);
            view_cleanups.push(d_rm);
            clones.push(d_clone);
        }
    }
    let (v, c, r) = (median(views), median(clones), median(view_cleanups));
    println!(
        "planner/reviewer repository view (median of {rounds}): make {} + remove {}, per session; \
         the Planner's cost before it: 0 (it saw the repository directory); an Implementor's \
         clone {} -> view/clone ratio {:.2}",
        ms(v),
        ms(r),
        ms(c),
        v.as_secs_f64() / c.as_secs_f64()
    );

    // --- 16 concurrent views: shared (sandboxed sessions) vs one each (`sandbox: false`) ---
    let concurrent_views = |sandboxed: bool| {
        let req = ViewRequest {
            sandboxed,
            ..view_request.clone()
        };
        let t = Instant::now();
        let views = rt.block_on(futures::future::join_all(
            (0..16).map(|_| rg.provision_view(&req, &go)),
        ));
        let wall = t.elapsed();
        let views: Vec<_> = views.into_iter().map(Result::unwrap).collect();
        let mut dirs: Vec<_> = views.iter().map(|v| v.path.clone()).collect();
        dirs.dedup();
        for v in &views {
            rt.block_on(v.cleanup()).unwrap();
        }
        (wall, dirs.len())
    };
    let (shared_wall, shared_dirs) = concurrent_views(true);
    let (own_wall, own_dirs) = concurrent_views(false);
    println!(
        "16 concurrent views: shared (sandboxed) {} for {shared_dirs} checkout(s), one each \
         (sandbox: false) {} for {own_dirs} -> ratio {:.2}",
        ms(shared_wall),
        ms(own_wall),
        shared_wall.as_secs_f64() / own_wall.as_secs_f64()
    );

    // --- patch extraction vs `git add -A && git diff --cached --binary` -------------------
    let wt = rt
        .block_on(rg.provision(&request("patchbench".into()), &GitJails, &go))
        .unwrap();
    let plain_wt = root.join(".worktrees/plainpatch");
    git(
        &root,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "plainpatch",
            plain_wt.to_str().unwrap(),
            "main",
        ],
    );
    for dir in [&wt.path, &plain_wt] {
        for entry in walk(dir).into_iter().take(changed) {
            let mut c = std::fs::read(&entry).unwrap();
            c.extend_from_slice(b"changed by the agent\n");
            std::fs::write(&entry, c).unwrap();
        }
    }
    let (mut plain, mut ours) = (Vec::new(), Vec::new());
    let mut sizes = (0, 0);
    for round in 0..=rounds {
        let t = Instant::now();
        let patch = rt.block_on(wt.extract_patch()).unwrap();
        let d_ours = t.elapsed();
        let t = Instant::now();
        git(&plain_wt, &["add", "-A"]);
        let out = git(
            &plain_wt,
            &["diff", "--cached", "--binary", &wt.base_commit],
        );
        let d_plain = t.elapsed();
        git(&plain_wt, &["reset", "-q"]);
        sizes = (patch.len(), out.len());
        if round > 0 {
            plain.push(d_plain);
            ours.push(d_ours);
        }
    }
    let (p, o) = (median(plain), median(ours));
    println!(
        "patch, {changed} changed files (median of {rounds}): ours {} ({} MB), git add -A && git diff --cached --binary {} ({} MB) -> ratio {:.2}",
        ms(o),
        sizes.0 >> 20,
        ms(p),
        sizes.1 >> 20,
        o.as_secs_f64() / p.as_secs_f64()
    );
    rt.block_on(wt.cleanup()).unwrap();
    git(
        &root,
        &["worktree", "remove", "--force", plain_wt.to_str().unwrap()],
    );
    git(&root, &["branch", "-D", "plainpatch"]);

    // --- 16 concurrent provisions -----------------------------------------------------------
    let t = Instant::now();
    let results = rt.block_on(futures::future::join_all((0..16).map(|i| {
        let rg = rg.clone();
        let (req, go) = (request(format!("conc/{i}")), go.clone());
        async move { rg.provision(&req, &GitJails, &go).await }
    })));
    let wall = t.elapsed();
    let failures = results.iter().filter(|r| r.is_err()).count();
    for r in &results {
        if let Err(e) = r {
            println!("  failure: {e:?}");
        }
    }
    let t = Instant::now();
    rt.block_on(futures::future::join_all(
        results.iter().flatten().map(|w| w.cleanup()),
    ));
    println!(
        "16 concurrent provisions: wall {}, {failures} failures; cleanup of all {}",
        ms(wall),
        ms(t.elapsed())
    );
    let left = String::from_utf8(git(&root, &["worktree", "list"])).unwrap();
    println!("worktrees left: {}", left.lines().count() - 1);
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&d).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            if e.file_name() == ".git" {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}
