//! Context assembly: the three prompt formats against golden files (one per branch of each
//! format), and the failure and concurrency behaviour of the fetch layer.
//!
//! Regenerate the golden files with `UPDATE_GOLDEN=1 cargo test --test context`, then read
//! the diff: the files are the reviewed statement of the format.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use claude_runtime_adapter::context::{build_prompt, planner::unified_diff, FetchOptions};
use claude_runtime_adapter::deps::Deps;
use claude_runtime_adapter::domain::{
    EngineState, Pipeline, PipelineStatus, ReviewHistory, ReviewInlineComment, ReviewSubmission,
    Revision, RevisionFile, StartParams, WorkItem,
};
use claude_runtime_adapter::error::{AdapterError, ErrorCode, Result};
use futures::future::BoxFuture;
use futures::FutureExt;
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------
// A Deps made of plain data, with per-id delays, failures and hangs, counting calls.

#[derive(Default)]
struct Counters {
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    calls: Mutex<Vec<String>>,
}

#[derive(Default)]
struct TestDeps {
    state: EngineState,
    bodies: HashMap<String, String>,
    files: HashMap<String, Vec<RevisionFile>>,
    histories: HashMap<String, ReviewHistory>,
    delays: HashMap<String, Duration>,
    default_delay: Duration,
    fail: Option<String>,
    hang: Option<String>,
    counters: Arc<Counters>,
}

impl TestDeps {
    fn answer<T: Send + 'static>(
        &self,
        call: String,
        key: &str,
        value: Option<T>,
    ) -> BoxFuture<'static, Result<T>> {
        let counters = Arc::clone(&self.counters);
        let delay = self.delays.get(key).copied().unwrap_or(self.default_delay);
        let fail = self.fail.as_deref() == Some(key);
        let hang = self.hang.as_deref() == Some(key);
        counters.calls.lock().unwrap().push(call.clone());
        async move {
            let now = counters.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            counters.peak.fetch_max(now, Ordering::SeqCst);
            let _guard = Decrement(Arc::clone(&counters));
            if hang {
                std::future::pending::<()>().await;
            }
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if fail {
                return Err(AdapterError::context("provider said no")
                    .with_cause(std::io::Error::other("HTTP 502 from provider")));
            }
            value.ok_or_else(|| AdapterError::context(format!("{call}: not found")))
        }
        .boxed()
    }

    fn peak(&self) -> usize {
        self.counters.peak.load(Ordering::SeqCst)
    }

    fn calls(&self) -> Vec<String> {
        self.counters.calls.lock().unwrap().clone()
    }
}

struct Decrement(Arc<Counters>);
impl Drop for Decrement {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Deps for TestDeps {
    fn get_state(&self) -> BoxFuture<'static, Result<EngineState>> {
        self.answer("getState".into(), "getState", Some(self.state.clone()))
    }
    fn get_work_item_body(&self, id: String) -> BoxFuture<'static, Result<String>> {
        let body = self.bodies.get(&id).cloned();
        self.answer(format!("body:{id}"), &id, body)
    }
    fn get_revision_files(
        &self,
        revision_id: String,
    ) -> BoxFuture<'static, Result<Vec<RevisionFile>>> {
        let files = self.files.get(&revision_id).cloned();
        self.answer(
            format!("files:{revision_id}"),
            &format!("files:{revision_id}"),
            files,
        )
    }
    fn get_review_history(&self, revision_id: String) -> BoxFuture<'static, Result<ReviewHistory>> {
        let history = self.histories.get(&revision_id).cloned();
        self.answer(
            format!("history:{revision_id}"),
            &format!("history:{revision_id}"),
            history,
        )
    }
}

// ---------------------------------------------------------------------------------------
// Fixtures

fn item(id: &str, title: &str, status: &str, linked: Option<&str>) -> (String, WorkItem) {
    (
        id.to_owned(),
        WorkItem {
            id: id.to_owned(),
            title: title.to_owned(),
            status: status.to_owned(),
            linked_revision: linked.map(str::to_owned),
        },
    )
}

fn revision(id: &str, title: &str, pipeline: Option<Pipeline>) -> (String, Revision) {
    (
        id.to_owned(),
        Revision {
            id: id.to_owned(),
            title: title.to_owned(),
            pipeline,
        },
    )
}

