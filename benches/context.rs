//! Planner prompt for 1,000 work items whose body callback resolves after 5 ms, with the
//! default concurrency of 16: measures how close the bounded fan-out gets to its floor of
//! 1,000 × 5 ms / 16 = 312.5 ms, and checks the bound on calls in flight.
//!
//! Run: `cargo bench --profile dev --bench context` (the time is dominated by the sleeps,
//! so an optimised build would only add a long LTO link).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use claude_runtime_adapter::context::{build_prompt, FetchOptions};
use claude_runtime_adapter::deps::Deps;
use claude_runtime_adapter::domain::{
    EngineState, ReviewHistory, RevisionFile, StartParams, WorkItem,
};
use claude_runtime_adapter::error::Result;
use futures::future::BoxFuture;
use futures::FutureExt;

const ITEMS: usize = 1_000;
const BODY_DELAY: Duration = Duration::from_millis(5);

struct SlowBodies {
    state: EngineState,
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl Deps for SlowBodies {
    fn get_state(&self) -> BoxFuture<'static, Result<EngineState>> {
        futures::future::ready(Ok(self.state.clone())).boxed()
    }

    fn get_work_item_body(&self, id: String) -> BoxFuture<'static, Result<String>> {
        let in_flight = Arc::clone(&self.in_flight);
        let peak = Arc::clone(&self.peak);
        async move {
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(BODY_DELAY).await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(format!("Body of work item {id}.\n"))
        }
        .boxed()
    }

    fn get_revision_files(&self, _: String) -> BoxFuture<'static, Result<Vec<RevisionFile>>> {
        futures::future::ready(Ok(Vec::new())).boxed()
    }

    fn get_review_history(&self, _: String) -> BoxFuture<'static, Result<ReviewHistory>> {
        futures::future::ready(Ok(ReviewHistory::default())).boxed()
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut state = EngineState::default();
    for i in 0..ITEMS {
        let id = i.to_string();
        state.work_items.push((
            id.clone(),
            WorkItem {
                id,
                title: format!("Work item {i}"),
                status: "open".into(),
                linked_revision: None,
            },
        ));
    }
    let peak = Arc::new(AtomicUsize::new(0));
    let deps: Arc<dyn Deps> = Arc::new(SlowBodies {
        state,
        in_flight: Arc::new(AtomicUsize::new(0)),
        peak: Arc::clone(&peak),
    });
    let opts = FetchOptions::default();
    let repo = tempfile::tempdir().expect("temp dir");
    let params = StartParams::Planner { spec_paths: vec![] };

    let started = Instant::now();
    let prompt = runtime
        .block_on(build_prompt(&params, &deps, repo.path(), &opts))
        .expect("planner prompt");
    let wall = started.elapsed();

    let floor = BODY_DELAY.as_secs_f64() * 1000.0 * ITEMS as f64 / opts.concurrency as f64;
    let wall_ms = wall.as_secs_f64() * 1000.0;
    println!(
        "planner prompt: {ITEMS} work items, body delay {BODY_DELAY:?}, concurrency {}",
        opts.concurrency
    );
    println!("prompt length:  {} bytes", prompt.len());
    println!("wall time:      {wall_ms:.1} ms");
    println!("peak in flight: {}", peak.load(Ordering::SeqCst));
    println!(
        "bound:          {ITEMS} x {BODY_DELAY:?} / {} = {floor:.1} ms",
        opts.concurrency
    );
    println!("ratio:          {:.2}x the bound", wall_ms / floor);
    assert!(peak.load(Ordering::SeqCst) <= opts.concurrency);
}
