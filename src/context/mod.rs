//! Context assembly: resolve the start params' identifiers into the enriched trigger prompt
//! (spec 000 "Context Assembly", spec 002 "Context Assembly Data Requirements").
//!
//! Each role module has two halves: an async `assemble` that gathers data (engine callbacks
//! only through [`fetch::Fetcher`], files and git directly) and a pure `render` that turns
//! that data into text, so the exact format is testable without any I/O.
//!
//! Text layout rules shared by the three formats:
//! - Sections and entries are separated by exactly one blank line, as in the spec's format
//!   blocks; the prompt ends with a single `\n`.
//! - Inserted text (bodies, file contents, patches, diffs) has its trailing line breaks
//!   removed before insertion, so whether a provider ends a body with `\n` never changes the
//!   spacing (and a patch ending in `\n` gets no blank line before its closing fence).
//! - Inserted text that is empty after that is left out together with the blank line that
//!   would have introduced it; so are list sections with no entries.

pub mod fetch;
pub mod implementor;
pub mod planner;
pub mod reviewer;

use std::path::Path;
use std::sync::Arc;

use crate::deps::Deps;
use crate::domain::{
    EngineState, Pipeline, PipelineStatus, ReviewHistory, Revision, RevisionFile, StartParams,
    WorkItem,
};
use crate::error::{AdapterError, Result};
use crate::schema::semantic::Facts;

pub use fetch::{FetchOptions, Fetcher};

/// The enriched prompt `startAgent` sends for `params`. Fails with `ERR_CONTEXT` when data
/// is missing or a callback fails, `ERR_CANCELLED` when `opts.cancel` fires first.
pub async fn build_prompt(
    params: &StartParams,
    deps: &Arc<dyn Deps>,
    repo_root: &Path,
    opts: &FetchOptions,
) -> Result<String> {
    Ok(assemble(params, deps, repo_root, opts).await?.prompt)
}

/// The prompt, and what the agent's output is checked against afterwards (the engine state
/// and revision files fetched for the prompt), so the check sees what the agent was shown
/// and the engine is not called twice.
pub struct Assembled {
    pub prompt: String,
    pub facts: Facts,
}

/// [`build_prompt`] with the facts for the semantic output checks.
pub async fn assemble(
    params: &StartParams,
    deps: &Arc<dyn Deps>,
    repo_root: &Path,
    opts: &FetchOptions,
) -> Result<Assembled> {
    let fetcher = Fetcher::new(deps, opts);
    let (prompt, facts) = match params {
        StartParams::Planner { spec_paths } => {
            planner::assemble(&fetcher, repo_root, spec_paths).await?
        }
        StartParams::Implementor { work_item_id, .. } => (
            implementor::assemble(&fetcher, work_item_id).await?,
            Facts::Implementor,
        ),
        StartParams::Reviewer {
            work_item_id,
            revision_id,
        } => reviewer::assemble(&fetcher, work_item_id, revision_id).await?,
    };
    Ok(Assembled { prompt, facts })
}

/// Data shared by the implementor and reviewer formats once fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionContext {
    pub revision: Revision,
    pub files: Vec<RevisionFile>,
    pub history: ReviewHistory,
}

pub(crate) fn work_item_in_state<'a>(state: &'a EngineState, id: &str) -> Result<&'a WorkItem> {
    state.work_item(id).ok_or_else(|| {
        AdapterError::context(format!("work item {id:?} is not in the engine state"))
    })
}

pub(crate) fn revision_in_state<'a>(state: &'a EngineState, id: &str) -> Result<&'a Revision> {
    state
        .revision(id)
        .ok_or_else(|| AdapterError::context(format!("revision {id:?} is not in the engine state")))
}

/// Fetches what the revision part of a prompt needs, both calls at once.
/// Calls are made with the id the work item or params named (the state's key), which is
/// the id the provider knows.
pub(crate) async fn fetch_revision_context(
    fetcher: &Fetcher,
    revision_id: &str,
    revision: &Revision,
) -> Result<RevisionContext> {
    let (files, history) = futures::try_join!(
        fetcher.revision_files(revision_id),
        fetcher.review_history(revision_id)
    )?;
    Ok(RevisionContext {
        revision: revision.clone(),
        files,
        history,
    })
}

