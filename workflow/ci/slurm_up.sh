#!/usr/bin/env bash
# Start a single-node SLURM cluster on this machine (slurmctld + slurmd on localhost, munge auth), the way a test
# suite starts a database: `sudo workflow/ci/slurm_up.sh` (root: it installs Debian's slurm-wlm and munge).
# Idempotent: if `sinfo` already answers, it does nothing. Then: snakemake --profile profiles/slurm ...
set -euo pipefail

if command -v sinfo >/dev/null && sinfo -h >/dev/null 2>&1; then
    echo "slurm_up: a cluster already answers"; sinfo; exit 0
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi

host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))
state=/var/spool/slurm-ci
mkdir -p "$state/ctld" "$state/d" /etc/slurm /run/munge /var/log/munge /var/lib/munge /etc/munge

# munge: a key, then the daemon (as root is fine in a throwaway CI container; --force skips the ownership checks)
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || munged --force

sed -e "s|@HOST@|$host|g" -e "s|@CPUS@|$cpus|g" -e "s|@MEM@|$mem|g" -e "s|@STATE@|$state|g" \
    "$(dirname "$0")/slurm.conf.in" > /etc/slurm/slurm.conf

pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd

for _ in $(seq 60); do  # wait until the node is schedulable
    if sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
        echo "slurm_up: cluster up"; sinfo; exit 0
    fi
    sleep 1
done
echo "slurm_up: the node did not become idle; see $state/slurmctld.log and $state/slurmd.log" >&2
scontrol show node "$host" >&2 || true
exit 1
