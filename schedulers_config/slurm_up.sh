#!/usr/bin/env bash
# Bring up a throw-away one-host Slurm cluster (Debian bookworm, slurm-wlm 22.05) as root,
# with every piece of state under $SLURM_ROOT. No systemd, no cgroups.
#   NODES=1 (default): one node  "vm"  (= $(hostname))
#   NODES=2          : two nodes "vm" + "localhost" (two slurmd on ports 6818/6820;
#                      both names already resolve to 127.0.0.1 in /etc/hosts)
#   ACCOUNTING=1     : also MariaDB (127.0.0.1:3306) + slurmdbd (6819) so that `sacct` works
#                      (torchx 0.7.0's slurm status/describe/list shell out to sacct)
# Usage:  [NODES=2] [ACCOUNTING=1] bash schedulers_config/slurm_up.sh
#         export SLURM_CONF=$SLURM_ROOT/slurm.conf   # for sinfo/sbatch/srun/torchx
#         bash schedulers_config/slurm_up.sh down      # cancel its jobs, stop every daemon by its recorded PID
# Used by .ci/run (NODES=2 ACCOUNTING=1) for the Slurm end-to-end tests (tests/e2e/test_slurm.py).
set -euo pipefail
SLURM_ROOT=${SLURM_ROOT:-/tmp/slurm}
NODES=${NODES:-1}
ACCOUNTING=${ACCOUNTING:-0}
CPUS=${CPUS:-$(nproc)}
MEM_MB=${MEM_MB:-20000}
H1=$(hostname)          # "vm" here; resolves via /etc/hosts
H2=localhost

