//! The data the adapter exchanges with the engine (specs 002 and 004): start params, the
//! engine state it reads, provider data, and review history. Napi-free; the binding converts.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Planner,
    Implementor,
    Reviewer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Planner => "planner",
            Role::Implementor => "implementor",
            Role::Reviewer => "reviewer",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "planner" => Some(Role::Planner),
            "implementor" => Some(Role::Implementor),
            "reviewer" => Some(Role::Reviewer),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartParams {
    Planner {
        spec_paths: Vec<String>,
    },
    Implementor {
        work_item_id: String,
        branch_name: String,
    },
    Reviewer {
        work_item_id: String,
        revision_id: String,
    },
}

impl StartParams {
    pub fn role(&self) -> Role {
        match self {
            StartParams::Planner { .. } => Role::Planner,
            StartParams::Implementor { .. } => Role::Implementor,
            StartParams::Reviewer { .. } => Role::Reviewer,
        }
    }

    pub fn work_item_id(&self) -> Option<&str> {
        match self {
            StartParams::Planner { .. } => None,
            StartParams::Implementor { work_item_id, .. }
            | StartParams::Reviewer { work_item_id, .. } => Some(work_item_id),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkItem {
    pub id: String,
    pub title: String,
    pub status: String,
    pub linked_revision: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PipelineStatus {
    Pending,
    Success,
    Failure,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pipeline {
    pub status: PipelineStatus,
    pub url: Option<String>,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revision {
    pub id: String,
    pub title: String,
    pub pipeline: Option<Pipeline>,
}

/// What the adapter reads of the engine's state. Entries keep the order the engine gave
/// (a JS `Map`'s insertion order or an object's key order), so prompts are stable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineState {
    pub work_items: Vec<(String, WorkItem)>,
    pub revisions: Vec<(String, Revision)>,
    pub last_planned_shas: Vec<(String, String)>,
}

impl EngineState {
    pub fn work_item(&self, id: &str) -> Option<&WorkItem> {
        self.work_items
            .iter()
            .find(|(k, _)| k == id)
            .map(|(_, v)| v)
    }

    pub fn revision(&self, id: &str) -> Option<&Revision> {
        self.revisions.iter().find(|(k, _)| k == id).map(|(_, v)| v)
    }

    pub fn last_planned_sha(&self, path: &str) -> Option<&str> {
        self.last_planned_shas
            .iter()
            .find(|(k, _)| k == path)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevisionFile {
    pub path: String,
    pub status: String,
    pub patch: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewSubmission {
    pub author: String,
    pub state: String,
    pub body: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewInlineComment {
    pub path: String,
    pub line: Option<i64>,
    pub author: String,
    pub body: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewHistory {
    pub reviews: Vec<ReviewSubmission>,
    pub inline_comments: Vec<ReviewInlineComment>,
}
