#!/bin/bash
# A binary volume plugin whose behaviour is chosen by the volume ID prefix,
# for fault-injection tests. Healthy volumes are bind mounts of
# <dir of this script>/data/<id> at <base>/fault-<id>; every call is logged
# to calls.log next to the script.
#   crash-*   attach mounts, then dies by SIGSEGV (the mount is left behind)
#   slow-*    attach mounts, then sleeps 600 s (a timeout or a killed server)
#   fail-*    attach prints {"error": ...} and exits 1 before mounting
#   escape-*  attach returns a host_path outside the base dir
#   bigpd-*   create returns 2000 bytes of private_data
#   nocreate-* create fails
set -u
here=$(cd "$(dirname "$0")" && pwd)
op= vid= name= sid= ref= base= pd= md=
while [ $# -gt 0 ]; do
  case "$1" in
    --op) op=$2; shift 2 ;;
    --volume-id) vid=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --sandbox-id) sid=$2; shift 2 ;;
    --namespace) shift 2 ;;
    --ref-count) ref=$2; shift 2 ;;
    --volume-base-dir) base=$2; shift 2 ;;
    --private-data) pd=$2; shift 2 ;;
    --metadata) md=$2; shift 2 ;;
    *) echo "{\"error\":\"unknown flag $1\"}"; exit 2 ;;
  esac
done
echo "$op $vid sandbox=$sid ref=$ref pd=$pd md=$md" >> "$here/calls.log"
data="$here/data/$vid"
# Detach is not told the base dir; remember it from attach.
[ -n "$base" ] && echo "$base" > "$here/base-dir"
[ -z "$base" ] && [ -f "$here/base-dir" ] && base=$(cat "$here/base-dir")
mnt="$base/fault-$vid"
mountit() {
  mkdir -p "$data" "$mnt"
  chmod 0777 "$data"
  mountpoint -q "$mnt" || mount --bind "$data" "$mnt"
}
case "$op" in
  create)
    case "$vid" in
      nocreate-*) echo '{"error":"backend refused the volume"}'; exit 1 ;;
      bigpd-*) printf '{"token":"","private_data":"%s","error":""}\n' "$(head -c 2000 /dev/zero | tr '\0' x)"; exit 0 ;;
    esac
    mkdir -p "$data"
    echo "{\"token\":\"\",\"private_data\":\"fault/$vid\",\"error\":\"\"}" ;;
  destroy)
    rm -rf "$data"
    echo '{"error":""}' ;;
  attach)
    case "$vid" in
      fail-*) echo '{"error":"backend is down"}'; exit 1 ;;
      escape-*) mkdir -p "$here/escape"; echo "{\"host_path\":\"$here/escape\",\"metadata\":{},\"error\":\"\"}"; exit 0 ;;
    esac
    [ "$ref" = 0 ] && mountit
    case "$vid" in
      crash-*) kill -SEGV $$ ;;
      slow-*) echo "slow attach started" >> "$here/calls.log"; exec sleep 600 ;;
    esac
    mountpoint -q "$mnt" || mountit
    echo "{\"host_path\":\"$mnt\",\"metadata\":{\"mount_dir\":\"$mnt\"},\"error\":\"\"}" ;;
  detach)
    if [ "$ref" = 0 ]; then
      if [ -d "$mnt" ]; then
        mountpoint -q "$mnt" && umount "$mnt"
        rmdir "$mnt" 2>/dev/null
      fi
    fi
    echo '{"error":""}' ;;
  *) echo "{\"error\":\"unknown op $op\"}"; exit 2 ;;
esac
