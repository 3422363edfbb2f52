#!/usr/bin/env bash
# Runs a command on a clean clone of this repository's committed HEAD inside a
# brand-new minimal Debian 12 root (mmdebstrap --variant=minbase), the way a
# new user's machine meets the README, then removes the root. A machine you
# develop on has packages a new user's lacks; this is how to find the install
# step you forgot. Run it after any change to scripts/, CMake files,
# dependencies or data fetching, before asking for review.
#
#   bash scripts/fresh-check.sh                                  # bash scripts/test.sh
#   bash scripts/fresh-check.sh -- bash scripts/quickstart.sh
#   bash scripts/fresh-check.sh --keep -- bash -c 'bash scripts/setup.sh && bash scripts/build.sh loom'
#
# Options: --keep leaves the root for inspection (its path is printed);
# --refresh rebuilds the cached base root. Needs root (chroot and mounts) and,
# the first time, mmdebstrap (installed with apt-get if missing). The base
# root (~170 MB) is cached in /var/tmp/loom-fresh-check. Only the clone, DNS,
# a Debian /etc/hosts, the host's apt settings and local CA certificates enter
# the root, so apt and npm reach their registries as they do on the host.
# Exit status: the command's.
set -euo pipefail

die() { echo "fresh-check: error: $*" >&2; exit 2; }

repo=$(cd "$(dirname "$0")/.." && pwd)
keep=0 refresh=0
while (($#)); do
  case $1 in
    --keep) keep=1; shift ;;
    --refresh) refresh=1; shift ;;
    --) shift; break ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (allowed: --keep, --refresh, -- COMMAND...)" ;;
  esac
done
(($#)) || set -- bash scripts/test.sh
[[ $(id -u) -eq 0 ]] || die "needs root (it makes a chroot and mounts /proc, /sys, /dev into it)"
git -C "$repo" rev-parse --verify -q HEAD >/dev/null || die "$repo has no commit to clone"
if [[ -n $(git -C "$repo" status --porcelain --untracked-files=no) ]]; then
  echo "fresh-check: warning: uncommitted changes are not checked (the root gets a clone of HEAD)" >&2
fi

cache=/var/tmp/loom-fresh-check
base=$cache/bookworm-minbase.tar
mkdir -p "$cache"
if ((refresh)) || [[ ! -s $base ]]; then
  if ! command -v mmdebstrap >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "mmdebstrap is missing and apt-get is not available to install it"
    echo "fresh-check: installing mmdebstrap"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
  fi
  echo "fresh-check: building a minimal Debian 12 root into $base"
  mmdebstrap --variant=minbase --format=tar --quiet bookworm "$base.partial" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"
  mv "$base.partial" "$base"
fi

root=$(mktemp -d "$cache/root.XXXXXX")
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  if ((keep)); then
    echo "fresh-check: root kept at $root"
  else
    rm -rf --one-file-system "$root"
  fi
}
trap cleanup EXIT
tar -xf "$base" -C "$root"

mkdir -p "$root/work"
git clone -q "$repo" "$root/work/loom"
echo "fresh-check: cloned $(git -C "$repo" rev-parse --short HEAD) into a new Debian 12 root at $root"

# Network settings only: name resolution; the /etc/hosts every installed
# Debian has (debian-installer, cloud images and containers write one,
# mmdebstrap does not; without it each mpirun waits 5 s on DNS); the host's
# apt acquire settings (a proxy, a mirror's validity rules); its local CA
# certificates (a TLS-inspecting proxy's among them: update-ca-certificates
# keeps them when setup.sh installs ca-certificates).
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' "$(uname -n)" >"$root/etc/hosts"
cp -a /etc/apt/apt.conf.d/. "$root/etc/apt/apt.conf.d/" 2>/dev/null || true
mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ssl/certs"
cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
[[ -f /etc/ssl/certs/ca-certificates.crt ]] && cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"

for m in proc sys dev dev/pts dev/shm; do
  mkdir -p "$root/$m"
  case $m in
    proc) mount -t proc proc "$root/proc" ;;
    dev/shm) mount -t tmpfs -o size=2g tmpfs "$root/dev/shm" ;;
    *) mount --rbind "/$m" "$root/$m" && mount --make-rslave "$root/$m" ;;
  esac
  mounted+=("$root/$m")
done

echo "fresh-check: running '$*'"
start=$SECONDS
set +e
chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt \
  bash -c 'cd /work/loom && exec "$@"' fresh-check "$@"
rc=$?
set -e
echo "fresh-check: '$*' exited with status $rc after $((SECONDS - start)) s"
exit $rc
