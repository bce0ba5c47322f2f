//! `config.backend`: `"local"` (the default) or `{ kubernetes: {...} }`. Names, label and
//! annotation keys and values, quantities and tolerations are checked by the API server's own
//! rules (apimachinery's validation), so a mistake is a config error naming the field at
//! `createClaudeAdapter`, not a pod the API server refuses at the first session.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::Duration;

use regex::Regex;
use serde_json::{Map, Value};

use super::{seconds, BackendConfig, Problems, Reader};

/// Room for a pull of a large image on a cold node, and for a scheduler that waits for a node.
const DEFAULT_POD_START_TIMEOUT_S: f64 = 120.0;

/// The adapter's own label and annotation keys (the owner rule of the sweep relies on them,
/// so a user's value must never stand in for ours): this prefix, and `MANAGED_BY`.
pub const KEY_PREFIX: &str = "claude-runtime-adapter/";
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// `config.backend.kubernetes`: where and how a session's pod runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// A DNS-1123 label.
    pub namespace: String,
    /// The image sessions run in (`None`: the repository's `.devcontainer/devcontainer.json`
    /// image, else [`KubernetesConfig::runtime_image`]).
    pub image: Option<String>,
    /// The adapter's session image: it carries the runtime (pod agent, sandbox, bridges, CLI)
    /// that an init container copies into a pod of any other image. Given as
    /// `runtimeImage`, or `image` when that is not given (then `image` is the session image).
    pub runtime_image: String,
    /// `nodeCache`: an absolute directory on every node (a `hostPath`) where pods of another
    /// image than the runtime's keep one copy of the runtime per node and runtime version,
    /// instead of a copy in each pod; and where sandboxed sessions keep their checkout's base
    /// once per node (`environment::kubernetes::node_base`). `None`: each such pod copies the
    /// runtime, and every pod makes its own checkout.
    pub node_cache: Option<String>,
    pub image_pull_policy: PullPolicy,
    /// `None` = the usual sources: `KUBECONFIG`, `~/.kube/config`, the in-cluster service
    /// account.
    pub kubeconfig: Option<PathBuf>,
    /// `None` = the kubeconfig's current context.
    pub context: Option<String>,
    /// `resources.requests` / `resources.limits`: resource name (`cpu`, `memory`,
    /// `ephemeral-storage`) → quantity.
    pub requests: BTreeMap<String, String>,
    pub limits: BTreeMap<String, String>,
    /// True when `limits`' `ephemeral-storage` is `sandbox.limits.diskMiB`'s ([`disk_limit`]),
    /// which an eviction past it then names.
    pub storage_from_disk_mib: bool,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    pub runtime_class_name: Option<String>,
    pub service_account_name: Option<String>,
    /// The user's own, besides the adapter's (whose keys they may not use).
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Bound on a pod reaching Running (`ERR_PROVISION` past it).
    pub pod_start_timeout: Duration,
    /// `warmPods`: how many pods are kept started before any session asks for one
    /// (`environment::kubernetes::warm`); each serves one session. 0: none.
    pub warm_pods: usize,
    /// `engineId`: the engine's identity across processes and hosts (a DNS label). Its pods
    /// are labelled with it, and the process holding its Lease sweeps those of any other
    /// process (`environment::kubernetes::lease`). `None`: pods are the host's, swept only by
    /// an adapter on the same host.
    pub engine_id: Option<String>,
    /// `engineLease`: how long the identity's Lease stands without a renewal, so how long a
    /// restarted engine waits for a predecessor it cannot see (on another host) to be gone.
    pub engine_lease: Duration,
}

/// `imagePullPolicy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    #[default]
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

