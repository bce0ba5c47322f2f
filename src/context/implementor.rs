//! Implementor prompt: the work item, and — when the work item has a linked revision — that
//! revision's files, CI failure and review history (the "resume" tier).

use super::{
    fetch_revision_context, finish, render_ci, render_history, render_revision, render_work_item,
    revision_in_state, work_item_in_state, Fetcher, RevisionContext,
};
use crate::domain::WorkItem;
use crate::error::Result;

pub async fn assemble(fetcher: &Fetcher, work_item_id: &str) -> Result<String> {
    let state = fetcher.state().await?;
    let item = work_item_in_state(&state, work_item_id)?;
    // Checked before any call so a dangling link fails without asking the provider anything.
    let revision = item
        .linked_revision
        .as_deref()
        .map(|id| revision_in_state(&state, id).map(|rev| (id, rev)))
        .transpose()?;
    let (body, revision) = match revision {
        None => (fetcher.work_item_body(work_item_id).await?, None),
        Some((revision_id, revision)) => {
            let (body, ctx) = futures::try_join!(
                fetcher.work_item_body(work_item_id),
                fetch_revision_context(fetcher, revision_id, revision)
            )?;
            (body, Some(ctx))
        }
    };
    Ok(render(item, &body, revision.as_ref()))
}

pub fn render(item: &WorkItem, body: &str, revision: Option<&RevisionContext>) -> String {
    let mut blocks = Vec::new();
    render_work_item(item, body, &mut blocks);
    if let Some(ctx) = revision {
        render_revision(&ctx.revision, &ctx.files, &mut blocks);
        render_ci(ctx.revision.pipeline.as_ref(), &mut blocks);
        render_history(&ctx.history, &mut blocks);
    }
    finish(blocks)
}
