#!/bin/bash
# node-problem-detector custom plugin: `gpuperfd check` as a NodeCondition (GpuperfdUnhealthy).
#
# NPD's plugin protocol (kubernetes/node-problem-detector, pkg/custompluginmonitor: exit status
# 0 OK, 1 NonOK, 2 Unknown; the first line of stdout, cut at max_output_length, is the message).
# NPD holds the credentials that set the condition; gpuperfd needs none.
#
#   gpuperfd exit   meaning          NPD status
#   0               healthy          0 OK
#   10              degraded         0 OK (the message says degraded; the condition is for unhealthy)
#   11              unhealthy        1 NonOK  -> condition GpuperfdUnhealthy=True, reason GpuUnhealthy
#   12              could not check  2 Unknown
#   anything else   usage, bug       2 Unknown
#
# Passive checks only by default (NPD runs this every invoke_interval, on a busy node too); the
# plugin's timeout (25 s) is above the check's own bound.
GPUPERFD=${GPUPERFD:-/usr/local/bin/gpuperfd}
GPUPERFD_CHECK_ARGS=${GPUPERFD_CHECK_ARGS:---quick --timeout 20}
# shellcheck disable=SC2086
out=$("$GPUPERFD" check --line $GPUPERFD_CHECK_ARGS 2>/dev/null)
code=$?
line=${out%%$'\n'*}
case $code in
  0|10) status=0 ;;
  11) status=1 ;;
  *) status=2 ;;
esac
echo "${line:-gpuperfd check exited $code without output}"
exit $status
