#!/usr/bin/env bash
# The Kubernetes part of CI (.ci/run calls it): the local two-node test cluster of ../shared/kube,
# the session image and the test images built without a registry and imported into both nodes,
# the cluster client's tests and `npm run test:kube` against it, and the cluster down again.
#
#   scripts/kube-ci.sh               everything below in order, the cluster down at the end
#                                    (also when a step fails or it is interrupted)
#   scripts/kube-ci.sh test-images   build the test images (needs no cluster and nothing built)
#   scripts/kube-ci.sh session-image build the session image (needs no cluster; needs the npm
#                                    packages installed, for the CLI it copies)
#   scripts/kube-ci.sh prepare       the cluster up, the session image built, every image imported
#                                    (waits for either image build when another process runs it)
#   scripts/kube-ci.sh test          the tests against the prepared cluster, then the cluster down
#   scripts/kube-ci.sh down          the cluster down
#
# .ci/run runs test-images, session-image and prepare in the background while the CPU-bound steps
# run (image builds and the cluster's start wait mostly on the Debian mirror and the disk), then
# test.
# Says which step failed and exits with its status.
#
# CRA_KUBE_DIR: the cluster's scripts (default ../shared/kube, next to the project); the
# kubeconfig is the one `up` writes (under KUBE_LOCAL_DIR, default /var/tmp/kube-local).
set -euo pipefail
cd "$(dirname "$0")/.."

kube_dir=${CRA_KUBE_DIR:-../shared/kube}
image_tar=target/session-image/session.tar
image_ref=target/session-image/ref
refs=target/test-images/refs
step=

# step NAME CMD...: runs CMD as the step NAME, with its time.
step() {
  step=$1
  shift
  echo "== kube-ci: $step" >&2
  local start=$SECONDS
  "$@"
  echo "== kube-ci: $step: done in $((SECONDS - start)) s (disk free: $(free_disk))" >&2
  # .ci/run's summary of step times; a background part's steps are marked.
  if [ -n "${CRA_CI_TIMES:-}" ]; then
    printf '%6d s  %skube-ci: %s\n' "$((SECONDS - start))" "${CRA_CI_BACKGROUND:+[bg] }" "$step" >>"$CRA_CI_TIMES"
  fi
}

# Free space where the nodes keep images and pods' volumes: a pod of a user's image holds a copy
# of the runtime (~400 MB), so 16 at once need ~6.5 GB beyond the images.
free_disk() { df -h --output=avail "${KUBE_LOCAL_DIR:-/var/tmp}" 2>/dev/null | tail -1 | tr -d ' '; }

# At exit: on failure say in which step and remove an unfinished refs file (a `prepare` waiting
# for it then stops waiting); then, by the part's rule ($1), `down` brings the cluster down,
# `down-on-failure` only on failure.
finish() {
  local status=$?
  trap - EXIT
  if [ -n "${beside_pid:-}" ]; then kill -- "-$beside_pid" 2>/dev/null || true; fi
  if [ "$status" -ne 0 ]; then
    echo "== kube-ci: FAILED in step '${step:-start}' (exit $status; disk free: $(free_disk))" >&2
    rm -f "$refs.partial" "$image_ref.partial"
  fi
  case "$1:$status" in
    down:*) cluster_down || status=${status/#0/1} ;;
    down-on-failure:0) ;;
    down-on-failure:*) cluster_down || true ;;
    *) ;;
  esac
  exit "$status"
}

cluster_down() {
  echo "== kube-ci: cluster down" >&2
  if ! "$kube_dir/down"; then
    echo "== kube-ci: FAILED to bring the cluster down ($kube_dir/down)" >&2
    return 1
  fi
}

# The images a team brings instead of the session image (no bubblewrap, socat or CLI in any):
# toolchain (git, node, npm, yarn, python3, gcc), minimal (git only), nogit (refused: no git)
# and musl (no glibc, no git). Built the same registry-free way; a no-op when their inputs did
# not change. refs has one line per image, `NAME REF TARPATH`, written whole at the end (a
# partial file is never read as the list).
test_images() {
  mkdir -p target/test-images
  rm -f "$refs"
  step "test images build (scripts/test-images.mjs)" \
    node scripts/test-images.mjs --mkimage "$kube_dir/mkimage.py" >"$refs.partial"
  mv "$refs.partial" "$refs"
}