fn pipeline(status: PipelineStatus, reason: Option<&str>, url: Option<&str>) -> Option<Pipeline> {
    Some(Pipeline {
        status,
        reason: reason.map(str::to_owned),
        url: url.map(str::to_owned),
    })
}

fn file(path: &str, status: &str, patch: Option<&str>) -> RevisionFile {
    RevisionFile {
        path: path.to_owned(),
        status: status.to_owned(),
        patch: patch.map(str::to_owned),
    }
}

fn history() -> ReviewHistory {
    ReviewHistory {
        reviews: vec![
            ReviewSubmission {
                author: "alice".into(),
                state: "CHANGES_REQUESTED".into(),
                body: "Please handle the empty input case.\n".into(),
            },
            ReviewSubmission {
                author: "bob".into(),
                state: "COMMENTED".into(),
                body: "".into(),
            },
        ],
        inline_comments: vec![
            ReviewInlineComment {
                path: "src/parse.rs".into(),
                line: Some(42),
                author: "alice".into(),
                body: "This unwrap panics on empty input.".into(),
            },
            ReviewInlineComment {
                path: "README.md".into(),
                line: None,
                author: "bob".into(),
                body: "File-level: mention the new flag.\n".into(),
            },
        ],
    }
}

const PARSE_PATCH: &str = "@@ -1,3 +1,4 @@\n fn parse(s: &str) -> u32 {\n-    s.parse().unwrap()\n+    let s = s.trim();\n+    s.parse().unwrap_or(0)\n }\n";

/// Work item 7 linked to revision r1 whose pipeline is `pipeline`; three files, one binary.
fn implementor_deps(pipe: Option<Pipeline>, hist: ReviewHistory) -> TestDeps {
    let mut deps = TestDeps {
        state: EngineState {
            work_items: vec![item(
                "7",
                "Parse numbers leniently",
                "in-progress",
                Some("r1"),
            )],
            revisions: vec![revision("r1", "Lenient number parsing", pipe)],
            last_planned_shas: vec![],
        },
        ..TestDeps::default()
    };
    deps.bodies.insert(
        "7".into(),
        "Accept surrounding whitespace.\n\n- trim input\n".into(),
    );
    deps.files.insert(
        "r1".into(),
        vec![
            file("src/parse.rs", "modified", Some(PARSE_PATCH)),
            file("assets/logo.png", "added", None),
            file(
                "README.md",
                "modified",
                Some("@@ -1,2 +1,3 @@\n # Tool\n ```sh\n+tool --lenient\n"),
            ),
        ],
    );
    deps.histories.insert("r1".into(), hist);
    deps
}

fn reviewer_deps(hist: ReviewHistory) -> TestDeps {
    let mut deps = implementor_deps(None, hist);
    deps.state.work_items[0].1.status = "in-review".into();
    deps
}

fn implementor(id: &str) -> StartParams {
    StartParams::Implementor {
        work_item_id: id.into(),
        branch_name: "wi-7".into(),
    }
}

fn reviewer(id: &str, rev: &str) -> StartParams {
    StartParams::Reviewer {
        work_item_id: id.into(),
        revision_id: rev.into(),
    }
}

fn planner(paths: &[&str]) -> StartParams {
    StartParams::Planner {
        spec_paths: paths.iter().map(|p| p.to_string()).collect(),
    }
}

/// A repository with `specs/` files written and `old` contents stored as blobs (returned
/// SHAs, same order as `old`).
fn spec_repo(current: &[(&str, &str)], old: &[&str]) -> (tempfile::TempDir, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init(dir.path()).unwrap();
    for (path, content) in current {
        let full = dir.path().join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, content).unwrap();
    }
    let shas = old
        .iter()
        .map(|c| repo.blob(c.as_bytes()).unwrap().to_string())
        .collect();
    (dir, shas)
}

async fn prompt(
    params: &StartParams,
    deps: TestDeps,
    root: &Path,
) -> (Result<String>, Arc<TestDeps>) {
    prompt_with(params, deps, root, FetchOptions::default()).await
}

