#!/bin/bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/prolog.d/gpuperfd.sh, or a file in your prolog.d):
# checks the node's GPUs with `gpuperfd check` before a job starts on it.
#
# Slurm's rule (https://slurm.schedmd.com/prolog_epilog.html, "Failure Handling"; slurm.conf "Prolog"):
# a Prolog that exits non-zero sets the node to DRAIN and requeues the job (held, unless
# SchedulerParameters=nohold_on_prolog_fail). So this script exits non-zero only where the node must
# not run the job, and drains it first with gpuperfd's own reason, which `sinfo -R` then shows
# instead of Slurm's generic "Prolog error".
#
#   gpuperfd exit   meaning          this prolog
#   0               healthy          exit 0
#   10              degraded         exit 0 (logged; add "degraded" to GPUPERFD_DRAIN_ON to drain)
#   11              unhealthy        drain with the reason, exit 1 (the job is requeued elsewhere)
#   12              could not check  exit 0, logged (add "unknown" to GPUPERFD_DRAIN_ON to drain)
#   2 / other       usage, bug       exit 0, logged: a broken gpuperfd must not drain a whole cluster
#
# Slurm runs prologs without a search path (prolog_epilog.html): paths are set here.
# Settings (environment, e.g. from /etc/default/gpuperfd-prolog):
#   GPUPERFD            the gpuperfd binary             (default /usr/local/bin/gpuperfd)
#   SCONTROL            the scontrol binary             (default /usr/bin/scontrol)
#   GPUPERFD_CHECK_ARGS arguments of `gpuperfd check`   (default "--quick --timeout 20": passive checks;
#                       drop --quick for the short probe, which needs up to 60 s: raise PrologEpilogTimeout)
#   GPUPERFD_DRAIN_ON   states that drain               (default "unhealthy")
set -u
[ -r /etc/default/gpuperfd-prolog ] && . /etc/default/gpuperfd-prolog
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
GPUPERFD=${GPUPERFD:-/usr/local/bin/gpuperfd}
SCONTROL=${SCONTROL:-/usr/bin/scontrol}
GPUPERFD_CHECK_ARGS=${GPUPERFD_CHECK_ARGS:---quick --timeout 20}
GPUPERFD_DRAIN_ON=${GPUPERFD_DRAIN_ON:-unhealthy}
node=$(hostname -s)

# shellcheck disable=SC2086 # the arguments are meant to split
line=$("$GPUPERFD" check --line $GPUPERFD_CHECK_ARGS 2>/dev/null)
code=$?
case $code in
  0) state=healthy ;;
  10) state=degraded ;;
  11) state=unhealthy ;;
  12) state=unknown ;;
  *) state=error ;;
esac
logger -t gpuperfd-prolog "job ${SLURM_JOB_ID:-?} node $node: gpuperfd check exit $code ($state): ${line:-no output}" 2>/dev/null || true

case " $(echo "$GPUPERFD_DRAIN_ON" | tr ',' ' ') " in
  *" $state "*)
    # Slurm keeps a reason short in `sinfo -R`; the whole line is in the log above.
    reason="gpuperfd: ${line:-$state}"
    "$SCONTROL" update nodename="$node" state=drain reason="${reason:0:200}"
    exit 1
    ;;
esac
exit 0