/// Inserted text without its trailing line breaks (see the module doc).
pub fn trim_text(text: &str) -> &str {
    text.trim_end_matches(['\n', '\r'])
}

/// Joins blocks with one blank line and terminates the prompt with a newline.
pub(crate) fn finish(blocks: Vec<String>) -> String {
    let mut out = blocks.join("\n\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// `## Work Item #<id> — <title>`, the body, then `### Status` with the status on the next line.
pub fn render_work_item(item: &WorkItem, body: &str, blocks: &mut Vec<String>) {
    blocks.push(format!("## Work Item #{} — {}", item.id, item.title));
    push_text(blocks, body);
    blocks.push(format!("### Status\n{}", item.status));
}

/// `## Revision #<id> — <title>` and its changed files.
pub fn render_revision(revision: &Revision, files: &[RevisionFile], blocks: &mut Vec<String>) {
    blocks.push(format!("## Revision #{} — {}", revision.id, revision.title));
    if files.is_empty() {
        return;
    }
    blocks.push("### Changed Files".to_owned());
    for file in files {
        blocks.push(render_file(file));
    }
}

/// One changed file. The spec's format block puts the opening fence on the line after the
/// heading and a blank line before the patch; that is reproduced as written.
pub fn render_file(file: &RevisionFile) -> String {
    let heading = format!("#### {} ({})", file.path, file.status);
    match file.patch.as_deref().map(trim_text) {
        Some(patch) => {
            let fence = fence_for(patch);
            format!("{heading}\n{fence}\n\n{patch}\n{fence}")
        }
        None => heading,
    }
}

/// A code fence longer than any run of backticks in `text`: a patch of a Markdown file can
/// hold ``` lines (context lines start with a space, which still closes a fence), and they
/// must not end the code block early.
pub fn fence_for(text: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        if c == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    "`".repeat(if longest >= 3 { longest + 1 } else { 3 })
}

/// The CI section, only for a failed pipeline. Whichever of reason and url are known are
/// printed as `<reason>: <url>`; with neither, the heading alone still says the CI failed.
pub fn render_ci(pipeline: Option<&Pipeline>, blocks: &mut Vec<String>) {
    let Some(pipeline) = pipeline else { return };
    if pipeline.status != PipelineStatus::Failure {
        return;
    }
    blocks.push("### CI Status: FAILURE".to_owned());
    let known: Vec<&str> = [pipeline.reason.as_deref(), pipeline.url.as_deref()]
        .into_iter()
        .flatten()
        .filter(|s| !s.trim().is_empty())
        .collect();
    if !known.is_empty() {
        blocks.push(known.join(": "));
    }
}

/// Prior reviews and inline comments; each section is left out when it has no entries.
/// A comment without a line (a file-level comment) is headed `#### <path> — <author>`.
pub fn render_history(history: &ReviewHistory, blocks: &mut Vec<String>) {
    if !history.reviews.is_empty() {
        blocks.push("### Prior Reviews".to_owned());
        for review in &history.reviews {
            blocks.push(format!(
                "#### Review by {} — {}",
                review.author, review.state
            ));
            push_text(blocks, &review.body);
        }
    }
    if !history.inline_comments.is_empty() {
        blocks.push("### Prior Inline Comments".to_owned());
        for comment in &history.inline_comments {
            let location = match comment.line {
                Some(line) => format!("{}:{line}", comment.path),
                None => comment.path.clone(),
            };
            blocks.push(format!("#### {location} — {}", comment.author));
            push_text(blocks, &comment.body);
        }
    }
}

fn push_text(blocks: &mut Vec<String>, text: &str) {
    let text = trim_text(text);
    if !text.is_empty() {
        blocks.push(text.to_owned());
    }
}
