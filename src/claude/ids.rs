//! The session id the CLI runs with. The engine names its runs with any string it likes
//! (`params.sessionID`); the CLI's `--session-id` must be a UUID. A UUID is passed through
//! (normalised to lowercase hyphenated form); any other string maps to a UUIDv5 of it, so the
//! same engine id always gives the same CLI id and different ids give different ones.

use std::sync::LazyLock;

use uuid::Uuid;

/// The UUIDv5 namespace of this adapter's session ids (itself a v5 of a fixed name, so it is
/// reproducible from this file alone).
static NAMESPACE: LazyLock<Uuid> = LazyLock::new(|| {
    Uuid::new_v5(
        &Uuid::NAMESPACE_URL,
        b"urn:claude-runtime-adapter:session-id",
    )
});

/// The `--session-id` for the engine's `id` (any non-empty string).
pub fn cli_session_uuid(id: &str) -> String {
    match Uuid::try_parse(id) {
        // Only the canonical 36-character form counts as "a UUID": `try_parse` also takes the
        // simple, braced and URN forms, which are distinct engine ids.
        Ok(uuid) if id.len() == 36 => uuid.hyphenated().to_string(),
        _ => Uuid::new_v5(&NAMESPACE, id.as_bytes())
            .hyphenated()
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_is_passed_through_in_lowercase() {
        let id = "0F1E2D3C-4B5A-4968-8776-A5B4C3D2E1F0";
        assert_eq!(cli_session_uuid(id), id.to_lowercase());
        let lower = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";
        assert_eq!(cli_session_uuid(lower), lower);
    }

    #[test]
    fn any_other_string_maps_to_a_stable_version_5_uuid() {
        let a = cli_session_uuid("run-42");
        assert_eq!(a, cli_session_uuid("run-42"), "stable");
        let parsed = Uuid::parse_str(&a).unwrap();
        assert_eq!(parsed.get_version_num(), 5);
        assert_eq!(a.len(), 36);
        assert_eq!(a, a.to_lowercase());
    }

    #[test]
    fn different_ids_give_different_uuids() {
        let ids = ["run-1", "run-2", "Run-1", " run-1", "x"];
        let mut seen: Vec<String> = ids.iter().map(|i| cli_session_uuid(i)).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), ids.len());
    }

    #[test]
    fn non_canonical_uuid_spellings_are_distinct_engine_ids() {
        let canonical = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";
        let simple = "6ba7b8109dad11d180b400c04fd430c8";
        let braced = "{6ba7b810-9dad-11d1-80b4-00c04fd430c8}";
        assert_ne!(cli_session_uuid(simple), canonical);
        assert_ne!(cli_session_uuid(braced), canonical);
        assert_ne!(cli_session_uuid(simple), cli_session_uuid(braced));
    }

    #[test]
    fn derived_ids_are_pinned() {
        // Changing the namespace would change every derived id (computed independently with
        // Python's uuid.uuid5).
        assert_eq!(
            NAMESPACE.to_string(),
            "48f60f3f-c4dc-5e54-8126-ad36ee7edf64"
        );
        assert_eq!(
            cli_session_uuid("engine-run"),
            "9e7c6330-8058-5aa9-99b3-63ff81461fc0"
        );
    }
}
