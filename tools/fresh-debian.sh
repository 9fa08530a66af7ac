#!/usr/bin/env bash
# The README's first screen, the way a new user meets it: a clean Debian 12 root (debootstrap, minbase) with
# only the build tools the README names (build-essential, git), a clone of this repository's HEAD, then the
# two commands of the README's first code block, run as they stand, nothing else installed by hand.
#
#   bash tools/fresh-debian.sh [ROOT]      (root; ROOT defaults to /tmp/k3c-fresh-debian, reused if present)
#
# Needs root, debootstrap (installed here if missing) and a reachable Debian mirror. Each README command
# prints its exit status; the script exits non-zero if either failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=${1:-/tmp/k3c-fresh-debian}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
if [ ! -x "$root/usr/bin/apt-get" ]; then
    debootstrap --variant=minbase bookworm "$root" "$mirror" >/dev/null
fi
cleanup() {
    umount "$root/dev/pts" 2>/dev/null || true
    umount "$root/proc" 2>/dev/null || true
    umount "$root/dev" 2>/dev/null || true
}
trap cleanup EXIT
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
# terminals, as a machine has them (the test of `k3c chat` runs it in tmux, which needs a pty)
mountpoint -q "$root/dev/pts" || mount --bind /dev/pts "$root/dev/pts"
cp /etc/resolv.conf "$root/etc/resolv.conf"

# The build tools the README names, nothing else.
chroot "$root" /bin/sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential git >/dev/null'

rm -rf "$root/work/k3c"
mkdir -p "$root/work"
git clone -q . "$root/work/k3c"

# The first two commands of the README's first ```sh block (comments after '#' dropped).
mapfile -t cmds < <(awk '/^```sh/{f=1; next} /^```/{if (f) exit} f' README.md | sed 's/ *#.*$//' | grep -v '^$' | head -n 2)
[ "${#cmds[@]}" -eq 2 ] || { echo "fresh-debian: README's first code block has no two commands" >&2; exit 1; }

fail=0
for c in "${cmds[@]}"; do
    echo "fresh-debian: \$ $c"
    if chroot "$root" /bin/bash -c "cd /work/k3c && $c"; then
        echo "fresh-debian: exit 0"
    else
        rc=$?
        echo "fresh-debian: exit $rc"
        fail=1
    fi
done
exit $fail
