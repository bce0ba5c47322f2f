//! Planner prompt: the changed specs (full content, plus a diff against the last planned
//! version for modified ones) and every work item in the state with its body.

use std::path::Path;

use git2::{ObjectType, Oid, Repository};
use similar::TextDiff;

use super::{finish, trim_text, Fetcher};
use crate::error::{AdapterError, ErrorCode, Result};
use crate::schema::semantic::Facts;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecChange {
    /// No `lastPlannedSHAs` entry.
    Added,
    /// An entry exists. `diff` is `None` when the entry equals the file's current blob SHA:
    /// the spec only knows added and modified, and a file the engine lists as changed but
    /// whose content is what was last planned is still "previously planned", so it is
    /// labelled modified with no `#### Diff` section rather than an empty one.
    Modified { diff: Option<String> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecContext {
    pub path: String,
    pub content: String,
    pub change: SpecChange,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkItemContext {
    pub id: String,
    pub title: String,
    pub status: String,
    pub body: String,
}

pub async fn assemble(
    fetcher: &Fetcher,
    repo_root: &Path,
    spec_paths: &[String],
) -> Result<(String, Facts)> {
    let state = fetcher.state().await?;
    let planned: Vec<(String, Option<String>)> = spec_paths
        .iter()
        .map(|p| (p.clone(), state.last_planned_sha(p).map(str::to_owned)))
        .collect();
    let root = repo_root.to_path_buf();
    // File and git reads are blocking; they run beside the body fetches.
    let specs = async move {
        tokio::task::spawn_blocking(move || read_specs(&root, &planned))
            .await
            .map_err(|e| AdapterError::context(format!("reading the spec files panicked: {e}")))?
    };
    let ids: Vec<String> = state.work_items.iter().map(|(k, _)| k.clone()).collect();
    let (specs, bodies) = futures::try_join!(specs, fetcher.work_item_bodies(&ids))?;
    let items: Vec<WorkItemContext> = state
        .work_items
        .iter()
        .zip(bodies)
        .map(|((_, item), body)| WorkItemContext {
            id: item.id.clone(),
            title: item.title.clone(),
            status: item.status.clone(),
            body,
        })
        .collect();
    Ok((render(&specs, &items), Facts::planner(&state)))
}

/// Reads each spec fresh and classifies it. The repository is opened only if some spec needs
/// its last planned blob.
pub fn read_specs(
    repo_root: &Path,
    planned: &[(String, Option<String>)],
) -> Result<Vec<SpecContext>> {
    let mut repo: Option<Repository> = None;
    let mut specs = Vec::with_capacity(planned.len());
    for (path, last_sha) in planned {
        let bytes = std::fs::read(repo_root.join(path)).map_err(|e| {
            AdapterError::context(format!(
                "spec file {path:?} could not be read at {}: {e}",
                repo_root.join(path).display()
            ))
            .with_cause(e)
        })?;
        let content = String::from_utf8(bytes).map_err(|e| {
            AdapterError::context(format!("spec file {path:?} is not UTF-8")).with_cause(e)
        })?;
        let change = match last_sha {
            None => SpecChange::Added,
            Some(sha) => {
                let old = parse_blob_sha(path, sha)?;
                let current = Oid::hash_object(ObjectType::Blob, content.as_bytes())
                    .map_err(|e| git_error(format!("hashing spec file {path:?}"), e))?;
                if old == current {
                    SpecChange::Modified { diff: None }
                } else {
                    if repo.is_none() {
                        repo = Some(Repository::open(repo_root).map_err(|e| {
                            git_error(
                                format!("opening the repository at {}", repo_root.display()),
                                e,
                            )
                        })?);
                    }
                    let repo = repo.as_ref().expect("opened above");
                    let old_content = read_blob(repo, path, sha, old)?;
                    let diff = unified_diff(path, &old_content, &content);
                    SpecChange::Modified {
                        diff: (!diff.is_empty()).then_some(diff),
                    }
                }
            }
        };
        specs.push(SpecContext {
            path: path.clone(),
            content,
            change,
        });
    }
    Ok(specs)
}

fn parse_blob_sha(path: &str, sha: &str) -> Result<Oid> {
    // git2 pads short hex with zeros instead of refusing it, which would turn a truncated
    // SHA into a confusing "not found".
    if sha.len() != 40 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(AdapterError::context(format!(
            "lastPlannedSHAs entry for {path:?} is not a 40-hex blob SHA: {sha:?}"
        )));
    }
    Oid::from_str(sha).map_err(|e| git_error(format!("parsing blob SHA {sha:?} of {path:?}"), e))
}

fn read_blob(repo: &Repository, path: &str, sha: &str, oid: Oid) -> Result<String> {
    let blob = repo.find_blob(oid).map_err(|e| {
        AdapterError::context(format!(
            "last planned blob {sha} of spec {path:?} is not in the repository: {}",
            e.message()
        ))
        .with_cause(e)
    })?;
    String::from_utf8(blob.content().to_vec()).map_err(|e| {
        AdapterError::context(format!(
            "last planned blob {sha} of spec {path:?} is not UTF-8"
        ))
        .with_cause(e)
    })
}

fn git_error(doing: String, e: git2::Error) -> AdapterError {
    AdapterError::new(ErrorCode::Context, format!("{doing}: {}", e.message())).with_cause(e)
}

/// `git diff`-style unified diff (`--- a/<path>`, `+++ b/<path>`, 3 lines of context, the
/// "\ No newline at end of file" marker), made in memory. Empty when the texts are equal.
pub fn unified_diff(path: &str, old: &str, new: &str) -> String {
    TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{path}"), &format!("b/{path}"))
        .to_string()
}

pub fn render(specs: &[SpecContext], items: &[WorkItemContext]) -> String {
    let mut blocks = Vec::new();
    if !specs.is_empty() {
        blocks.push("## Changed Specs".to_owned());
        for spec in specs {
            let label = match spec.change {
                SpecChange::Added => "added",
                SpecChange::Modified { .. } => "modified",
            };
            blocks.push(heading_with_text(
                format!("### {} ({label})", spec.path),
                &spec.content,
            ));
            if let SpecChange::Modified { diff: Some(diff) } = &spec.change {
                blocks.push(heading_with_text("#### Diff".to_owned(), diff));
            }
        }
    }
    if !items.is_empty() {
        blocks.push("## Existing Work Items".to_owned());
        for item in items {
            blocks.push(format!(
                "### WorkItem #{} — {}\nStatus: {}",
                item.id, item.title, item.status
            ));
            let body = trim_text(&item.body);
            if !body.is_empty() {
                blocks.push(body.to_owned());
            }
        }
    }
    finish(blocks)
}

/// A heading with its text on the following lines (no blank line between, as the spec's
/// spec and diff entries are laid out).
fn heading_with_text(heading: String, text: &str) -> String {
    let text = trim_text(text);
    if text.is_empty() {
        heading
    } else {
        format!("{heading}\n{text}")
    }
}
