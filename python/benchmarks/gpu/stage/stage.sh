#!/usr/bin/env bash
# Prepare what the GPU check (python/benchmarks/gpu/device_check.sh) carries to the
# device machine. Run it here, on a machine that reaches PyPI, from the repo root:
#
#     bash python/benchmarks/gpu/stage/stage.sh
#
#  1. downloads each wheel of wheels.txt into .whl/ (skipping those already there),
#     with pip download --no-deps --only-binary=:all: for CPython 3.12 on the
#     line's platform tags, and repacks vllm with repack.py;
#  2. checks each wheel's SHA-256 against wheels.sha256 (a mismatch is a warning
#     naming the wheel: PyPI files of a pinned version do not change, so something
#     is off);
#  3. rewrites the wheels uncompressed (stored.py), tars them, xz -9e's the tarball
#     and splits it into as few equal chunks of at most CHUNK_MIB (40) MiB as it
#     can: .stage/chunkNN/, each with the manifests (SHA256SUMS, WHEELS.SHA256)
#     and a copy of reassemble.sh;
#  4. runs `make build` (SKIP_BUILD=1 skips it) and puts the native library,
#     xz'd, in .stage/native/_native.abi3.so.xz;
#  5. prints the sizes and the device calls to make.
# .whl/ and .stage/ are ignored by git; each device call may carry 64 MiB in all.
set -euo pipefail