/// One of `tolerations`, as the pod spec takes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Toleration {
    pub key: Option<String>,
    /// `Exists` or `Equal` (`None`: the API server's default, `Equal`).
    pub operator: Option<String>,
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute` (`None`: every effect).
    pub effect: Option<String>,
    pub toleration_seconds: Option<i64>,
}

const FIELDS: &[&str] = &[
    "namespace",
    "image",
    "runtimeImage",
    "nodeCache",
    "imagePullPolicy",
    "kubeconfig",
    "context",
    "resources",
    "nodeSelector",
    "tolerations",
    "runtimeClassName",
    "serviceAccountName",
    "labels",
    "annotations",
    "podStartTimeout",
    "warmPods",
    "engineId",
    "engineLease",
];
const RESOURCE_NAMES: &[&str] = &["cpu", "memory", "ephemeral-storage"];
const TOLERATION_FIELDS: &[&str] = &["key", "operator", "value", "effect", "tolerationSeconds"];
const OPERATORS: &[&str] = &["Exists", "Equal"];
const EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];
/// `engineLease`: long enough that an API server's passing failure (renewals come every third
/// of it) does not hand the identity over; short enough that a rescheduled engine takes its
/// pods over soon.
const DEFAULT_ENGINE_LEASE_S: f64 = 30.0;
/// A DNS label less the Lease name's `cra-engine-`.
const MAX_ENGINE_ID: usize = 52;
const MIN_ENGINE_LEASE_S: f64 = 3.0;
const MAX_ENGINE_LEASE_S: f64 = 3600.0;
/// Bound on `warmPods`: idle pods hold the cluster's resources.
const MAX_WARM_PODS: usize = 64;
/// The API server's limit on all of a pod's annotations together (keys and values).
const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

static DNS_LABEL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$").unwrap());
static DNS_SUBDOMAIN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$").unwrap()
});
/// A label value, and the name part of a qualified name (without the empty case).
static NAME_PART: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$").unwrap());
/// A resource quantity (apimachinery's `resource.Quantity` without a sign: a pod's resources
/// cannot be negative): a decimal number, then an exponent or a decimal or binary suffix.
static QUANTITY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$").unwrap()
});

pub fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && DNS_LABEL.is_match(s)
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && DNS_SUBDOMAIN.is_match(s)
}

/// A label or annotation key: `[prefix/]name`, the prefix a DNS subdomain, the name at most 63
/// characters of letters, digits, `-`, `_`, `.`, starting and ending alphanumeric.
fn is_qualified_name(s: &str) -> bool {
    let name = match s.split_once('/') {
        Some((prefix, name)) => {
            if !is_dns_subdomain(prefix) {
                return false;
            }
            name
        }
        None => s,
    };
    name.len() <= 63 && NAME_PART.is_match(name)
}

pub fn is_label_value(s: &str) -> bool {
    s.is_empty() || (s.len() <= 63 && NAME_PART.is_match(s))
}

fn is_reserved_key(k: &str) -> bool {
    k.starts_with(KEY_PREFIX) || k == MANAGED_BY
}

/// A quantity's value, to compare a request with its limit (an f64 is exact enough for that).
fn quantity_value(q: &str) -> Option<f64> {
    let c = QUANTITY.captures(q)?;
    let number: f64 = c.get(1)?.as_str().parse().ok()?;
    // `E` alone is the decimal suffix exa; `E` with digits an exponent; `Ei` binary.
    let scale = match c.get(3).map(|m| m.as_str()) {
        None => 1.0,
        Some(s) if s.ends_with('i') => 1024f64.powi("KMGTPE".find(&s[..1])? as i32 + 1),
        Some(s) if s.len() > 1 => 10f64.powi(s[1..].parse().ok()?),
        // The space stands for no suffix (10^0) between milli and kilo.
        Some(s) => 1000f64.powi("num kMGTPE".find(s)? as i32 - 3),
    };
    Some(number * scale)
}

/// `config.backend`: absent, `null` or `"local"` = local; `{ kubernetes: {...} }` (that key
/// alone) = one pod per session.
pub(super) fn backend(v: Option<&Value>, problems: &mut Problems) -> BackendConfig {
    match v {
        None | Some(Value::Null) => BackendConfig::Local,
        Some(Value::String(s)) if s == "local" => BackendConfig::Local,
        Some(Value::Object(o)) if o.len() == 1 && o.contains_key("kubernetes") => {
            if cfg!(not(unix)) {
                // The pod's stream tunnels to the relay's and proxy's unix sockets.
                problems.add(
                    "backend.kubernetes",
                    "needs an engine on Linux or macOS (the pod's network goes through unix sockets of the engine)",
                );
                return BackendConfig::Local;
            }
            match o.get("kubernetes") {
                Some(Value::Object(k)) => kubernetes(k, problems)
                    .map(Box::new)
                    .map_or(BackendConfig::Local, BackendConfig::Kubernetes),
                _ => {
                    problems.add("backend.kubernetes", "must be an object");
                    BackendConfig::Local
                }
            }
        }
        Some(_) => {
            problems.add(
                "backend",
                "must be \"local\" or an object { kubernetes: { namespace, image, ... } }",
            );
            BackendConfig::Local
        }
    }
}

/// Every field of `backend.kubernetes`; `None` when something was wrong (each problem recorded).
fn kubernetes(obj: &Map<String, Value>, problems: &mut Problems) -> Option<KubernetesConfig> {
    let before = problems.0.len();
    let mut r = Reader {
        obj,
        problems,
        prefix: "backend.kubernetes.",
    };
    unknown_fields(&mut r, "", FIELDS);
    let namespace = r.string("namespace");
    if r.obj.get("namespace").is_some_and(Value::is_string) && !is_dns_label(&namespace) {
        r.add(
            "namespace",
            format!("must be a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending alphanumeric (got {namespace:?})"),
        );
    }
    let image = image_ref(&mut r, "image");
    let runtime_image = image_ref(&mut r, "runtimeImage");
    let runtime_image = match (&image, runtime_image) {
        (_, Some(runtime)) => runtime,
        (Some(image), None) => image.clone(),
        (None, None) => {
            if !r.obj.contains_key("image") && !r.obj.contains_key("runtimeImage") {
                r.add(
                    "image",
                    "must be given, or runtimeImage (the adapter's session image; sessions then \
                     run in the repository's .devcontainer/devcontainer.json image or in it)",
                );
            }
            String::new()
        }
    };
    let node_cache = node_path(&mut r, "nodeCache");
    let image_pull_policy = match r.opt_string("imagePullPolicy").as_deref() {
        None | Some("IfNotPresent") => PullPolicy::IfNotPresent,
        Some("Always") => PullPolicy::Always,
        Some("Never") => PullPolicy::Never,
        Some(other) => {
            r.add(
                "imagePullPolicy",
                format!("must be \"Always\", \"IfNotPresent\" or \"Never\" (got {other:?})"),
            );
            PullPolicy::IfNotPresent
        }
    };
    let kubeconfig = r
        .opt_string("kubeconfig")
        .and_then(|p| match std::path::absolute(&p) {
            Ok(p) => Some(p),
            Err(e) => {
                r.add("kubeconfig", e);
                None
            }
        });
    let context = r.opt_string("context");
    let (requests, limits) = resources(&mut r);
    let node_selector = string_map(&mut r, "nodeSelector", |k, v| {
        label_key_problem(k).or_else(|| label_value_problem(v))
    });
    let tolerations = tolerations(&mut r);
    let runtime_class_name = subdomain(&mut r, "runtimeClassName");
    let service_account_name = subdomain(&mut r, "serviceAccountName");
    let labels = string_map(&mut r, "labels", |k, v| {
        reserved_problem(k)
            .or_else(|| label_key_problem(k))
            .or_else(|| label_value_problem(v))
    });
    let annotations = string_map(&mut r, "annotations", |k, _| {
        reserved_problem(k).or_else(|| label_key_problem(k))
    });
    let size: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_ANNOTATIONS_BYTES {
        r.add(
            "annotations",
            format!(
                "must total at most {MAX_ANNOTATIONS_BYTES} bytes of keys and values (got {size})"
            ),
        );
    }
    let pod_start_timeout = r.seconds("podStartTimeout", DEFAULT_POD_START_TIMEOUT_S);
    let warm_pods = r.count("warmPods", 0.0, 0.0, MAX_WARM_PODS as f64) as usize;
    let engine_id = r.opt_string("engineId");
    if let Some(id) = engine_id.as_deref() {
        // Its Lease is named `cra-engine-<id>` (a DNS name), its pods labelled with it.
        if !is_dns_label(id) || id.len() > MAX_ENGINE_ID {
            r.add("engineId", format!("must be at most {MAX_ENGINE_ID} lowercase letters, digits and '-', starting and ending alphanumeric (got {id:?})"));
        }
    }
    let engine_lease = r.count(
        "engineLease",
        DEFAULT_ENGINE_LEASE_S,
        MIN_ENGINE_LEASE_S,
        MAX_ENGINE_LEASE_S,
    );
    if r.problems.0.len() > before {
        return None;
    }
    Some(KubernetesConfig {
        namespace,
        image,
        runtime_image,
        node_cache,
        image_pull_policy,
        kubeconfig,
        context,
        requests,
        limits,
        storage_from_disk_mib: false,
        node_selector,
        tolerations,
        runtime_class_name,
        service_account_name,
        labels,
        annotations,
        pod_start_timeout: seconds(pod_start_timeout),
        warm_pods,
        engine_id,
        engine_lease: seconds(engine_lease),
    })
}

/// `backend.kubernetes` from its JSON, for the tests of what it drives (the pod spec): the
/// config a user's JSON makes. Panics naming the problems of one that is not valid. (Unix: the
/// backend that uses it is.)
#[cfg(all(test, unix))]
pub(crate) fn from_json(v: &Value) -> KubernetesConfig {
    let mut problems = Problems::default();
    let config = v.as_object().and_then(|o| kubernetes(o, &mut problems));
    config.unwrap_or_else(|| panic!("{}", problems.into_error().message))
}

/// An image reference when given: non-empty, no whitespace (what the API server would refuse).
fn image_ref(r: &mut Reader<'_>, key: &str) -> Option<String> {
    match r.obj.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s))
            if !s.is_empty() && !s.chars().any(|c| c.is_whitespace() || c.is_control()) =>
        {
            Some(s.clone())
        }
        Some(Value::String(s)) => {
            r.add(
                key,
                format!("must be a non-empty image reference without whitespace (got {s:?})"),
            );
            None
        }
        Some(_) => {
            r.add(key, "must be a string when given");
            None
        }
    }
}

/// A directory on the nodes when given: absolute, normalised (no `.`, `..` or empty component,
/// no trailing `/`), not `/` itself, printable: the path the kubelet mounts as it is written.
fn node_path(r: &mut Reader<'_>, key: &str) -> Option<String> {
    let s = r.opt_string(key)?;
    let normal = s.len() > 1
        && s.starts_with('/')
        && s[1..]
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
        && !s.chars().any(char::is_control);
    if normal {
        return Some(s);
    }
    r.add(
        key,
        format!(
            "must be an absolute, normalised directory path on the nodes other than / \
             (no '.', '..', '//' or trailing '/'; got {s:?})"
        ),
    );
    None
}

/// A misspelt field is a problem, not a setting silently ignored (a `nodeselector` that pins
/// nothing, a `limit` that limits nothing).
fn unknown_fields(r: &mut Reader<'_>, path: &str, known: &[&str]) {
    let unknown: Vec<String> = r
        .obj
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .cloned()
        .collect();
    for k in unknown {
        r.add(
            &format!("{path}{k}"),
            format!("is not a field (known: {})", known.join(", ")),
        );
    }
}

fn reserved_problem(k: &str) -> Option<String> {
    is_reserved_key(k).then(|| {
        format!("uses a key the adapter sets itself ({KEY_PREFIX}* and {MANAGED_BY} are reserved)")
    })
}

fn label_key_problem(k: &str) -> Option<String> {
    (!is_qualified_name(k)).then(|| "has an invalid key: a key is [a DNS subdomain prefix/]a name of at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric".to_string())
}

fn label_value_problem(v: &str) -> Option<String> {
    (!is_label_value(v)).then(|| format!("must be a label value: empty or at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric (got {v:?})"))
}

/// An optional object of strings at `key`, each entry checked by `problem(key, value)`.
fn string_map(
    r: &mut Reader<'_>,
    key: &str,
    problem: impl Fn(&str, &str) -> Option<String>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let m = match r.obj.get(key) {
        None | Some(Value::Null) => return out,
        Some(Value::Object(m)) => m,
        Some(_) => {
            r.add(key, "must be an object of strings");
            return out;
        }
    };
    for (k, v) in m {
        let name = format!("{key}[{k:?}]");
        match v.as_str() {
            Some(s) => match problem(k, s) {
                Some(why) => r.add(&name, why),
                None => {
                    out.insert(k.clone(), s.to_string());
                }
            },
            None => r.add(&name, "must be a string"),
        }
    }
    out
}

fn subdomain(r: &mut Reader<'_>, key: &str) -> Option<String> {
    let s = r.opt_string(key)?;
    if is_dns_subdomain(&s) {
        return Some(s);
    }
    r.add(key, format!("must be a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', at most 253 (got {s:?})"));
    None
}

/// `resources: { requests?, limits? }`, each `{ cpu?, memory?, "ephemeral-storage"? }` of
/// quantity strings; a request above its limit is refused here as the API server would.
fn resources(r: &mut Reader<'_>) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let obj = match r.obj.get("resources") {
        None | Some(Value::Null) => return Default::default(),
        Some(Value::Object(o)) => o,
        Some(_) => {
            r.add("resources", "must be an object { requests?, limits? }");
            return Default::default();
        }
    };
    let mut inner = Reader {
        obj,
        problems: r.problems,
        prefix: "backend.kubernetes.resources.",
    };
    unknown_fields(&mut inner, "", &["requests", "limits"]);
    let mut quantities = |key: &str| {
        string_map(&mut inner, key, |k, v| {
            if !RESOURCE_NAMES.contains(&k) {
                Some(format!(
                    "is not a resource this adapter sets (known: {})",
                    RESOURCE_NAMES.join(", ")
                ))
            } else if quantity_value(v).is_none() {
                Some(format!(
                    "must be a quantity such as \"500m\", \"2\", \"512Mi\" or \"1G\" (got {v:?})"
                ))
            } else {
                None
            }
        })
    };
    let requests = quantities("requests");
    let limits = quantities("limits");
    for (name, request) in &requests {
        let Some(limit) = limits.get(name) else {
            continue;
        };
        if quantity_value(request) > quantity_value(limit) {
            inner.add(
                &format!("requests[{name:?}]"),
                format!("must not exceed limits[{name:?}] ({request} > {limit})"),
            );
        }
    }
    (requests, limits)
}

/// `sandbox.limits.diskMiB` (`disk`, bytes) as the pods' `ephemeral-storage` limit, where
/// `resources.limits` gave none: a pod's files are then bounded as a local session's are (the
/// kubelet evicts the pod past it, which ends the session `ERR_RESOURCE_LIMIT`). A request
/// above it would be refused by the API server at every pod: a problem here.
pub(super) fn disk_limit(k: &mut KubernetesConfig, disk: u64, problems: &mut Problems) {
    const STORAGE: &str = "ephemeral-storage";
    if k.limits.contains_key(STORAGE) {
        return;
    }
    let limit = format!("{}Mi", disk >> 20);
    if let Some(request) = k.requests.get(STORAGE) {
        if quantity_value(request) > quantity_value(&limit) {
            problems.add(
                "sandbox.limits.diskMiB",
                format!(
                    "is the pods' ephemeral-storage limit ({limit}, backend.kubernetes.resources.limits gives none) and must not be below backend.kubernetes.resources.requests[\"{STORAGE}\"] ({request})"
                ),
            );
            return;
        }
    }
    k.limits.insert(STORAGE.to_string(), limit);
    k.storage_from_disk_mib = true;
}

/// An optional string field of a toleration, one of `allowed` when given.
fn field(t: &mut Reader<'_>, key: &str, allowed: Option<&[&str]>) -> Option<String> {
    let v = match t.obj.get(key) {
        None | Some(Value::Null) => return None,
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            t.add(key, "must be a string");
            return None;
        }
    };
    match allowed {
        Some(allowed) if !allowed.contains(&v.as_str()) => {
            t.add(
                key,
                format!("must be one of {} (got {v:?})", allowed.join(", ")),
            );
            None
        }
        _ => Some(v),
    }
}

/// `tolerations`: each `{ key?, operator?, value?, effect?, tolerationSeconds? }` by the API
/// server's rules.
fn tolerations(r: &mut Reader<'_>) -> Vec<Toleration> {
    let items = match r.obj.get("tolerations") {
        None | Some(Value::Null) => return Vec::new(),
        Some(Value::Array(a)) => a,
        Some(_) => {
            r.add("tolerations", "must be an array of objects");
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let prefix = format!("backend.kubernetes.tolerations[{i}].");
        let Some(obj) = item.as_object() else {
            r.add(
                &format!("tolerations[{i}]"),
                "must be an object { key?, operator?, value?, effect?, tolerationSeconds? }",
            );
            continue;
        };
        let mut t = Reader {
            obj,
            problems: r.problems,
            prefix: &prefix,
        };
        unknown_fields(&mut t, "", TOLERATION_FIELDS);
        let key = field(&mut t, "key", None).filter(|k| !k.is_empty());
        let operator = field(&mut t, "operator", Some(OPERATORS));
        let value = field(&mut t, "value", None);
        let effect = field(&mut t, "effect", Some(EFFECTS));
        if let Some(why) = key.as_deref().and_then(label_key_problem) {
            t.add("key", why);
        }
        let exists = operator.as_deref() == Some("Exists");
        // An operator already refused as unknown is not named twice.
        let operator_ok = operator.is_some() || t.obj.get("operator").is_none_or(Value::is_null);
        if key.is_none() && !exists && operator_ok {
            t.add("operator", "must be \"Exists\" when key is empty");
        }
        match value.as_deref() {
            Some(v) if exists && !v.is_empty() => {
                t.add("value", "must be empty when operator is \"Exists\"")
            }
            Some(v) => {
                if let Some(why) = label_value_problem(v) {
                    t.add("value", why)
                }
            }
            None => {}
        }
        let toleration_seconds = match t.obj.get("tolerationSeconds") {
            None | Some(Value::Null) => None,
            Some(_) if effect.as_deref() != Some("NoExecute") => {
                t.add(
                    "tolerationSeconds",
                    "is allowed only with effect \"NoExecute\"",
                );
                None
            }
            Some(_) => {
                Some(t.number("tolerationSeconds", None, 0.0, super::MAX_SECONDS, true) as i64)
            }
        };
        out.push(Toleration {
            key,
            operator,
            value,
            effect,
            toleration_seconds,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> (BackendConfig, String) {
        let mut problems = Problems::default();
        let b = backend(Some(&v), &mut problems);
        let msg = if problems.is_empty() {
            String::new()
        } else {
            problems.into_error().message
        };
        (b, msg)
    }

    /// A valid `backend.kubernetes` with `extra` merged in.
    fn kube(extra: Value) -> (Option<KubernetesConfig>, String) {
        let mut k = json!({ "namespace": "agents", "image": "example.com/cra:1" });
        k.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        match parse(json!({ "kubernetes": k })) {
            (BackendConfig::Kubernetes(c), msg) => (Some(*c), msg),
            (BackendConfig::Local, msg) => (None, msg),
        }
    }

    fn problem(extra: Value) -> String {
        let (c, msg) = kube(extra);
        assert!(c.is_none() && !msg.is_empty(), "accepted: {c:?}");
        assert_eq!(
            crate::error::AdapterError::invalid_params("").code,
            crate::error::ErrorCode::InvalidParams
        );
        msg
    }

    #[test]
    fn backend_is_local_by_default_and_only_local_or_kubernetes_is_accepted() {
        let mut none = Problems::default();
        assert_eq!(backend(None, &mut none), BackendConfig::Local);
        assert_eq!(parse(Value::Null), (BackendConfig::Local, String::new()));
        assert_eq!(parse(json!("local")), (BackendConfig::Local, String::new()));
        for bad in [
            json!("kubernetes"),
            json!(true),
            json!({}),
            json!({ "kubernetes": {}, "local": {} }),
            json!({ "docker": {} }),
        ] {
            let (_, msg) = parse(bad.clone());
            assert!(
                msg.starts_with("config.backend must be \"local\" or an object { kubernetes:"),
                "{bad}: {msg}"
            );
        }
        let (_, msg) = parse(json!({ "kubernetes": "agents" }));
        assert_eq!(msg, "config.backend.kubernetes must be an object");
    }

    #[test]
    fn kubernetes_needs_namespace_and_image_and_defaults_the_rest() {
        let (c, msg) = kube(json!({}));
        assert_eq!(msg, "");
        let c = c.unwrap();
        assert_eq!(c.namespace, "agents");
        assert_eq!(c.image.as_deref(), Some("example.com/cra:1"));
        assert_eq!(c.runtime_image, "example.com/cra:1");
        assert_eq!(c.image_pull_policy, PullPolicy::IfNotPresent);
        assert_eq!(c.pod_start_timeout, Duration::from_secs(120));
        assert!(c.kubeconfig.is_none() && c.context.is_none());
        assert!(c.requests.is_empty() && c.limits.is_empty() && c.tolerations.is_empty());
        let (_, msg) = parse(json!({ "kubernetes": {} }));
        assert!(
            msg.contains("config.backend.kubernetes.namespace must be a string"),
            "{msg}"
        );
        assert!(
            msg.contains("config.backend.kubernetes.image must be given, or runtimeImage"),
            "{msg}"
        );
    }

    #[test]
    fn node_cache_is_an_absolute_normalised_directory() {
        assert_eq!(kube(json!({})).0.unwrap().node_cache, None);
        let (c, _) = kube(json!({ "nodeCache": "/var/lib/claude-runtime-adapter" }));
        assert_eq!(
            c.unwrap().node_cache.as_deref(),
            Some("/var/lib/claude-runtime-adapter")
        );
        for bad in [
            "relative/dir",
            "/",
            "/a/../b",
            "/a//b",
            "/a/",
            "/a/./b",
            "/a\nb",
        ] {
            let msg = problem(json!({ "nodeCache": bad }));
            assert!(
                msg.contains("config.backend.kubernetes.nodeCache must be an absolute, normalised directory path"),
                "{bad:?}: {msg}"
            );
        }
        assert!(problem(json!({ "nodeCache": 7 })).contains("nodeCache must be a string"));
    }

    #[test]
    fn runtime_image_alone_leaves_the_session_image_to_the_repository() {
        let (c, msg) = parse(
            json!({ "kubernetes": { "namespace": "agents", "runtimeImage": "example.com/cra:2" } }),
        );
        assert_eq!(msg, "");
        let BackendConfig::Kubernetes(c) = c else {
            panic!("not kubernetes")
        };
        assert_eq!(c.image, None);
        assert_eq!(c.runtime_image, "example.com/cra:2");
        let (c, _) =
            kube(json!({ "image": "ci.example.com/rust:1", "runtimeImage": "example.com/cra:2" }));
        let c = c.unwrap();
        assert_eq!(c.image.as_deref(), Some("ci.example.com/rust:1"));
        assert_eq!(c.runtime_image, "example.com/cra:2");
        let msg = problem(json!({ "runtimeImage": "a b" }));
        assert!(
            msg.contains(
                "config.backend.kubernetes.runtimeImage must be a non-empty image reference"
            ),
            "{msg}"
        );
    }

    #[test]
    fn disk_mib_is_the_pods_ephemeral_storage_limit_where_the_engine_gave_none() {
        let with = |resources: Value| {
            let (c, msg) = kube(json!({ "resources": resources }));
            assert_eq!(msg, "");
            let mut c = c.unwrap();
            let mut problems = Problems::default();
            disk_limit(&mut c, 1024 << 20, &mut problems);
            (c.limits, problems)
        };
        let (limits, problems) = with(json!({ "limits": { "memory": "2Gi" } }));
        assert!(problems.is_empty());
        assert_eq!(limits["ephemeral-storage"], "1024Mi");
        let (c, _) = kube(json!({}));
        let mut c = c.unwrap();
        disk_limit(&mut c, 1024 << 20, &mut Problems::default());
        assert!(c.storage_from_disk_mib);
        assert_eq!(limits["memory"], "2Gi");
        // The engine's own limit wins.
        let (limits, _) = with(json!({ "limits": { "ephemeral-storage": "10G" } }));
        assert_eq!(limits["ephemeral-storage"], "10G");
        // A request above the mapped limit would fail every pod: a problem naming both.
        let (limits, problems) = with(json!({ "requests": { "ephemeral-storage": "2Gi" } }));
        assert!(!limits.contains_key("ephemeral-storage"));
        let msg = problems.into_error().message;
        assert!(
            msg.contains(
                "config.sandbox.limits.diskMiB is the pods' ephemeral-storage limit (1024Mi"
            ) && msg.contains("(2Gi)"),
            "{msg}"
        );
    }

    #[test]
    fn every_kubernetes_field_is_read() {
        let (c, msg) = kube(json!({
            "imagePullPolicy": "Never",
            "kubeconfig": "rel/kubeconfig",
            "context": "kind-dev",
            "resources": { "requests": { "cpu": "500m", "memory": "1Gi" }, "limits": { "memory": "2Gi", "ephemeral-storage": "10G" } },
            "nodeSelector": { "kubernetes.io/arch": "amd64" },
            "tolerations": [{ "key": "dedicated", "operator": "Equal", "value": "agents", "effect": "NoExecute", "tolerationSeconds": 30 }, { "operator": "Exists" }],
            "runtimeClassName": "gvisor",
            "serviceAccountName": "agent-runner",
            "labels": { "team": "core", "example.com/tier": "" },
            "annotations": { "example.com/note": "any text: é / ok" },
            "podStartTimeout": 2.5,
        }));
        assert_eq!(msg, "");
        let c = c.unwrap();
        assert_eq!(c.image_pull_policy.as_str(), "Never");
        assert_eq!(
            c.kubeconfig,
            Some(std::env::current_dir().unwrap().join("rel/kubeconfig"))
        );
        assert_eq!(c.context.as_deref(), Some("kind-dev"));
        assert_eq!(c.requests["cpu"], "500m");
        assert_eq!(c.limits["ephemeral-storage"], "10G");
        assert_eq!(c.node_selector["kubernetes.io/arch"], "amd64");
        assert_eq!(
            c.tolerations,
            vec![
                Toleration {
                    key: Some("dedicated".into()),
                    operator: Some("Equal".into()),
                    value: Some("agents".into()),
                    effect: Some("NoExecute".into()),
                    toleration_seconds: Some(30),
                },
                Toleration {
                    operator: Some("Exists".into()),
                    ..Default::default()
                }
            ]
        );
        assert_eq!(c.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(c.service_account_name.as_deref(), Some("agent-runner"));
        assert_eq!(c.labels.len(), 2);
        assert_eq!(c.annotations["example.com/note"], "any text: é / ok");
        assert_eq!(c.pod_start_timeout, Duration::from_millis(2500));
    }

    #[test]
    fn namespace_must_be_a_dns_label_and_image_a_reference() {
        for bad in ["Agents", "-a", "a-", "a.b", "", &"a".repeat(64)] {
            let msg = problem(json!({ "namespace": bad }));
            assert!(
                msg.contains("config.backend.kubernetes.namespace must be a DNS-1123 label"),
                "{bad}: {msg}"
            );
        }
        assert!(kube(json!({ "namespace": "a".repeat(63) })).0.is_some());
        for bad in ["", "cra :1", "cra\n"] {
            let msg = problem(json!({ "image": bad }));
            assert!(
                msg.contains("config.backend.kubernetes.image must be a non-empty image reference"),
                "{msg}"
            );
        }
    }

    #[test]
    fn pull_policy_names_unknown_fields_and_empty_strings_are_problems() {
        let msg = problem(json!({ "imagePullPolicy": "never" }));
        assert!(msg.contains("config.backend.kubernetes.imagePullPolicy must be \"Always\", \"IfNotPresent\" or \"Never\" (got \"never\")"), "{msg}");
        let msg = problem(json!({ "nodeselector": {} }));
        assert!(
            msg.contains(
                "config.backend.kubernetes.nodeselector is not a field (known: namespace,"
            ),
            "{msg}"
        );
        let msg = problem(json!({ "context": "" }));
        assert!(
            msg.contains("config.backend.kubernetes.context must be a non-empty string when given"),
            "{msg}"
        );
        let msg = problem(json!({ "kubeconfig": 7 }));
        assert!(
            msg.contains("config.backend.kubernetes.kubeconfig must be a string when given"),
            "{msg}"
        );
    }

    #[test]
    fn quantities_follow_the_api_servers_grammar() {
        for ok in [
            "1", "0", "500m", "0.5", ".5", "1.", "2Gi", "512Mi", "1G", "1e3", "1E-2", "10Ki",
            "3Ei", "1E",
        ] {
            assert!(quantity_value(ok).is_some(), "{ok}");
        }
        for bad in [
            "", "-1", "+1", "1gi", "1 Gi", "Gi", "1Kb", "1k1", "1.2.3", "0x10", "1ei", "1m ",
        ] {
            assert!(quantity_value(bad).is_none(), "{bad}");
        }
        assert_eq!(quantity_value("2Gi"), Some(2.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(quantity_value("500m"), Some(0.5));
        assert_eq!(quantity_value("1G"), Some(1e9));
        assert_eq!(quantity_value("1E"), Some(1e18));
        assert_eq!(quantity_value("2e3"), Some(2000.0));
    }

    #[test]
    fn resources_are_named_quantities_and_a_request_may_not_exceed_its_limit() {
        let msg = problem(json!({ "resources": {
            "requests": { "memory": "3Gi", "gpu": "1", "cpu": "lots" },
            "limits": { "memory": "2Gi", "cpu": 2 },
            "limit": {},
        } }));
        for expected in [
            "config.backend.kubernetes.resources.limit is not a field (known: requests, limits)",
            "config.backend.kubernetes.resources.requests[\"gpu\"] is not a resource this adapter sets (known: cpu, memory, ephemeral-storage)",
            "config.backend.kubernetes.resources.requests[\"cpu\"] must be a quantity such as \"500m\", \"2\", \"512Mi\" or \"1G\" (got \"lots\")",
            "config.backend.kubernetes.resources.limits[\"cpu\"] must be a string",
            "config.backend.kubernetes.resources.requests[\"memory\"] must not exceed limits[\"memory\"] (3Gi > 2Gi)",
        ] {
            assert!(msg.contains(expected), "{expected}\n{msg}");
        }
        let msg = problem(json!({ "resources": [] }));
        assert!(
            msg.contains(
                "config.backend.kubernetes.resources must be an object { requests?, limits? }"
            ),
            "{msg}"
        );
        assert!(kube(json!({ "resources": { "requests": { "memory": "1024Mi" }, "limits": { "memory": "1Gi" } } })).0.is_some());
    }

    #[test]
    fn tolerations_follow_the_api_servers_rules_and_name_the_entry() {
        let msg = problem(json!({ "tolerations": [
            { "key": "a", "effect": "NoSchedule" },
            { "key": "a", "effect": "NoScheduler" },
            { "key": "a", "operator": "In" },
            { "value": "x" },
            { "key": "a", "operator": "Exists", "value": "x" },
            { "key": "a", "effect": "NoSchedule", "tolerationSeconds": 5 },
            { "key": "bad key", "operator": "Exists" },
            { "key": "a", "effect": "NoExecute", "tolerationSeconds": -1 },
            { "key": "a", "value": "not a label value!" },
            "x",
            { "key": "a", "effects": "NoSchedule" },
        ] }));
        for expected in [
            "config.backend.kubernetes.tolerations[1].effect must be one of NoSchedule, PreferNoSchedule, NoExecute (got \"NoScheduler\")",
            "config.backend.kubernetes.tolerations[2].operator must be one of Exists, Equal (got \"In\")",
            "config.backend.kubernetes.tolerations[3].operator must be \"Exists\" when key is empty",
            "config.backend.kubernetes.tolerations[4].value must be empty when operator is \"Exists\"",
            "config.backend.kubernetes.tolerations[5].tolerationSeconds is allowed only with effect \"NoExecute\"",
            "config.backend.kubernetes.tolerations[6].key has an invalid key",
            "config.backend.kubernetes.tolerations[7].tolerationSeconds must be an integer in [0, 31536000] (got -1)",
            "config.backend.kubernetes.tolerations[8].value must be a label value",
            "config.backend.kubernetes.tolerations[9] must be an object",
            "config.backend.kubernetes.tolerations[10].effects is not a field",
        ] {
            assert!(msg.contains(expected), "{expected}\n{msg}");
        }
        assert!(!msg.contains("tolerations[0]"), "{msg}");
        assert_eq!(msg.matches("tolerations[2]").count(), 1, "{msg}");
    }

    #[test]
    fn labels_and_annotations_follow_the_api_servers_rules_and_the_adapters_keys_are_reserved() {
        let msg = problem(json!({
            "labels": {
                "claude-runtime-adapter/session": "x",
                "app.kubernetes.io/managed-by": "me",
                "Bad_Prefix/x": "v",
                "ok": "has space",
                "long": "a".repeat(64),
                "n": 1,
            },
            "annotations": {
                "claude-runtime-adapter/owner": "claude-runtime-adapter owner pid=1 start=1 host=h",
                "-x": "v",
            },
        }));
        for expected in [
            "config.backend.kubernetes.labels[\"claude-runtime-adapter/session\"] uses a key the adapter sets itself",
            "config.backend.kubernetes.labels[\"app.kubernetes.io/managed-by\"] uses a key the adapter sets itself",
            "config.backend.kubernetes.labels[\"Bad_Prefix/x\"] has an invalid key",
            "config.backend.kubernetes.labels[\"ok\"] must be a label value",
            "config.backend.kubernetes.labels[\"long\"] must be a label value",
            "config.backend.kubernetes.labels[\"n\"] must be a string",
            "config.backend.kubernetes.annotations[\"claude-runtime-adapter/owner\"] uses a key the adapter sets itself",
            "config.backend.kubernetes.annotations[\"-x\"] has an invalid key",
        ] {
            assert!(msg.contains(expected), "{expected}\n{msg}");
        }
        let msg = problem(json!({ "annotations": { "big": "x".repeat(MAX_ANNOTATIONS_BYTES) } }));
        assert!(msg.contains("config.backend.kubernetes.annotations must total at most 262144 bytes of keys and values (got 262147)"), "{msg}");
        let msg = problem(json!({ "nodeSelector": { "disk": "fast ssd" }, "labels": [] }));
        assert!(
            msg.contains("config.backend.kubernetes.nodeSelector[\"disk\"] must be a label value"),
            "{msg}"
        );
        assert!(
            msg.contains("config.backend.kubernetes.labels must be an object of strings"),
            "{msg}"
        );
        for (key, ok) in [
            ("a", true),
            ("example.com/a.b_c-d", true),
            (&format!("{}/a", "p".repeat(253)), true),
            (&format!("{}/a", "p".repeat(254)), false),
            (&"a".repeat(63), true),
            (&"a".repeat(64), false),
            ("a/b/c", false),
            ("/a", false),
            ("a/", false),
            ("", false),
        ] {
            assert_eq!(is_qualified_name(key), ok, "{key}");
        }
    }

    #[test]
    fn runtime_class_service_account_and_start_timeout_are_checked() {
        let msg = problem(json!({
            "runtimeClassName": "gVisor",
            "serviceAccountName": "a_b",
            "podStartTimeout": 0,
        }));
        for expected in [
            "config.backend.kubernetes.runtimeClassName must be a DNS-1123 subdomain",
            "config.backend.kubernetes.serviceAccountName must be a DNS-1123 subdomain",
            "config.backend.kubernetes.podStartTimeout must be a number in [0.001, 31536000] (got 0)",
        ] {
            assert!(msg.contains(expected), "{expected}\n{msg}");
        }
        for bad in [json!("NaN"), json!(1e9), json!(-5), json!("10")] {
            let msg = problem(json!({ "podStartTimeout": bad }));
            assert!(
                msg.contains("config.backend.kubernetes.podStartTimeout must be a number in [0.001, 31536000]"),
                "{msg}"
            );
        }
    }

    #[test]
    fn engine_id_is_a_dns_label_of_at_most_52_and_its_lease_whole_seconds_from_3_to_3600() {
        let c = kube(json!({})).0.unwrap();
        assert_eq!(
            (c.engine_id, c.engine_lease),
            (None, Duration::from_secs(30))
        );
        let c = kube(json!({ "engineId": "decree-prod", "engineLease": 10 }))
            .0
            .unwrap();
        assert_eq!(c.engine_id.as_deref(), Some("decree-prod"));
        assert_eq!(c.engine_lease, Duration::from_secs(10));
        let long = "e".repeat(53);
        for bad in [
            json!("has space"),
            json!(""),
            json!("-lead"),
            json!("Upper"),
            json!(7),
            json!(long),
        ] {
            let msg = problem(json!({ "engineId": bad }));
            assert!(msg.contains("config.backend.kubernetes.engineId"), "{msg}");
        }
        for bad in [json!(2), json!(3601), json!(4.5), json!("30")] {
            let msg = problem(json!({ "engineLease": bad }));
            assert!(
                msg.contains(
                    "config.backend.kubernetes.engineLease must be an integer in [3, 3600]"
                ),
                "{msg}"
            );
        }
    }

    #[test]
    fn warm_pods_is_a_count_up_to_64_and_none_by_default() {
        assert_eq!(kube(json!({})).0.unwrap().warm_pods, 0);
        assert_eq!(kube(json!({ "warmPods": 3 })).0.unwrap().warm_pods, 3);
        for bad in [json!(-1), json!(65), json!(1.5), json!("2"), json!(true)] {
            let msg = problem(json!({ "warmPods": bad }));
            assert!(
                msg.contains("config.backend.kubernetes.warmPods must be an integer in [0, 64]"),
                "{bad}: {msg}"
            );
        }
    }
}
