#!/usr/bin/env bash
# Runs a reduced default pipeline on a real single-node SLURM cluster on this machine, through
# profiles/slurm and the SLURM executor plugin, and checks that every job went through SLURM.
#
#   tests/slurm/run_cluster.sh        (or: make test-slurm)
#
# For throwaway machines such as CI. It needs root and the project's virtual environment (`make test`
# builds it). It installs the Debian packages slurmctld, slurmd, slurm-client and munge if missing,
# writes /etc/slurm/slurm.conf (the job-step plugin's inner srun reads only that path; a file that was
# there is put back at the end), starts munged, slurmctld and slurmd, and stops them again by their
# process ids when it exits, on failure too. State, logs and the run live in a temporary folder,
# removed after a success and kept after a failure.
#
# Environment: VENV (default: .venv of this checkout), BT_SLURM_TIMEOUT (seconds allowed for the
# pipeline, default 900), BT_SLURM_KEEP=1 (keep the temporary folder).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${VENV:-$ROOT/.venv}
VENV=$(cd "$VENV" 2>/dev/null && pwd || echo "$VENV")
TIMEOUT=${BT_SLURM_TIMEOUT:-900}
SCRIPT_START=$(date +%s)

say() { printf '[slurm-check %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { say "FAILED: $*" >&2; exit 1; }

TMP=""
MUNGED_PID=""
SLURMCTLD_PID=""
SLURMD_PID=""
CONF=/etc/slurm/slurm.conf
CONF_BACKUP=""
CONF_WRITTEN=0
POLICY_WRITTEN=0

stop_pid() {  # stop_pid NAME PID: SIGTERM, up to 10 s, then SIGKILL
    local name=$1 pid=$2
    [ -n "$pid" ] || return 0
    kill -0 "$pid" 2>/dev/null || { say "$name (pid $pid) had already exited"; return 0; }
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        say "$name (pid $pid) did not stop on SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
    say "stopped $name (pid $pid)"
}

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    if [ "$POLICY_WRITTEN" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
    if [ -n "$SLURMCTLD_PID" ] && kill -0 "$SLURMCTLD_PID" 2>/dev/null; then
        # Jobs run under slurmstepd, outside slurmd's process: cancel what is left before stopping it.
        local left
        left=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
        if [ -n "${left// /}" ]; then
            say "cancelling SLURM jobs still queued or running: $left"
            # shellcheck disable=SC2086
            scancel $left
            for _ in $(seq 30); do
                [ -z "$(squeue -h -t RUNNING,COMPLETING -o %i 2>/dev/null)" ] && break
                sleep 1
            done
        fi
    fi
    stop_pid slurmd "$SLURMD_PID"
    stop_pid slurmctld "$SLURMCTLD_PID"
    stop_pid munged "$MUNGED_PID"
    if [ "$CONF_WRITTEN" = 1 ]; then
        if [ -n "$CONF_BACKUP" ]; then
            cp -p "$CONF_BACKUP" "$CONF" && say "restored the previous $CONF"
        else
            rm -f "$CONF"
        fi
    fi
    if [ -n "$TMP" ] && [ -d "$TMP" ]; then
        if [ "$rc" -eq 0 ] && [ "${BT_SLURM_KEEP:-0}" != 1 ]; then
            rm -rf "$TMP"
        else
            say "logs, SLURM state and the run are kept in $TMP"
        fi
    fi
    if [ "$rc" -eq 0 ]; then
        say "passed in $(( $(date +%s) - SCRIPT_START )) s"
    else
        say "FAILED (exit $rc) after $(( $(date +%s) - SCRIPT_START )) s"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

show_log() {  # last lines of a daemon's log, to explain a failure
    [ -f "$1" ] && { echo "---- tail of $1"; tail -n 30 "$1"; echo "----"; } >&2 || true
}

# ---------------------------------------------------------------------------------------------------
say "checking prerequisites"
[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts the SLURM daemons)"
[ -x "$VENV/bin/python" ] || die "no virtual environment at $VENV (run 'make test' or see README.md)"
"$VENV/bin/python" -c "import snakemake, snakemake_executor_plugin_slurm, snakemake_executor_plugin_slurm_jobstep" \
    || die "the virtual environment lacks snakemake or the SLURM executor plugin (reinstall: pip install -e '.[test]')"

need_install=0
for cmd in slurmctld slurmd sinfo squeue sbatch srun scontrol munged munge unmunge; do
    command -v "$cmd" >/dev/null 2>&1 || need_install=1
done
if [ "$need_install" = 1 ]; then
    say "installing SLURM and munge from Debian packages"
    command -v apt-get >/dev/null || die "apt-get not found: install slurmctld, slurmd, slurm-client and munge yourself"
    # Keep package scripts from starting the daemons on their own (we start and stop our own).
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        POLICY_WRITTEN=1
    fi
    pkgs=(slurmctld slurmd slurm-client munge)
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" > /tmp/bt-slurm-apt.log 2>&1; then
        say "apt-get install failed; updating the package lists and trying again"
        apt-get update -q > /tmp/bt-slurm-apt.log 2>&1 || { show_log /tmp/bt-slurm-apt.log; die "apt-get update failed"; }
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" > /tmp/bt-slurm-apt.log 2>&1 \
            || { show_log /tmp/bt-slurm-apt.log; die "apt-get install ${pkgs[*]} failed"; }
    fi
    if [ "$POLICY_WRITTEN" = 1 ]; then rm -f /usr/sbin/policy-rc.d; POLICY_WRITTEN=0; fi
    say "installed: $(slurmctld -V), $(munged --version 2>&1 | sed -n 1p)"
else
    say "SLURM is installed: $(slurmctld -V)"
fi
id munge >/dev/null 2>&1 || die "no 'munge' user (the munge package creates it)"

if [ -f "$CONF" ] && timeout 5 scontrol ping 2>/dev/null | grep "is UP" >/dev/null; then
    die "a SLURM controller already answers for $CONF; this script starts its own cluster and will not disturb that one"
fi

TMP=$(mktemp -d /tmp/bt-slurm.XXXXXX)
chmod 755 "$TMP"
mkdir -p "$TMP/state" "$TMP/spool" "$TMP/log" "$TMP/profile"
say "working folder: $TMP"

# ---------------------------------------------------------------------------------------------------
say "starting munged with a fresh key"
mkdir -p "$TMP/munge" /run/munge
dd if=/dev/urandom of="$TMP/munge/munge.key" bs=1024 count=1 status=none
chown -R munge:munge "$TMP/munge" /run/munge
chmod 700 "$TMP/munge"
chmod 400 "$TMP/munge/munge.key"
chmod 755 /run/munge
# setpriv execs munged in place, so $! is munged's own pid.
setpriv --reuid=munge --regid=munge --init-groups \
    munged --foreground --key-file="$TMP/munge/munge.key" --log-file="$TMP/munge/munged.log" \
    --pid-file="$TMP/munge/munged.pid" --seed-file="$TMP/munge/munged.seed" \
    > "$TMP/log/munged.out" 2>&1 < /dev/null &
MUNGED_PID=$!
for _ in $(seq 50); do
    munge -n 2>/dev/null | unmunge > /dev/null 2>&1 && break
    kill -0 "$MUNGED_PID" 2>/dev/null || { show_log "$TMP/log/munged.out"; show_log "$TMP/munge/munged.log"; die "munged exited"; }
    sleep 0.2
done
munge -n | unmunge > /dev/null || { show_log "$TMP/munge/munged.log"; die "munge credentials do not round-trip"; }
say "munged is up (pid $MUNGED_PID)"

# ---------------------------------------------------------------------------------------------------
HOST=$(hostname -s)
NODE_LINE=$(slurmd -C | sed -n 1p)  # NodeName=<host> CPUs=... RealMemory=... as slurmd sees them
CPUS=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<< "$NODE_LINE")
MEM=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<< "$NODE_LINE")
[ -n "$CPUS" ] && [ -n "$MEM" ] || die "could not read CPUs and memory from 'slurmd -C': $NODE_LINE"
say "node $HOST: $CPUS CPUs, $MEM MB"

