#!/bin/sh
# A minimal binary plugin in shell: attach hands out <base>/sh-<id> as a plain
# directory. Wrappers set knobs and source it:
#   PRIVATE  private_data Create returns
#   OUTSIDE  non-empty: attach returns the base dir's parent (a violation)
op='' vid='' base=''
while [ $# -gt 0 ]; do
	case "$1" in
	--op) op=$2 ;;
	--volume-id) vid=$2 ;;
	--volume-base-dir) base=$2 ;;
	--*) ;;
	*) echo "unexpected argument $1" >&2; exit 2 ;;
	esac
	shift 2
done
case "$op" in
create) printf '{"token":"tok","private_data":"%s","error":""}\n' "${PRIVATE:-}" ;;
attach)
	dir="$base/sh-$vid"
	[ -n "${OUTSIDE:-}" ] && dir=$(dirname "$base")
	mkdir -p "$dir"
	printf '{"host_path":"%s","metadata":{"mount_dir":"%s"},"error":""}\n' "$dir" "$dir"
	;;
destroy | detach) echo '{"error":""}' ;;
*) echo "unknown op $op" >&2; exit 2 ;;
esac
