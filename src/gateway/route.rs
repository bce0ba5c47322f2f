//! Which requests the relay forwards: a [`Route`] is a method and a path pattern, sent to one
//! of the plan's upstreams. The Anthropic Messages API's are [`ANTHROPIC_ROUTES`]; a model
//! provider's are in its module. Anything else is refused.

use http::Method;

/// The routes forwarded, as (method, path); the query is free. Recorded from the CLI
/// (2.1.x, through this relay against `__test__/support/fake-api.mjs`, with and without
/// `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`: a Planner's WebFetch, an Implementor's
/// multi-turn git session, the output checks' follow-up turns): every request was
/// `POST /v1/messages?beta=true`. `count_tokens` is the same API's token count, which the CLI
/// binary names next to it. WebFetch's domain check goes to api.anthropic.com through the
/// egress proxy, not here. Anything else — `/v1/models`, `/v1/files`, the OAuth and
/// organization APIs the secret would open — is refused.
pub(super) const ANTHROPIC_ROUTES: &[(Method, &str)] = &[
    (Method::POST, "/v1/messages"),
    (Method::POST, "/v1/messages/count_tokens"),
];

/// A forwarded route: `method` and a path matching `path` (`*` stands for one or more
/// characters other than `/`; the query is free), sent to `RelayPlan::upstreams[upstream]`.
#[derive(Clone)]
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub upstream: usize,
}

impl Route {
    pub const fn new(method: Method, path: &'static str, upstream: usize) -> Route {
        Route {
            method,
            path,
            upstream,
        }
    }

    pub(super) fn matches(&self, method: &Method, path: &str) -> bool {
        self.method == method && glob_segments(self.path.as_bytes(), path.as_bytes())
    }
}

/// `pattern` matches `path`, `*` standing for one or more bytes other than `/`.
fn glob_segments(pattern: &[u8], path: &[u8]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((b'*', rest)) => (1..=path.len())
            .take_while(|&n| path[n - 1] != b'/')
            .any(|n| glob_segments(rest, &path[n..])),
        Some((c, rest)) => path.first() == Some(c) && glob_segments(rest, &path[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_pattern_stands_for_one_path_segment_per_star_and_nothing_else() {
        let bedrock = Route::new(Method::POST, "/model/*/invoke", 0);
        assert!(bedrock.matches(&Method::POST, "/model/eu.anthropic.claude-v1%3A0/invoke"));
        for refused in [
            "/model//invoke",
            "/model/a/b/invoke",
            "/model/a/invoke/x",
            "/model/a/invoke-with-response-stream",
            "/models/a/invoke",
        ] {
            assert!(!bedrock.matches(&Method::POST, refused), "{refused}");
        }
        assert!(!bedrock.matches(&Method::GET, "/model/a/invoke"));
        let vertex = Route::new(
            Method::POST,
            "/projects/*/locations/*/publishers/anthropic/models/*:rawPredict",
            0,
        );
        assert!(vertex.matches(
            &Method::POST,
            "/projects/p/locations/us-east5/publishers/anthropic/models/count-tokens:rawPredict"
        ));
        assert!(!vertex.matches(
            &Method::POST,
            "/projects/p/locations/us-east5/publishers/google/models/m:rawPredict"
        ));
        assert!(!vertex.matches(
            &Method::POST,
            "/projects/p/locations/r/publishers/anthropic/models/a/b:rawPredict"
        ));
    }
}