mkdir -p /etc/slurm
MARKER="# Written by BehaviorTrace's tests/slurm/run_cluster.sh for a throwaway single-node cluster."
if [ -e "$CONF" ] && [ "$(head -n 1 "$CONF")" != "$MARKER" ]; then  # not one left over by an earlier run
    CONF_BACKUP="$TMP/slurm.conf.previous"
    cp -p "$CONF" "$CONF_BACKUP"
fi
CONF_WRITTEN=1
cat > "$CONF" <<EOF
$MARKER
ClusterName=behaviortrace
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$TMP/state
SlurmdSpoolDir=$TMP/spool
SlurmctldPidFile=$TMP/slurmctld.pid
SlurmdPidFile=$TMP/slurmd.pid
SlurmctldLogFile=$TMP/log/slurmctld.log
SlurmdLogFile=$TMP/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in a container: track processes by parent id, no task confinement.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# No accounting database; finished jobs are still recorded, one line each, in a text file.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$TMP/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
# squeue must still show a finished job when Snakemake asks for its status.
MinJobAge=600
$NODE_LINE NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=local Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF

say "starting slurmctld"
slurmctld -D > "$TMP/log/slurmctld.out" 2>&1 < /dev/null &
SLURMCTLD_PID=$!
for _ in $(seq 50); do
    scontrol ping 2>/dev/null | grep "is UP" >/dev/null && break
    kill -0 "$SLURMCTLD_PID" 2>/dev/null || { show_log "$TMP/log/slurmctld.out"; show_log "$TMP/log/slurmctld.log"; die "slurmctld exited"; }
    sleep 0.2
