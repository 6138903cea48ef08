#!/usr/bin/env bash
# gpu-device-check: on a real NVIDIA host, discover the GPU read-only, start a
# sandbox with it through the API and run nvidia-smi inside. Bounded to five
# minutes; never rebinds or resets a device (passthrough backend only).
#
#   scripts/gpu-device-check.sh            # uses bin/ (builds it if missing)
#
# Needs: runc, the base image (scripts/install), and the JS SDK in
# test/e2b-js/node_modules for the in-sandbox command (scripts/install).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec 2>&1
deadline=$((SECONDS + 300))
step() { printf '\n==> %s (t=%ss)\n' "$*" "$SECONDS"; }

step "host"
uname -a
command -v nvidia-smi && nvidia-smi --query-gpu=pci.bus_id,name,memory.total,driver_version,uuid --format=csv,noheader || echo "nvidia-smi not found"
ls -l /dev/nvidia* 2>/dev/null || { echo "no /dev/nvidia* nodes: not an NVIDIA host"; exit 2; }

if [ ! -x bin/cubicle ] || [ ! -x bin/cubicle-agent ]; then
	step "build"
	mkdir -p bin
	CGO_ENABLED=0 timeout 240 go build -o bin/cubicle-agent ./cmd/cubicle-agent
	timeout 240 go build -o bin/cubicle ./cmd/cubicle
fi

step "read-only discovery (cubicle gpu discover)"
bin/cubicle gpu discover | tee /tmp/cubicle-gpu-discover.json
grep -q '"vendor": "nvidia"' /tmp/cubicle-gpu-discover.json || { echo "no NVIDIA device discovered"; exit 1; }

data=$(mktemp -d /var/tmp/cubicle-gpu-check-XXXXXX)
images=${CUBICLE_IMAGES_DIR:-/var/lib/cubicle/images}
port=$((20000 + RANDOM % 20000))
url=http://127.0.0.1:$port
key=$(bin/cubicle apikey create --data-dir "$data")
step "serve on $url (data $data)"
bin/cubicle serve --data-dir "$data" --images-dir "$images" --listen "127.0.0.1:$port" --metrics-listen off \
	--bridge cbgpu0 --pool 10.213.0.0/24 --cgroup-parent cubicle-gpu-check --accel-backend passthrough >"$data/serve.log" 2>&1 &
serve=$!
cleanup() {
	[ -n "${sb:-}" ] && CUBICLE_API_URL=$url CUBICLE_API_KEY=$key bin/cubicle sandbox kill "$sb" >/dev/null 2>&1 || true
	kill "$serve" 2>/dev/null && wait "$serve" 2>/dev/null || true
	echo "--- serve log (tail)"; tail -n 40 "$data/serve.log" || true
	rm -rf "$data"
}
trap cleanup EXIT
until curl -fsS "$url/health" >/dev/null 2>&1; do
	[ $SECONDS -lt $deadline ] || { echo "serve did not come up"; exit 1; }
	kill -0 $serve 2>/dev/null || { echo "serve exited"; exit 1; }
	sleep 0.2
done
export CUBICLE_API_URL=$url CUBICLE_API_KEY=$key

step "inventory (cubicle gpu list)"
bin/cubicle gpu list

step "create a sandbox with one GPU (the agent's guest check runs nvidia-smi)"
t0=$(date +%s%N)
sb=$(timeout 120 bin/cubicle sandbox create --accelerator class=gpu,count=1 --timeout 300)
echo "sandbox $sb created in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
bin/cubicle gpu list

step "nvidia-smi inside the sandbox"
E2B_API_URL=$url E2B_SANDBOX_URL=$url E2B_API_KEY=$key E2B_DOMAIN=cubicle.local SB=$sb \
	NODE_PATH=test/e2b-js/node_modules timeout 120 node -e '
const { Sandbox } = require("e2b")
;(async () => {
  const sb = await Sandbox.connect(process.env.SB)
  const r = await sb.commands.run("ls -l /dev/nvidia*; nvidia-smi; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv", { timeoutMs: 60000, user: "root" })
  process.stdout.write(r.stdout + r.stderr)
  process.exit(r.exitCode)
})().catch((e) => { console.error(e); process.exit(1) })'

step "kill and check the device is allocatable again"
bin/cubicle sandbox kill "$sb"; sb=
bin/cubicle gpu list
bin/cubicle gpu events
echo; echo "gpu-device-check: OK in ${SECONDS}s"
