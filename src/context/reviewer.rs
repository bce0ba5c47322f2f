//! Reviewer prompt: the work item, the revision under review with its files, and the review
//! history. No CI section: the spec's reviewer format has none.

use super::{
    fetch_revision_context, finish, render_history, render_revision, render_work_item,
    revision_in_state, work_item_in_state, Fetcher, RevisionContext,
};
use crate::domain::WorkItem;
use crate::error::Result;
use crate::schema::semantic::Facts;

pub async fn assemble(
    fetcher: &Fetcher,
    work_item_id: &str,
    revision_id: &str,
) -> Result<(String, Facts)> {
    let state = fetcher.state().await?;
    let item = work_item_in_state(&state, work_item_id)?;
    let revision = revision_in_state(&state, revision_id)?;
    let (body, ctx) = futures::try_join!(
        fetcher.work_item_body(work_item_id),
        fetch_revision_context(fetcher, revision_id, revision)
    )?;
    Ok((render(item, &body, &ctx), Facts::reviewer(&ctx.files)))
}

pub fn render(item: &WorkItem, body: &str, ctx: &RevisionContext) -> String {
    let mut blocks = Vec::new();
    render_work_item(item, body, &mut blocks);
    render_revision(&ctx.revision, &ctx.files, &mut blocks);
    render_history(&ctx.history, &mut blocks);
    finish(blocks)
}
