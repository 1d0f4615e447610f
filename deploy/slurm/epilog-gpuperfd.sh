#!/bin/bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/epilog.d/gpuperfd.sh, or a file in your epilog.d): hands
# the GPUs the job just freed to gpuperfd's probes, so a due probe takes the gap at once instead of
# first waiting out probes.idle_seconds (docs/probes.md, "The scheduler's word"). The daemon's other
# checks still stand: a GPU the next job already holds (a process on it) is never probed.
#
# It never delays the next job: the request is sent in the background (bounded by --max-time), the
# script exits 0 at once whatever happens (no daemon, wrong password, no curl). Slurm's rule
# (prolog_epilog.html): a non-zero Epilog drains the node, so this one never fails.
#
# The request is a write: the daemon accepts it only with basic auth on (web.config_file with
# basic_auth_users, docs/operations.md), as every request then. Put the user's password in a netrc
# file readable by root only, e.g. /etc/gpuperfd/epilog.netrc (chmod 600):
#   machine 127.0.0.1 login slurm password <the password>
# Settings (environment, e.g. from /etc/default/gpuperfd-epilog):
#   CURL             the curl binary                   (default /usr/bin/curl)
#   GPUPERFD_URL     the daemon                        (default http://127.0.0.1:10187; https://... with TLS)
#   GPUPERFD_NETRC   the netrc file with the password  (default /etc/gpuperfd/epilog.netrc)
# Slurm runs epilogs without a search path (prolog_epilog.html): paths are set here.
set -u
[ -r /etc/default/gpuperfd-epilog ] && . /etc/default/gpuperfd-epilog
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CURL=${CURL:-/usr/bin/curl}
GPUPERFD_URL=${GPUPERFD_URL:-http://127.0.0.1:10187}
GPUPERFD_NETRC=${GPUPERFD_NETRC:-/etc/gpuperfd/epilog.netrc}

# The job's GPUs (Slurm sets SLURM_JOB_GPUS in the Epilog: indices, comma-separated). Anything else
# (unset, a UUID list, garbage) hands over none by name: the daemon then takes every GPU of the node,
# of which it probes only those its own checks find free.
gpus=${SLURM_JOB_GPUS:-}
case $gpus in
  '' | *[!0-9,]*) query="" ;;
  *) query="?gpus=$gpus" ;;
esac

if [ -x "$CURL" ]; then
  # Detached: no pipe or terminal of Slurm's is held, and the Epilog returns before curl does.
  ( "$CURL" --silent --output /dev/null --max-time 2 --netrc-file "$GPUPERFD_NETRC" --request POST \
      "$GPUPERFD_URL/api/v1/free$query" </dev/null >/dev/null 2>&1 & )
fi
exit 0