# The session image (a no-op when its inputs did not change); its reference is written to ref
# whole at the end, as the test images' refs are.
session_image() {
  mkdir -p target/session-image
  rm -f "$image_ref"
  step "session image build (scripts/session-image.mjs)" \
    node scripts/session-image.mjs --out "$image_tar" --mkimage "$kube_dir/mkimage.py" >"$image_ref.partial"
  mv "$image_ref.partial" "$image_ref"
  echo "== kube-ci: image $(cat "$image_ref")" >&2
}

prepare() {
  step "cluster up ($kube_dir/up)" "$kube_dir/up"
  export KUBECONFIG="${KUBE_LOCAL_DIR:-/var/tmp/kube-local}/kubeconfig"
  # Another process (.ci/run's) builds it: wait for its ref, or build it here.
  if [ -f "$image_ref.partial" ]; then
    step "waiting for the session image's build" wait_for "$image_ref"
  else
    session_image
  fi
  # The imports at once (each unpacks into both nodes' containerd: disk-bound, one after another
  # they took ~105 s, the toolchain image 57 s of it); each says its own time.
  local imports=() name ref tar
  step "image import into both nodes ($kube_dir/import-image)" "$kube_dir/import-image" "$image_tar" &
  imports+=("$!")
  if [ ! -f "$refs" ]; then
    if [ -f "$refs.partial" ]; then
      step "waiting for the test images' build" wait_for "$refs"
    else
      test_images
    fi
  fi
  mapfile -t test_images <"$refs"
  for line in "${test_images[@]}"; do
    read -r name ref tar <<<"$line"
    step "test image $name import into both nodes ($kube_dir/import-image)" "$kube_dir/import-image" "$tar" &
    imports+=("$!")
  done
  step="the images' imports"
  local pid
  for pid in "${imports[@]}"; do wait "$pid"; done
}

# wait_for FILE: until another process's build writes FILE (from FILE.partial); fails when that
# build stopped without it (its log says why) or after 30 minutes.
wait_for() {
  local file=$1 waited=0
  while [ ! -f "$file" ]; do
    if [ ! -f "$file.partial" ] || [ "$waited" -ge 1800 ]; then
      echo "== kube-ci: the build of $file ended without it" >&2
      return 1
    fi
    sleep 2
    waited=$((waited + 2))
  done
}