async fn prompt_with(
    params: &StartParams,
    deps: TestDeps,
    root: &Path,
    opts: FetchOptions,
) -> (Result<String>, Arc<TestDeps>) {
    let deps = Arc::new(deps);
    let dyn_deps: Arc<dyn Deps> = deps.clone();
    (build_prompt(params, &dyn_deps, root, &opts).await, deps)
}

fn no_repo() -> PathBuf {
    PathBuf::from("/nonexistent-repo-root")
}

fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.md"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    if expected != actual {
        let diff = similar::TextDiff::from_lines(expected.as_str(), actual)
            .unified_diff()
            .header("golden", "actual")
            .to_string();
        panic!("prompt differs from {}:\n{diff}", path.display());
    }
}

fn err_code(result: &Result<String>) -> ErrorCode {
    result.as_ref().expect_err("expected an error").code
}

// ---------------------------------------------------------------------------------------
// Planner format

const SPEC_A: &str = "# Spec A\n\nThe tool parses numbers.\n";
const SPEC_B_OLD: &str =
    "# Spec B\n\n1. one\n2. two\n3. three\n4. four\n5. five\n6. six\n7. seven\n8. eight\n";
const SPEC_B_NEW: &str =
    "# Spec B\n\n1. one\n2. TWO\n3. three\n4. four\n5. five\n6. six\n7. seven\n8. eight\n9. nine";

fn planner_items(deps: &mut TestDeps) {
    deps.state.work_items = vec![
        item("12", "Add lenient parsing", "open", None),
        item("3", "Document the CLI", "in-progress", Some("r9")),
        item("40", "Remove legacy flag", "done", None),
    ];
    deps.bodies
        .insert("12".into(), "Trim input before parsing.\n".into());
    deps.bodies
        .insert("3".into(), "Write the README section.".into());
    deps.bodies.insert("40".into(), "".into());
}

#[tokio::test]
async fn planner_prompt_for_added_specs_has_full_content_and_no_diff() {
    let (dir, _) = spec_repo(&[("specs/a.md", SPEC_A), ("specs/c.md", "# Spec C\n")], &[]);
    let mut deps = TestDeps::default();
    deps.state.work_items = vec![item("1", "Existing", "open", None)];
    deps.bodies.insert("1".into(), "Body one.\n".into());
    let (out, _) = prompt(&planner(&["specs/a.md", "specs/c.md"]), deps, dir.path()).await;
    golden("planner_added_only", &out.unwrap());
}

#[tokio::test]
async fn planner_prompt_for_modified_spec_has_unified_diff_against_last_planned_blob() {
    let (dir, shas) = spec_repo(
        &[("specs/a.md", SPEC_A), ("specs/b.md", SPEC_B_NEW)],
        &[SPEC_B_OLD],
    );
    let mut deps = TestDeps::default();
    deps.state.last_planned_shas = vec![("specs/b.md".into(), shas[0].clone())];
    planner_items(&mut deps);
    let (out, _) = prompt(&planner(&["specs/b.md", "specs/a.md"]), deps, dir.path()).await;
    golden("planner_modified_with_diff", &out.unwrap());
}

#[tokio::test]
async fn planner_prompt_without_work_items_omits_the_work_item_section() {
    let (dir, _) = spec_repo(&[("specs/a.md", SPEC_A)], &[]);
    let (out, deps) = prompt(&planner(&["specs/a.md"]), TestDeps::default(), dir.path()).await;
    golden("planner_no_work_items", &out.unwrap());
    assert_eq!(deps.calls(), vec!["getState"]);
}

#[tokio::test]
async fn planner_prompt_lists_every_work_item_in_state_order_not_completion_order() {
    let (dir, _) = spec_repo(&[("specs/a.md", SPEC_A)], &[]);
    let mut deps = TestDeps::default();
    planner_items(&mut deps);
    // The first item settles last.
    deps.delays.insert("12".into(), Duration::from_millis(40));
    deps.delays.insert("3".into(), Duration::from_millis(20));
    let (out, _) = prompt(&planner(&["specs/a.md"]), deps, dir.path()).await;
    golden("planner_multiple_items", &out.unwrap());
}

