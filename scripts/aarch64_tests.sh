#!/usr/bin/env bash
# Run bertlab's tests on Arm (aarch64) on an x86 Linux machine, under QEMU's user-mode
# emulation: a Debian arm64 root in a folder, entered with chroot, every aarch64 program in it
# run by qemu-aarch64 (registered with binfmt_misc, so subprocesses are emulated too).
#
#   sudo scripts/aarch64_tests.sh ROOT [PYTEST ARGS...]
#
#   ROOT             a folder for the arm64 root (about 7.5 GB once installed); made on the
#                    first run and kept for later ones
#   PYTEST ARGS      what `python -m pytest` is given (default: the README's `-q -n 2`)
#   QEMU_CPU=NAME    the emulated CPU (default: QEMU's "max", with SVE, BF16 and I8MM; e.g.
#                    cortex-a72 for Advanced SIMD alone, neoverse-n1 for the dot product)
#
# What is emulated is the instruction set; timings mean nothing here, only correctness. The
# checkout of this working tree's HEAD is cloned into ROOT, with ../shared beside it where
# there is one. /proc is the host's, so the CPU's description bertlab reads from
# /proc/cpuinfo is replaced in the root by an Arm one whose features follow QEMU_CPU.
#
# Needs root, Debian's qemu-user-static, binfmt-support and debootstrap (installed here if
# apt-get is there), and network access to Debian's and PyPI's packages. PyTorch is the
# README's, 2.13.0 (TORCH=VERSION for another, in a virtual environment of its own): PyPI's
# aarch64 wheel of it is a CUDA build, whose CUDA libraries make the environment about 6 GB
# with the test extras, against 2.3 GB with 2.9.1's CPU build; it runs on the CPU all the same.
set -euo pipefail
[[ $# -ge 1 ]] || { sed -n '2,13p' "$0" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "$0: needs root (chroot, mount, binfmt_misc)" >&2; exit 2; }
ROOT=$(realpath -m "$1")
shift
REPO=$(cd "$(dirname "$0")/.." && pwd)
CPU=${QEMU_CPU:-max}
TORCH=${TORCH:-2.13.0}

if ! command -v debootstrap >/dev/null || [[ ! -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P ]]; then
    apt-get install -y -q qemu-user-static binfmt-support debootstrap >/dev/null
fi
mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
[[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] \
    || { echo "$0: qemu-aarch64 is not registered with binfmt_misc" >&2; exit 1; }

if [[ ! -x $ROOT/usr/bin/python3 ]]; then
    debootstrap --arch=arm64 --include=python3,python3-venv,python3-dev,gcc,g++,git,ca-certificates \
        bookworm "$ROOT" http://deb.debian.org/debian
fi
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"

# /proc/cpuinfo as an Arm CPU of QEMU_CPU's features would show it
case $CPU in
    cortex-a72) features="fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid" ;;
    neoverse-n1) features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs" ;;
    a64fx) features="fp asimd evtstrm sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm fcma dcpop sve" ;;
    *) features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg dcpodp sve2 svei8mm svebf16 i8mm bf16 dgh rng" ;;
esac
cpuinfo=$(mktemp)
for n in 0 1; do
    printf 'processor\t: %s\nFeatures\t: %s\nCPU implementer\t: 0x41\nCPU architecture: 8\n\n' "$n" "$features"
done >"$cpuinfo"

mounted=()
cleanup() {
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[i]}" 2>/dev/null || true; done
    rm -f "$cpuinfo"
}
trap cleanup EXIT
bind() {  # bind SOURCE TARGET [ro]
    mount --bind "$1" "$2"
    mounted+=("$2")
    [[ ${3:-} != ro ]] || mount -o remount,ro,bind "$2"
}
bind /proc "$ROOT/proc"
bind /sys "$ROOT/sys"
bind /dev "$ROOT/dev"
bind /dev/shm "$ROOT/dev/shm"
bind "$cpuinfo" "$ROOT/proc/cpuinfo" ro

rm -rf "$ROOT/root/bertlab"
git clone -q "$REPO" "$ROOT/root/bertlab"
if [[ -d $REPO/../shared ]]; then
    mkdir -p "$ROOT/root/shared"
    bind "$(realpath "$REPO/../shared")" "$ROOT/root/shared" ro
fi

args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(-q -n 2)
export QEMU_CPU=$CPU
chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/bin:/bin LANG=C.UTF-8 QEMU_CPU="$CPU" \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CERT=/etc/ssl/certs/ca-certificates.crt TORCH="$TORCH" /bin/bash -c '
    set -euo pipefail
    cd /root/bertlab
    venv=/root/venv-torch-$TORCH
    [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
    . "$venv/bin/activate"
    pip install -q "torch==$TORCH" -e ".[test]"
    uname -m
    python -c "from bertlab.nn import cpu; p = cpu.current(); print(p.cpu_class, sorted(p.features.flags), \"int8:\", p.int8_kernel or p.int8_why)"
    exec python -m pytest "$@"
' bash "${args[@]}"