done
scontrol ping | grep "is UP" >/dev/null || { show_log "$TMP/log/slurmctld.log"; die "slurmctld does not answer"; }
say "slurmctld is up (pid $SLURMCTLD_PID)"

say "starting slurmd"
slurmd -D -N "$HOST" > "$TMP/log/slurmd.out" 2>&1 < /dev/null &
SLURMD_PID=$!
state=""
for _ in $(seq 120); do
    state=$(sinfo -h -n "$HOST" -o %T 2>/dev/null || true)
    [ "$state" = idle ] && break
    kill -0 "$SLURMD_PID" 2>/dev/null || { show_log "$TMP/log/slurmd.out"; show_log "$TMP/log/slurmd.log"; die "slurmd exited"; }
    sleep 0.5
done
if [ "$state" != idle ]; then
    scontrol show node "$HOST" >&2 || true
    show_log "$TMP/log/slurmd.log"
    die "node $HOST is '$state', not idle, after 60 s"
fi
say "slurmd is up (pid $SLURMD_PID); sinfo:"
sinfo

# ---------------------------------------------------------------------------------------------------
WORK="$TMP/work"
say "writing the small config and the local profile layer"
"$VENV/bin/python" "$ROOT/tests/slurm/cluster_check.py" prepare "$WORK" "$TMP/profile" "$CPUS" "$MEM"

# Jobs inherit this environment (sbatch --export=ALL): the venv on PATH, no hub access, and no
# account or partition from the caller's shell (this cluster has neither).
export PATH="$VENV/bin:$PATH"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset SBATCH_ACCOUNT SBATCH_PARTITION BEHAVIORTRACE_GPU_PARTITION

LOG="$TMP/log/snakemake.log"
say "running the pipeline through SLURM (snakemake --executor slurm --profile profiles/slurm; limit ${TIMEOUT} s)"
cd "$WORK"
RUN_START=$(date +%s)
set +e
timeout --signal=INT --kill-after=60 "$TIMEOUT" \
    "$VENV/bin/snakemake" --snakefile "$ROOT/Snakefile" --directory "$WORK" --configfile "$WORK/config.yaml" \
    --executor slurm --profile "$ROOT/profiles/slurm" --profile "$TMP/profile" \
    2>&1 | tee "$LOG" | grep --line-buffered -E "submitted with SLURM jobid|steps \([0-9]+%\) done|Error|error:|Exception" \
    | sed -u -e 's/ (log: .*)\.$//' -e 's/^/    /'
status=${PIPESTATUS[0]}
set -e
RUN_SECS=$(( $(date +%s) - RUN_START ))
if [ "$status" -ne 0 ]; then
    echo "---- tail of the Snakemake log ($LOG)" >&2
    tail -n 60 "$LOG" >&2
    for f in "$WORK"/.snakemake/slurm_logs/*/*/*.log "$WORK"/.snakemake/slurm_logs/*/*.log; do
        [ -f "$f" ] && grep -qiE "error|exception" "$f" && { echo "---- $f" >&2; tail -n 30 "$f" >&2; }
    done
    [ "$status" -eq 124 ] && die "the pipeline did not finish within $TIMEOUT s"
    die "snakemake exited with status $status after $RUN_SECS s"
fi
say "snakemake finished in $RUN_SECS s"

say "checking outputs and SLURM's record of the jobs"
n_submitted=$(grep -c "has been submitted with SLURM jobid" "$LOG" || true)
for _ in $(seq 20); do  # slurmctld appends a job's record as it ends; give the last one a moment
    [ "$(cat "$TMP/log/jobcomp.txt" 2>/dev/null | wc -l)" -ge "$n_submitted" ] && break
    sleep 0.5
done
"$VENV/bin/python" "$ROOT/tests/slurm/cluster_check.py" verify "$WORK" "$LOG" "$TMP/log/jobcomp.txt" \
    || die "the run on SLURM did not check out (see PROBLEM lines above)"

say "checking that a second run has nothing to do"
"$VENV/bin/snakemake" --snakefile "$ROOT/Snakefile" --directory "$WORK" --configfile "$WORK/config.yaml" \
    --executor slurm --profile "$ROOT/profiles/slurm" --profile "$TMP/profile" -n > "$TMP/log/dryrun.log" 2>&1 \
    || { tail -n 30 "$TMP/log/dryrun.log" >&2; die "dry run failed"; }
grep -q "Nothing to be done" "$TMP/log/dryrun.log" || { tail -n 40 "$TMP/log/dryrun.log" >&2; die "a second run would redo work"; }

say "pipeline wall time on SLURM: $RUN_SECS s"
cd "$ROOT"