#[tokio::test]
async fn planner_spec_whose_last_planned_sha_equals_current_blob_is_modified_without_diff() {
    let (dir, shas) = spec_repo(&[("specs/a.md", SPEC_A)], &[SPEC_A]);
    let mut deps = TestDeps::default();
    deps.state.last_planned_shas = vec![("specs/a.md".into(), shas[0].clone())];
    let (out, _) = prompt(&planner(&["specs/a.md"]), deps, dir.path()).await;
    golden("planner_unchanged_since_planned", &out.unwrap());
}

#[test]
fn planner_diff_hunks_match_git_diff() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("old"), SPEC_B_OLD).unwrap();
    std::fs::write(dir.path().join("new"), SPEC_B_NEW).unwrap();
    let Ok(out) = std::process::Command::new("git")
        .args(["diff", "--no-index", "--no-color", "old", "new"])
        .current_dir(dir.path())
        .output()
    else {
        eprintln!("git not available; skipped");
        return;
    };
    let git = String::from_utf8(out.stdout).unwrap();
    let ours = unified_diff("specs/b.md", SPEC_B_OLD, SPEC_B_NEW);
    assert!(
        ours.starts_with("--- a/specs/b.md\n+++ b/specs/b.md\n@@ "),
        "{ours}"
    );
    let hunks = |s: &str| s[s.find("\n@@").unwrap() + 1..].to_owned();
    assert_eq!(hunks(&ours), hunks(&git));
}

// ---------------------------------------------------------------------------------------
// Implementor format

#[tokio::test]
async fn implementor_prompt_without_linked_revision_has_only_the_work_item() {
    let mut deps = implementor_deps(None, history());
    deps.state.work_items[0].1.linked_revision = None;
    deps.state.work_items[0].1.status = "open".into();
    let (out, deps) = prompt(&implementor("7"), deps, &no_repo()).await;
    golden("implementor_no_revision", &out.unwrap());
    assert_eq!(
        deps.calls(),
        vec!["getState", "body:7"],
        "no revision data is fetched"
    );
}

#[tokio::test]
async fn implementor_prompt_with_failed_ci_has_files_ci_reviews_and_inline_comments() {
    let pipe = pipeline(
        PipelineStatus::Failure,
        Some("2 tests failed"),
        Some("https://ci.example/run/81"),
    );
    let (out, deps) = prompt(
        &implementor("7"),
        implementor_deps(pipe, history()),
        &no_repo(),
    )
    .await;
    golden("implementor_ci_failure_with_reviews", &out.unwrap());
    let mut calls = deps.calls();
    calls.sort();
    assert_eq!(calls, vec!["body:7", "files:r1", "getState", "history:r1"]);
}

#[tokio::test]
async fn implementor_prompt_with_successful_ci_and_no_reviews_omits_ci_and_review_sections() {
    let pipe = pipeline(
        PipelineStatus::Success,
        None,
        Some("https://ci.example/run/82"),
    );
    let (out, _) = prompt(
        &implementor("7"),
        implementor_deps(pipe, ReviewHistory::default()),
        &no_repo(),
    )
    .await;
    golden("implementor_ci_success_no_reviews", &out.unwrap());
}

#[tokio::test]
async fn implementor_prompt_with_pending_ci_omits_ci_section() {
    let pipe = pipeline(PipelineStatus::Pending, None, None);
    let (out, _) = prompt(
        &implementor("7"),
        implementor_deps(pipe, history()),
        &no_repo(),
    )
    .await;
    golden("implementor_ci_pending_with_reviews", &out.unwrap());
}

#[tokio::test]
async fn implementor_prompt_with_failed_ci_but_no_reason_or_url_keeps_the_heading() {
    let pipe = pipeline(PipelineStatus::Failure, None, None);
    let mut hist = history();
    hist.reviews.clear();
    let (out, _) = prompt(&implementor("7"), implementor_deps(pipe, hist), &no_repo()).await;
    golden(
        "implementor_ci_failure_unknown_reason_inline_only",
        &out.unwrap(),
    );
}

#[tokio::test]
async fn implementor_prompt_with_failed_ci_and_only_a_url_prints_the_url() {
    let pipe = pipeline(
        PipelineStatus::Failure,
        None,
        Some("https://ci.example/run/83"),
    );
    let (out, _) = prompt(
        &implementor("7"),
        implementor_deps(pipe, ReviewHistory::default()),
        &no_repo(),
    )
    .await;
    assert!(out
        .unwrap()
        .contains("### CI Status: FAILURE\n\nhttps://ci.example/run/83\n"));
}

