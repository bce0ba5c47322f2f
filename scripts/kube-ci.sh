#!/usr/bin/env bash
# The Kubernetes part of CI (.ci/run calls it): bring the local two-node test cluster up, build
# the session image without a registry, import it into both nodes, run `npm run test:kube`
# against it, and bring the cluster down again, also when a step fails or CI is interrupted.
# Says which step failed and exits with its status.
#
# CRA_KUBE_DIR: the cluster's scripts (default ../shared/kube, next to the project); the
# kubeconfig is the one `up` writes (under KUBE_LOCAL_DIR, default /var/tmp/kube-local).
set -euo pipefail
cd "$(dirname "$0")/.."

kube_dir=${CRA_KUBE_DIR:-../shared/kube}
image_tar=target/session-image/session.tar
step=

# step NAME CMD...: runs CMD as the step NAME, with its time.
step() {
  step=$1
  shift
  echo "== kube-ci: $step" >&2
  local start=$SECONDS
  "$@"
  echo "== kube-ci: $step: done in $((SECONDS - start)) s (disk free: $(free_disk))" >&2
}

# Free space where the nodes keep images and pods' volumes: a pod of a user's image holds a copy
# of the runtime (~400 MB), so 16 at once need ~6.5 GB beyond the images.
free_disk() { df -h --output=avail "${KUBE_LOCAL_DIR:-/var/tmp}" 2>/dev/null | tail -1 | tr -d ' '; }

finish() {
  local status=$?
  trap - EXIT
  if [ "$status" -ne 0 ]; then
    echo "== kube-ci: FAILED in step '${step:-start}' (exit $status; disk free: $(free_disk))" >&2
  fi
  echo "== kube-ci: cluster down" >&2
  if ! "$kube_dir/down"; then
    echo "== kube-ci: FAILED to bring the cluster down ($kube_dir/down)" >&2
    [ "$status" -ne 0 ] || status=1
  fi
  exit "$status"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "cluster up ($kube_dir/up)" "$kube_dir/up"
export KUBECONFIG="${KUBE_LOCAL_DIR:-/var/tmp/kube-local}/kubeconfig"

mkdir -p target/session-image
step "session image build (scripts/session-image.mjs)" \
  node scripts/session-image.mjs --out "$image_tar" --mkimage "$kube_dir/mkimage.py" >target/session-image/ref
CRA_KUBE_IMAGE=$(cat target/session-image/ref)
export CRA_KUBE_IMAGE
echo "== kube-ci: image $CRA_KUBE_IMAGE" >&2

step "image import into both nodes ($kube_dir/import-image)" "$kube_dir/import-image" "$image_tar"

# The images a team brings instead of the session image (no bubblewrap, socat or CLI in any):
# toolchain (git, node, npm, yarn, python3, gcc), minimal (git only), nogit (refused: no git)
# and musl (no glibc, no git). Built the same registry-free way; a no-op when their inputs did
# not change. refs has one line per image, `NAME REF TARPATH`; each REF is exported for the
# tests as CRA_KUBE_<NAME>_IMAGE: CRA_KUBE_TOOLCHAIN_IMAGE, CRA_KUBE_MINIMAL_IMAGE,
# CRA_KUBE_NOGIT_IMAGE, CRA_KUBE_MUSL_IMAGE.
mkdir -p target/test-images
step "test images build (scripts/test-images.mjs)" \
  node scripts/test-images.mjs --mkimage "$kube_dir/mkimage.py" >target/test-images/refs
# Read whole first: the imports must not read the rest of refs from stdin.
mapfile -t test_images <target/test-images/refs
for line in "${test_images[@]}"; do
  read -r name ref tar <<<"$line"
  step "test image $name import into both nodes ($kube_dir/import-image)" "$kube_dir/import-image" "$tar"
  export "CRA_KUBE_${name^^}_IMAGE=$ref"
  echo "== kube-ci: test image $name: $ref" >&2
done

step "cargo test --test kube_cluster (the cluster client against the live cluster)" \
  env CRA_KUBE_TESTS=1 cargo test --test kube_cluster
step "npm run test:kube (KUBECONFIG=$KUBECONFIG CRA_KUBE_IMAGE=$CRA_KUBE_IMAGE)" npm run test:kube
# The local backend's guarantees in a user's image: the boundary, the failures, every end of a
# session and 16 at once again, with the sessions in the minimal test image (git and a shell
# only; the runtime copied in from the session image).
step "npm run test:kube again in the user's minimal image (CRA_KUBE_SESSION_IMAGE=$CRA_KUBE_MINIMAL_IMAGE)" \
  env CRA_KUBE_SESSION_IMAGE="$CRA_KUBE_MINIMAL_IMAGE" npm run test:kube -- \
  __test__/kube/boundary.test.mjs __test__/kube/failures.test.mjs __test__/kube/sessions.test.mjs \
  -t "boundary|cannot run|goes under|each role|failing setup|16 sessions|every end deletes"