if [[ "${1:-}" == "down" ]]; then
  # jobs first: a job's processes outlive the daemons, and its record in the saved state would come back running
  ctld=$SLURM_ROOT/run/slurmctld.pid
  if [[ -f $ctld ]] && kill -0 "$(cat "$ctld")" 2>/dev/null; then
    SLURM_CONF=$SLURM_ROOT/slurm.conf scancel --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 20); do
      [[ -z $(SLURM_CONF=$SLURM_ROOT/slurm.conf squeue -h 2>/dev/null) ]] && break; sleep 0.5
    done
  fi
  # our own PID records (daemons delete their own pid files on SIGTERM); stop compute side first
  for name in slurmd-$H2 slurmd-$H1 slurmctld slurmdbd mariadbd munged; do
    f=$SLURM_ROOT/run/$name.pid; [[ -f $f ]] || continue
    pid=$(cat "$f"); echo "stopping $name pid=$pid"; kill "$pid" 2>/dev/null || true
  done
  for _ in $(seq 20); do
    alive=0; for f in "$SLURM_ROOT"/run/*.pid; do [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break; sleep 0.5
  done
  for f in "$SLURM_ROOT"/run/*.pid; do
    [[ -f $f ]] || continue; pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then echo "SIGKILL $(basename "$f" .pid) pid=$pid"; kill -9 "$pid" || true; fi
    rm -f "$f"
  done
  exit 0
fi

# 1. packages (~15 s; +~35 s for ACCOUNTING=1)
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      slurm-wlm slurmctld slurmd slurm-client munge >/dev/null
fi
if [[ $ACCOUNTING == 1 ]] && { ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; }; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmdbd mariadb-server >/dev/null
fi

# 2. directories
mkdir -p "$SLURM_ROOT"/{run,pids,log,state,spool,munge} /run/munge
chown munge:munge "$SLURM_ROOT/munge" /run/munge; chmod 755 /run/munge   # munged wants a+x on the socket dir
MUNGE_SOCK=/run/munge/munge.socket.2   # the default: sacct/sacctmgr->slurmdbd ignore AuthInfo=socket=

# 3. munge (Debian's postinst already created /etc/munge/munge.key)
[[ -s /etc/munge/munge.key ]] || { mungekey --create --keyfile=/etc/munge/munge.key; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
if ! munge -S "$MUNGE_SOCK" -n 2>/dev/null | unmunge -S "$MUNGE_SOCK" >/dev/null 2>&1; then
  rm -f "$MUNGE_SOCK"   # a socket left by a munged that is gone
  runuser -u munge -- munged --socket="$MUNGE_SOCK" \
      --pid-file="$SLURM_ROOT/munge/munged.pid" --log-file="$SLURM_ROOT/munge/munged.log" \
      --seed-file="$SLURM_ROOT/munge/munged.seed"
  for _ in $(seq 50); do [[ -f $SLURM_ROOT/munge/munged.pid ]] && break; sleep 0.1; done
  cp "$SLURM_ROOT/munge/munged.pid" "$SLURM_ROOT/run/munged.pid"
fi
munge -S "$MUNGE_SOCK" -n | unmunge -S "$MUNGE_SOCK" >/dev/null && echo "munge OK"

# 3b. optional accounting: MariaDB on loopback + slurmdbd
ACCT_LINES="AccountingStorageType=accounting_storage/none"
if [[ $ACCOUNTING == 1 ]]; then
  DB=$SLURM_ROOT/mysql
  if [[ ! -d $DB/data/mysql ]]; then
    mkdir -p "$DB/data"; chown -R mysql:mysql "$DB"
    mariadb-install-db --user=mysql --datadir="$DB/data" --auth-root-authentication-method=socket >/dev/null
  fi
  runuser -u mysql -- mariadbd --datadir="$DB/data" --socket="$DB/mysqld.sock" --pid-file="$DB/mysqld.pid" \
      --bind-address=127.0.0.1 --port=3306 --log-error="$DB/mysqld.err" --skip-name-resolve \
      </dev/null >/dev/null 2>&1 &
  for _ in $(seq 150); do mariadb --socket="$DB/mysqld.sock" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
  cp "$DB/mysqld.pid" "$SLURM_ROOT/run/mariadbd.pid"
  mariadb --socket="$DB/mysqld.sock" -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
  printf '%s\n' "AuthType=auth/munge" "DbdHost=$H1" "DbdPort=6819" \
    "SlurmUser=root" "LogFile=$SLURM_ROOT/log/slurmdbd.log" "PidFile=$SLURM_ROOT/pids/slurmdbd.pid" \
    "StorageType=accounting_storage/mysql" "StorageHost=127.0.0.1" "StoragePort=3306" \
    "StorageUser=slurm" "StoragePass=slurmpw" "StorageLoc=slurm_acct_db" > "$SLURM_ROOT/slurmdbd.conf"
  chmod 600 "$SLURM_ROOT/slurmdbd.conf"
  SLURM_CONF=$SLURM_ROOT/slurm.conf slurmdbd   # slurmdbd reads slurmdbd.conf next to $SLURM_CONF
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/6819) 2>/dev/null && break; sleep 0.2; done
  cp "$SLURM_ROOT/pids/slurmdbd.pid" "$SLURM_ROOT/run/"
  ACCT_LINES="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$H1
AccountingStoragePort=6819"
fi

# 4. slurm.conf
NODELINES="NodeName=$H1 NodeHostname=$H1 Port=6818 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
if [[ $NODES == 2 ]]; then
  NODELINES+=$'\n'"NodeName=$H2 NodeHostname=$H2 Port=6820 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
fi
cat > "$SLURM_ROOT/slurm.conf" <<EOF
ClusterName=feas
SlurmctldHost=$H1
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job may start again cred_expire seconds later (default 120)
AuthInfo=cred_expire=10
CredType=cred/munge
SlurmctldPort=6817
StateSaveLocation=$SLURM_ROOT/state
SlurmdSpoolDir=$SLURM_ROOT/spool/%n
SlurmctldPidFile=$SLURM_ROOT/pids/slurmctld.pid
SlurmdPidFile=$SLURM_ROOT/pids/slurmd-%n.pid
SlurmctldLogFile=$SLURM_ROOT/log/slurmctld.log
SlurmdLogFile=$SLURM_ROOT/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$ACCT_LINES
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# torchx submits heterogeneous jobs, which only backfill starts, and backfill runs again only when a job or node
# changes: a requeued job, once eligible, waits for the next node ping (every SlurmdTimeout/3 s, default 100)
# and for the main loop (sched_interval, default 60) to clear its BeginTime; these start it within about 10 s
SchedulerParameters=bf_interval=1,sched_interval=5
SlurmdTimeout=30
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
InactiveLimit=0
KillWait=5
MinJobAge=300
$NODELINES
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$SLURM_ROOT/slurm.conf

# 5. daemons (as root, no systemd); -N names the node (needed when two slurmd share a host)
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N "$H1"
if [[ $NODES == 2 ]]; then slurmd -f "$SLURM_CONF" -N "$H2"; fi
for _ in $(seq 50); do ls "$SLURM_ROOT"/pids/slurmd-*.pid "$SLURM_ROOT"/pids/slurmctld.pid >/dev/null 2>&1 && break; sleep 0.1; done
sleep 0.5; cp "$SLURM_ROOT"/pids/slurmctld.pid "$SLURM_ROOT"/pids/slurmd-*.pid "$SLURM_ROOT/run/"

# 5b. register the cluster/account/user in the accounting DB
if [[ $ACCOUNTING == 1 ]]; then
  for _ in $(seq 10); do sacctmgr -n list cluster format=cluster 2>/dev/null | grep -q feas && break
    sacctmgr -i add cluster feas >/dev/null 2>&1 || true; sleep 0.5; done
  sacctmgr -i add account research Cluster=feas >/dev/null 2>&1 || true
  sacctmgr -i add user root Account=research >/dev/null 2>&1 || true
  scontrol reconfigure || true
fi

# 5c. jobs an earlier run of this cluster left: the controller recovers them from StateSaveLocation as they
#     were, and one recovered as running (its processes died with that run) would hold its node for good
scancel --user="$(id -un)" 2>/dev/null || true

# 6. wait until every node is idle
for _ in $(seq 60); do
  states=$(sinfo -h -o '%t' 2>/dev/null || true)
  if [[ -n $states ]] && ! grep -qv '^idle$' <<<"$states"; then break; fi
  sleep 0.5
done
sinfo -N -l