// ---------------------------------------------------------------------------------------
// Reviewer format

#[tokio::test]
async fn reviewer_prompt_for_first_time_review_omits_history_and_shows_binary_file_without_code_block(
) {
    let (out, _) = prompt(
        &reviewer("7", "r1"),
        reviewer_deps(ReviewHistory::default()),
        &no_repo(),
    )
    .await;
    let out = out.unwrap();
    assert!(
        out.contains("#### assets/logo.png (added)\n\n#### README.md"),
        "{out}"
    );
    golden("reviewer_first_time", &out);
}

#[tokio::test]
async fn reviewer_prompt_with_history_has_reviews_and_inline_comments_and_no_ci() {
    let mut deps = reviewer_deps(history());
    deps.state.revisions[0].1.pipeline = pipeline(PipelineStatus::Failure, Some("lint"), None);
    let (out, _) = prompt(&reviewer("7", "r1"), deps, &no_repo()).await;
    let out = out.unwrap();
    assert!(!out.contains("CI Status"));
    golden("reviewer_with_history", &out);
}

// ---------------------------------------------------------------------------------------
// Failures

#[tokio::test]
async fn missing_spec_file_fails_with_err_context_naming_the_path() {
    let (dir, _) = spec_repo(&[("specs/a.md", SPEC_A)], &[]);
    let (out, _) = prompt(
        &planner(&["specs/a.md", "specs/gone.md"]),
        TestDeps::default(),
        dir.path(),
    )
    .await;
    let err = out.unwrap_err();
    assert_eq!(err.code, ErrorCode::Context);
    assert!(err.message.contains("specs/gone.md"), "{}", err.message);
    assert!(err.cause.is_some());
}