run_tests() {
  export KUBECONFIG="${KUBE_LOCAL_DIR:-/var/tmp/kube-local}/kubeconfig"
  CRA_KUBE_IMAGE=$(cat "$image_ref")
  export CRA_KUBE_IMAGE
  echo "== kube-ci: image $CRA_KUBE_IMAGE" >&2
  local name ref tar
  mapfile -t test_images <"$refs"
  for line in "${test_images[@]}"; do
    read -r name ref tar <<<"$line"
    # CRA_KUBE_TOOLCHAIN_IMAGE, CRA_KUBE_MINIMAL_IMAGE, CRA_KUBE_NOGIT_IMAGE, CRA_KUBE_MUSL_IMAGE
    export "CRA_KUBE_${name^^}_IMAGE=$ref"
    echo "== kube-ci: test image $name: $ref" >&2
  done
  # The suites that mostly wait (an API outage held 60 s twice; a kubelet's eviction, 20-100 s
  # after the disk fills; deadlines running out) run beside the others, in a namespace of their
  # own: each suite counts the adapter's pods of its namespace, and the others need the
  # cluster's CPU, which these hardly use. One after the other they added ~105 s to the first
  # pass and ~100 s to the second. The node's base (node-base.test.mjs: most of it the same-size
  # edit cases on one node, 50 sessions, 4 at a time; 120 before the loops moved to test:loops) goes there too, so the two
  # lanes end closer together, and so does the engine identity's (mostly waiting out Leases).
  # So `npm run test:kube` is its two halves here: the addon built (and the npm packages
  # installed) once, then vitest in each lane, which must not both rebuild what the other loads.
  local waiting=(__test__/kube/api-outage.test.mjs __test__/kube/failures.test.mjs __test__/kube/node-base.test.mjs __test__/kube/engine-identity.test.mjs)
  local waits_ns=cra-ci-waits
  local suite=(npx --no-install vitest run --config vitest.kube.config.mjs)
  step "the addon built (node scripts/ensure-built.mjs, test:kube's pre-step)" node scripts/ensure-built.mjs
  # The cluster client's own tests (cargo test --test kube_cluster; ~25 s, waiting on the API
  # server and pods) go first in that lane, in its namespace too.
  step "namespace $waits_ns for the suites that mostly wait" namespace "$waits_ns"
  beside "cargo test --test kube_cluster (the cluster client against the live cluster), then test:kube's ${waiting[*]} (CRA_KUBE_NAMESPACE=$waits_ns)" \
    env CRA_KUBE_NAMESPACE="$waits_ns" CRA_KUBE_TESTS=1 \
    bash -c 'node scripts/cargo-test.mjs --test kube_cluster && exec "$@"' _ "${suite[@]}" "${waiting[@]}"
  step "test:kube's other suites (KUBECONFIG=$KUBECONFIG CRA_KUBE_IMAGE=$CRA_KUBE_IMAGE)" \
    "${suite[@]}" "${waiting[@]/#/--exclude=}"
  joined
  # What a user's image changes: the runtime copied in (an init container, its disk counted
  # against the pod's ephemeral-storage), the image's own PATH and tools, bubblewrap and socat
  # through the runtime's loader. So the boundary, a pod going under the agent, each role, a
  # failing setup, 16 at once, every end and an interrupted session continued in its pod (its
  # checkout a layer on the node's base there) run again with the sessions in the minimal test
  # image (git and a shell only). Not again: a cluster that cannot run the session (API
  # server, namespace, image name, scheduling: decided before any image runs).
  # With the runtime kept once per node (nodeCache: the two nodes share this machine's disk, so
  # one directory made here serves both), so the boundary is proven with the runtime's links
  # into the node's copy too; the per-pod copy is user-image.test.mjs's default.
  local cache=/var/tmp/cra-kube-ci-node-cache
  rm -rf "$cache" && install -d -o 1000 -g 1000 "$cache"
  local again=(env CRA_KUBE_SESSION_IMAGE="$CRA_KUBE_MINIMAL_IMAGE" CRA_KUBE_NODE_CACHE="$cache" "${suite[@]}")
  local cases="boundary|goes under|each role|failing setup|16 sessions|every end deletes|SIGKILLed in step three"
  beside "test:kube again in the user's minimal image: __test__/kube/failures.test.mjs (CRA_KUBE_NAMESPACE=$waits_ns)" \
    env CRA_KUBE_NAMESPACE="$waits_ns" "${again[@]}" __test__/kube/failures.test.mjs -t "$cases"
  step "test:kube again in the user's minimal image (CRA_KUBE_SESSION_IMAGE=$CRA_KUBE_MINIMAL_IMAGE, CRA_KUBE_NODE_CACHE=$cache)" \
    "${again[@]}" __test__/kube/boundary.test.mjs __test__/kube/sessions.test.mjs __test__/kube/interrupted.test.mjs -t "$cases"
  joined
  rm -rf "$cache"
}

# namespace NAME: the namespace made if missing, once its default service account (which every
# pod is given) exists.
namespace() {
  kubectl get namespace "$1" >/dev/null 2>&1 || kubectl create namespace "$1" >/dev/null
  local i
  for i in $(seq 60); do
    kubectl -n "$1" get serviceaccount default >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "== kube-ci: namespace $1 has no default service account after 30 s" >&2
  return 1
}

# beside NAME CMD...: the step NAME run in the background, in its own process group (killed
# whole if this script ends first), its output kept in target/kube-ci-beside.log until `joined`.
beside_pid=
beside_log=target/kube-ci-beside.log
beside() {
  export -f step free_disk
  CRA_CI_BACKGROUND=1 setsid bash -euo pipefail -c 'step "$@"' _ "$@" >"$beside_log" 2>&1 &
  beside_pid=$!
}
# joined: waits for the step `beside` started, prints its output, fails as it failed.
joined() {
  local status=0
  wait "$beside_pid" || status=$?
  beside_pid=
  sed 's/^/[beside] /' "$beside_log" >&2
  return "$status"
}

trap 'exit 130' INT
trap 'exit 143' TERM
case "${1:-all}" in
  test-images)
    trap 'finish keep' EXIT
    test_images
    ;;
  session-image)
    trap 'finish keep' EXIT
    session_image
    ;;
  prepare)
    trap 'finish down-on-failure' EXIT
    prepare
    ;;
  test)
    trap 'finish down' EXIT
    run_tests
    ;;
  down)
    cluster_down
    ;;
  all)
    trap 'finish down' EXIT
    prepare
    run_tests
    ;;
  *)
    echo "usage: scripts/kube-ci.sh [test-images|session-image|prepare|test|down]" >&2
    exit 2
    ;;
esac
