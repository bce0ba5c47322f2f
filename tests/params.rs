//! Start-param validation: `ERR_INVALID_PARAMS` naming the field, one test per rule.

use std::path::Path;

use claude_runtime_adapter::domain::StartParams;
use claude_runtime_adapter::error::ErrorCode;
use claude_runtime_adapter::params::{validate_branch_name, validate_start_params};

fn implementor(work_item_id: &str, branch_name: &str) -> StartParams {
    StartParams::Implementor {
        work_item_id: work_item_id.into(),
        branch_name: branch_name.into(),
    }
}

fn planner(paths: &[&str]) -> StartParams {
    StartParams::Planner {
        spec_paths: paths.iter().map(|p| p.to_string()).collect(),
    }
}

fn rejected(params: &StartParams, root: &Path, field: &str) {
    let err = validate_start_params(params, root).expect_err("expected rejection");
    assert_eq!(err.code, ErrorCode::InvalidParams);
    assert!(err.message.starts_with(field), "{field}: {}", err.message);
}

fn branch_rejected(name: &str) {
    let err = validate_branch_name("branchName", name).expect_err(name);
    assert_eq!(err.code, ErrorCode::InvalidParams);
    assert!(err.message.starts_with("branchName"), "{}", err.message);
}

fn root() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn valid_params_of_each_role_pass() {
    let dir = root();
    std::fs::create_dir_all(dir.path().join("specs")).unwrap();
    std::fs::write(dir.path().join("specs/a.md"), "A").unwrap();
    validate_start_params(
        &planner(&["specs/a.md", "specs/not-yet.md", "./specs/a.md"]),
        dir.path(),
    )
    .unwrap();
    validate_start_params(&planner(&[]), dir.path()).unwrap();
    validate_start_params(&implementor("7", "feature/wi-7_lenient.parse"), dir.path()).unwrap();
    validate_start_params(
        &StartParams::Reviewer {
            work_item_id: "7".into(),
            revision_id: "r1".into(),
        },
        dir.path(),
    )
    .unwrap();
}

#[test]
fn empty_ids_are_rejected_naming_the_field() {
    let dir = root();
    rejected(&implementor("", "b"), dir.path(), "workItemID");
    rejected(&implementor("  ", "b"), dir.path(), "workItemID");
    rejected(
        &StartParams::Reviewer {
            work_item_id: "7".into(),
            revision_id: "".into(),
        },
        dir.path(),
        "revisionID",
    );
    rejected(
        &StartParams::Reviewer {
            work_item_id: "".into(),
            revision_id: "r".into(),
        },
        dir.path(),
        "workItemID",
    );
    rejected(&implementor("7", ""), dir.path(), "branchName");
}

#[test]
fn empty_spec_path_is_rejected_with_its_index() {
    rejected(&planner(&["specs/a.md", ""]), root().path(), "specPaths[1]");
}

#[test]
fn absolute_spec_path_is_rejected() {
    rejected(&planner(&["/etc/passwd"]), root().path(), "specPaths[0]");
}

#[test]
fn spec_path_with_parent_components_is_rejected() {
    for p in ["../outside.md", "specs/../../outside.md", "specs/.."] {
        rejected(&planner(&[p]), root().path(), "specPaths[0]");
    }
}

#[cfg(unix)]
#[test]
fn spec_path_escaping_through_a_symlink_is_rejected() {
    let outside = root();
    std::fs::write(outside.path().join("secret.md"), "s").unwrap();
    let dir = root();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("specs")).unwrap();
    rejected(&planner(&["specs/secret.md"]), dir.path(), "specPaths[0]");
}

#[cfg(unix)]
#[test]
fn spec_path_through_a_symlink_inside_the_repo_passes() {
    let dir = root();
    std::fs::create_dir_all(dir.path().join("real")).unwrap();
    std::fs::write(dir.path().join("real/a.md"), "A").unwrap();
    std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("specs")).unwrap();
    validate_start_params(&planner(&["specs/a.md"]), dir.path()).unwrap();
}

#[test]
fn branch_with_double_dot_is_rejected() {
    branch_rejected("a..b");
    branch_rejected("../../etc");
}

#[test]
fn branch_starting_with_dash_is_rejected() {
    branch_rejected("-b");
}

#[test]
fn branch_containing_at_brace_or_equal_to_at_is_rejected() {
    branch_rejected("a@{1}");
    branch_rejected("@");
}

#[test]
fn branch_with_control_characters_space_or_special_characters_is_rejected() {
    for name in [
        "a\tb", "a\u{7f}", "a b", "a~1", "a^", "a:b", "a?", "a*", "a[b", "a\\b", "a\nb",
    ] {
        branch_rejected(name);
    }
}

#[test]
fn branch_ending_in_lock_or_dot_is_rejected() {
    branch_rejected("feature.lock");
    branch_rejected("feature.lock/x");
    branch_rejected("feature.");
}

#[test]
fn branch_with_leading_trailing_or_double_slash_is_rejected() {
    branch_rejected("/abs/path");
    branch_rejected("feature/");
    branch_rejected("a//b");
}

#[test]
fn branch_component_starting_with_dot_is_rejected() {
    branch_rejected(".hidden");
    branch_rejected("feature/.x");
}

#[test]
fn branch_head_is_rejected() {
    branch_rejected("HEAD");
}

/// The rules above are git's: where git is installed, it agrees on every case. (`@` is left
/// out: `--branch` expands it to the current branch instead of judging the name, while as a
/// branch name it is refused.)
#[test]
fn branch_rules_agree_with_git_check_ref_format() {
    let cases = [
        "main",
        "feature/x",
        "wi-7",
        "a..b",
        "-b",
        "a@{1}",
        "a b",
        "a~1",
        "a^",
        "a:b",
        "a?",
        "a*",
        "a[b",
        "a\\b",
        "x.lock",
        "x.lock/y",
        "x.",
        "/x",
        "x/",
        "a//b",
        ".x",
        "a/.x",
        "HEAD",
        "a@b",
        "ü/ñ",
        "a.b",
        "a/b/c",
        "a\tb",
    ];
    for name in cases {
        let Ok(out) = std::process::Command::new("git")
            .args(["check-ref-format", "--branch", name])
            .current_dir(std::env::temp_dir())
            .output()
        else {
            eprintln!("git not available; skipped");
            return;
        };
        let git_ok = out.status.success();
        let ours_ok = validate_branch_name("branchName", name).is_ok();
        assert_eq!(ours_ok, git_ok, "{name:?}: ours {ours_ok}, git {git_ok}");
    }
}