#[tokio::test]
async fn unknown_last_planned_blob_fails_with_err_context() {
    let (dir, _) = spec_repo(&[("specs/a.md", SPEC_A)], &[]);
    let mut deps = TestDeps::default();
    let sha = "0123456789abcdef0123456789abcdef01234567";
    deps.state.last_planned_shas = vec![("specs/a.md".into(), sha.into())];
    let (out, _) = prompt(&planner(&["specs/a.md"]), deps, dir.path()).await;
    let err = out.unwrap_err();
    assert_eq!(err.code, ErrorCode::Context);
    assert!(
        err.message.contains(sha) && err.message.contains("specs/a.md"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn malformed_last_planned_sha_fails_with_err_context() {
    let (dir, _) = spec_repo(&[("specs/a.md", SPEC_A)], &[]);
    let mut deps = TestDeps::default();
    deps.state.last_planned_shas = vec![("specs/a.md".into(), "abc123".into())];
    let (out, _) = prompt(&planner(&["specs/a.md"]), deps, dir.path()).await;
    assert_eq!(err_code(&out), ErrorCode::Context);
}

#[tokio::test]
async fn work_item_not_in_state_fails_with_err_context_naming_the_id() {
    for params in [implementor("99"), reviewer("99", "r1")] {
        let (out, deps) = prompt(&params, implementor_deps(None, history()), &no_repo()).await;
        let err = out.unwrap_err();
        assert_eq!(err.code, ErrorCode::Context);
        assert!(err.message.contains("\"99\""), "{}", err.message);
        assert_eq!(deps.calls(), vec!["getState"]);
    }
}

#[tokio::test]
async fn revision_not_in_state_fails_with_err_context_naming_the_id() {
    let mut deps = implementor_deps(None, history());
    deps.state.revisions.clear();
    let (out, _) = prompt(&implementor("7"), deps, &no_repo()).await;
    let err = out.unwrap_err();
    assert_eq!(err.code, ErrorCode::Context);
    assert!(err.message.contains("\"r1\""), "{}", err.message);

    let (out, _) = prompt(
        &reviewer("7", "r404"),
        implementor_deps(None, history()),
        &no_repo(),
    )
    .await;
    assert!(out.unwrap_err().message.contains("\"r404\""));
}

#[tokio::test]
async fn failing_deps_call_keeps_code_and_cause_and_names_callback_and_id() {
    let mut deps = implementor_deps(None, history());
    deps.fail = Some("7".into());
    let (out, _) = prompt(&implementor("7"), deps, &no_repo()).await;
    let err = out.unwrap_err();
    assert_eq!(err.code, ErrorCode::Context);
    assert!(
        err.message
            .contains("workItemReader.getWorkItemBody(\"7\")")
            && err.message.contains("provider said no"),
        "{}",
        err.message
    );
    assert_eq!(err.cause.unwrap().to_string(), "HTTP 502 from provider");
}

#[tokio::test]
async fn failing_body_fetch_fails_the_planner_prompt() {
    let (dir, _) = spec_repo(&[("specs/a.md", SPEC_A)], &[]);
    let mut deps = TestDeps::default();
    planner_items(&mut deps);
    deps.fail = Some("40".into());
    let (out, _) = prompt(&planner(&["specs/a.md"]), deps, dir.path()).await;
    assert!(out.unwrap_err().message.contains("getWorkItemBody(\"40\")"));
}

#[tokio::test]
async fn deps_call_that_never_settles_times_out_with_err_context() {
    let mut deps = reviewer_deps(history());
    deps.hang = Some("history:r1".into());
    let opts = FetchOptions {
        call_timeout: Duration::from_millis(100),
        ..FetchOptions::default()
    };
    let started = Instant::now();
    let (out, _) = prompt_with(&reviewer("7", "r1"), deps, &no_repo(), opts).await;
    let err = out.unwrap_err();
    assert_eq!(err.code, ErrorCode::Context);
    assert_eq!(
        err.message,
        "getReviewHistory(\"r1\") did not settle within 100 ms"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn cancellation_during_a_pending_call_fails_promptly_with_err_cancelled() {
    let mut deps = reviewer_deps(history());
    deps.hang = Some("files:r1".into());
    let cancel = CancellationToken::new();
    let opts = FetchOptions::with_cancel(cancel.clone());
    let trigger = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let (out, deps) = prompt_with(&reviewer("7", "r1"), deps, &no_repo(), opts).await;
    trigger.await.unwrap();
    assert_eq!(err_code(&out), ErrorCode::Cancelled);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        deps.counters.in_flight.load(Ordering::SeqCst),
        0,
        "pending calls are dropped"
    );
}

#[tokio::test]
async fn already_cancelled_assembly_makes_no_calls() {
    let cancel = CancellationToken::new();
    cancel.cancel();
    let opts = FetchOptions::with_cancel(cancel);
    let (out, deps) = prompt_with(
        &implementor("7"),
        implementor_deps(None, history()),
        &no_repo(),
        opts,
    )
    .await;
    assert_eq!(err_code(&out), ErrorCode::Cancelled);
    assert!(deps.calls().is_empty());
}

// ---------------------------------------------------------------------------------------
// Bounded fan-out

fn many_items(n: usize, delay: Duration) -> TestDeps {
    let mut deps = TestDeps {
        default_delay: delay,
        ..TestDeps::default()
    };
    for i in 0..n {
        let id = i.to_string();
        deps.state
            .work_items
            .push(item(&id, &format!("Item {i}"), "open", None));
        deps.bodies.insert(id, format!("Body {i}"));
    }
    deps
}

#[tokio::test]
async fn planner_for_1000_items_keeps_at_most_16_calls_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let deps = many_items(1000, Duration::from_millis(1));
    let (out, deps) = prompt(&planner(&[]), deps, dir.path()).await;
    let out = out.unwrap();
    assert_eq!(deps.calls().len(), 1001);
    assert!(deps.peak() <= 16, "peak {} calls in flight", deps.peak());
    assert!(deps.peak() > 1, "bodies are fetched concurrently");
    let first = out.find("### WorkItem #0 —").unwrap();
    let last = out.find("### WorkItem #999 —").unwrap();
    assert!(first < last);
}

#[tokio::test]
async fn concurrency_option_sets_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let opts = FetchOptions {
        concurrency: 3,
        ..FetchOptions::default()
    };
    let (out, deps) = prompt_with(
        &planner(&[]),
        many_items(50, Duration::from_millis(2)),
        dir.path(),
        opts,
    )
    .await;
    out.unwrap();
    assert_eq!(deps.peak(), 3);
}