say() { echo "STAGE $*"; }
die() { say "FAIL: $*"; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../../.." && pwd)
cd "$root"
[ -f python/benchmarks/gpu/device_check.sh ] || die "$root is not the repo root"
PY=${PYTHON:-python3}
CHUNK_MIB=${CHUNK_MIB:-40}
whl=$root/.whl
stage=$root/.stage
t_start=$(date +%s)
mkdir -p "$whl" "$stage"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

norm() { echo "$1" | tr 'A-Z' 'a-z' | sed 's/[-_.]\{1,\}/_/g'; }
sum_of() { sha256sum "$1" | cut -d' ' -f1; }

# 1) download (and repack vllm)
wanted=()
while read -r spec tags; do
  case "$spec" in ''|'#'*) continue ;; esac
  name=${spec%%==*}; version=${spec#*==}
  file=$(awk -v p="$(norm "$name")-$version-" 'index($2, p) == 1 {print $2}' "$here/wheels.sha256")
  [ -n "$file" ] || die "$spec: no $(norm "$name")-$version-*.whl in wheels.sha256"
  wanted+=("$file")
  want=$(awk -v f="$file" '$2 == f {print $1}' "$here/wheels.sha256")
  platforms=()
  for t in $tags; do platforms+=(--platform "$t"); done
  if [ "$name" = vllm ]; then
    # vllm is repacked: a file of the right name may be the untouched PyPI wheel.
    if [ -f "$whl/$file" ] && [ "$(sum_of "$whl/$file")" = "$want" ]; then continue; fi
    dest=$tmp/pypi
  else
    [ -f "$whl/$file" ] && continue
    dest=$whl
  fi
  say "download $spec ${tags:+($tags)}"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    ${platforms[@]+"${platforms[@]}"} -d "$dest" "$spec" </dev/null || die "pip could not download $spec"
  [ -f "$dest/$file" ] || die "$spec: pip saved $(ls "$dest" | grep -i "^$(norm "$name")-" | tr '\n' ' '), not $file"
  if [ "$name" = vllm ]; then
    say "repack $file"
    "$PY" "$here/repack.py" "$dest/$file" "$whl/$file" </dev/null | sed 's/^/STAGE   /'
    rm -f "$dest/$file"
  fi
done < "$here/wheels.txt"

# 2) check the set
bad=0
for f in "${wanted[@]}"; do
  want=$(awk -v f="$f" '$2 == f {print $1}' "$here/wheels.sha256")
  got=$(sum_of "$whl/$f")
  if [ "$got" != "$want" ]; then
    bad=$((bad + 1))
    say "WARNING: $f has SHA-256 $got, wheels.sha256 says $want (a pinned PyPI file does not change: look at it before using the set)"
  fi
done
for f in "$whl"/*.whl; do
  b=$(basename "$f")
  printf '%s\n' "${wanted[@]}" | grep -qxF "$b" || say "WARNING: $b is in .whl/ but not in wheels.txt: it is left out of the bundle"
done
say "${#wanted[@]} wheels in .whl/: $(( ${#wanted[@]} - bad )) match wheels.sha256, $bad do not"

# 3) the bundle: stored wheels, tar, xz, chunks (the wheels of wheels.txt only)
mkdir -p "$tmp/src"
for f in "${wanted[@]}"; do ln -s "$whl/$f" "$tmp/src/$f"; done
"$PY" "$here/stored.py" "$tmp/src" "$tmp/whl" >/dev/null
(cd "$tmp/whl" && sha256sum *.whl > "$tmp/WHEELS.SHA256")
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2026-12-01' -cf "$tmp/bundle.tar" -C "$tmp/whl" .
rm -rf "$tmp/whl"
say "xz -9e the bundle ($(( $(stat -c %s "$tmp/bundle.tar") / 1048576 )) MiB; a few minutes)"
xz -9e -T1 "$tmp/bundle.tar"
size=$(stat -c %s "$tmp/bundle.tar.xz")
limit=$(( CHUNK_MIB * 1048576 ))
nchunks=$(( (size + limit - 1) / limit ))
per=$(( (size + nchunks - 1) / nchunks ))
rm -rf "$stage"/chunk[0-9]*
(cd "$tmp" && split -b "$per" -d -a 2 --numeric-suffixes=1 bundle.tar.xz bundle.tar.xz.part)
: > "$tmp/SHA256SUMS"
for f in "$tmp"/bundle.tar.xz.part*; do
  n=${f##*.part}; mkdir -p "$stage/chunk$n"; mv "$f" "$stage/chunk$n/"
  (cd "$stage" && sha256sum "chunk$n/bundle.tar.xz.part$n") >> "$tmp/SHA256SUMS"
done
(cd "$tmp" && sha256sum bundle.tar.xz) >> "$tmp/SHA256SUMS"
for d in "$stage" "$stage"/chunk[0-9]*; do
  cp "$tmp/SHA256SUMS" "$tmp/WHEELS.SHA256" "$here/reassemble.sh" "$d/"
done

# 4) the native library (ignored by git, so it travels xz'd in .stage/native)
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  say "make build"
  make build >"$tmp/build.log" 2>&1 || { tail -20 "$tmp/build.log"; die "make build failed"; }
fi
so=python/dynamo_ctx/_native.abi3.so
[ -f "$so" ] || die "no $so (run make build)"
rm -rf "$stage/native" && mkdir -p "$stage/native"
xz -9 -T0 -c "$so" > "$stage/native/_native.abi3.so.xz"
sha256sum "$so" > "$stage/native/SHA256"

# 5) sizes and the calls to make
mib() { awk -v b="$1" 'BEGIN {printf "%.2f MiB", b / 1048576}'; }
bytes() { du -sb "$@" | awk '{s += $1} END {print s}'; }
tree=0
if git rev-parse --git-dir >/dev/null 2>&1; then
  tree=$( (git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null || true) | awk '{s += $1} END {print s + 0}')
fi
say "bundle $(mib "$size") in $nchunks chunk(s); working tree that travels with every call: $(mib "$tree")"
chunks=("$stage"/chunk[0-9]*)
for d in "${chunks[@]}" "$stage/native"; do say "  .stage/$(basename "$d"): $(mib "$(bytes "$d")")"; done
for i in "${!chunks[@]}"; do
  carried=$(bytes "${chunks[$i]}"); [ "$i" = 0 ] && carried=$((carried + $(bytes "$stage/native")))
  total=$((carried + tree))
  [ "$total" -le $((64 * 1048576)) ] || say "WARNING: call $((i + 1)) would send $(mib "$total"), over the 64 MiB a call may carry"
done
say "done in $(( $(date +%s) - t_start ))s. The device calls, back to back (the machine goes back 30 s after a call; then carry every chunk again):"
last=${#chunks[@]}
for i in "${!chunks[@]}"; do
  n=$((i + 1)); c=$(basename "${chunks[$i]}")
  check="(cd .stage && grep ' $c/' $c/SHA256SUMS | sha256sum -c -)"
  if [ "$n" = "$last" ]; then
    carry="\".stage/$c\""; [ "$n" = 1 ] && carry="$carry, \".stage/native\""
    echo "  call $n: carry [$carry], timeout_s 600, command:"
    echo "    bash python/benchmarks/gpu/device_check.sh"
  elif [ "$n" = 1 ]; then
    echo "  call $n: carry [\".stage/$c\", \".stage/native\"], timeout_s 300, command:"
    echo "    python3 python/benchmarks/gpu/make_tiny_llama.py /tmp/dc-tiny-llama && $check"
  else
    echo "  call $n: carry [\".stage/$c\"], timeout_s 60, command:"
    echo "    $check"
  fi
done
