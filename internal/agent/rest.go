package agent

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/cacerts"

	"github.com/cubicle-dev/cubicle/internal/agentapi"
)

// handleInit applies /init (agentapi.Init, whose doc says what each field
// does). It is idempotent. The caller must prove it knows
// the current token, either in X-Access-Token or by sending the same
// accessToken again (a resume re-sending identical state); anything else is
// 401, so a process inside or outside the sandbox cannot take over the agent
// by re-initialising it. The agent is given its first token before it
// serves (a root-only file bound in by the node), so there is no window in
// which /init is open to whoever reaches the address first.
//
// The timestamp is not used to set the clock: in a container the clock is the
// host's.
//
// A start command is validated and forked before any other field is applied,
// so a 400 (bad startUser/startWorkdir) or 500 (could not start it) leaves the
// agent unchanged and nothing running; /init does not wait for it to finish.
func (a *Agent) handleInit(w http.ResponseWriter, r *http.Request) {
	var req agentapi.Init
	if r.Body != nil {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, "read body: "+err.Error())
			return
		}
		if len(strings.TrimSpace(string(body))) > 0 {
			if err := json.Unmarshal(body, &req); err != nil {
				writeJSONError(w, http.StatusBadRequest, "invalid body: "+err.Error())
				return
			}
		}
	}
	if req.DefaultUser != nil && *req.DefaultUser != "" {
		if _, err := a.lookupUser(*req.DefaultUser); err != nil {
			writeJSONError(w, http.StatusBadRequest, "unknown defaultUser: "+*req.DefaultUser)
			return
		}
	}
	var egressCA *cacerts.Set
	if req.EgressCA != "" {
		set, err := cacerts.Parse([]byte(req.EgressCA))
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, "egressCA: "+err.Error())
			return
		}
		egressCA = set
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	hdr := r.Header.Get("X-Access-Token")
	sameToken := req.AccessToken != nil && tokenEqual(*req.AccessToken, a.token)
	if a.token == "" || (!tokenEqual(hdr, a.token) && !sameToken) {
		writeJSONError(w, http.StatusUnauthorized, "invalid access token")
		return
	}
	if req.AccessToken != nil && *req.AccessToken == "" {
		writeJSONError(w, http.StatusBadRequest, "accessToken must not be empty")
		return
	}
	// Before the start command, which may call a host that has rules.
	if egressCA != nil {
		if err := egressCA.Install(a.cfg.Root, cacerts.EgressPath); err != nil {
			writeJSONError(w, http.StatusInternalServerError, err.Error())
			return
		}
	}
	if strings.TrimSpace(req.StartCmd) != "" && !a.startClaimed {
		if a.startStatusFromThisBoot() {
			a.startClaimed = true
			a.log.Info("start command already started this boot; not starting it again")
		} else {
			sp, status, err := a.startFromInit(&req)
			if err != nil {
				writeJSONError(w, status, err.Error())
				return
			}
			a.startClaimed, a.startProc = true, sp
		}
	}
	if req.AccessToken != nil {
		a.token = *req.AccessToken
	}
	if req.EnvVars != nil {
		maps.Copy(a.envVars, req.EnvVars)
	}
	if req.DefaultUser != nil && *req.DefaultUser != "" {
		a.defaultUser = *req.DefaultUser
	}
	if req.DefaultWorkdir != nil && *req.DefaultWorkdir != "" {
		a.defaultWorkdir = *req.DefaultWorkdir
	}
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}

// startFromInit starts req's start command with the environment this /init
// is about to establish. It runs with a.mu held (hence no buildEnv). On error
// it returns the HTTP status to answer.
func (a *Agent) startFromInit(req *agentapi.Init) (*startProc, int, error) {
	spec := deref(req.StartUser)
	if spec == "" {
		spec = a.defaultUser
		if req.DefaultUser != nil && *req.DefaultUser != "" {
			spec = *req.DefaultUser
		}
		if spec == "" {
			spec = "user"
		}
	}
	u, err := a.resolveUserSpec(spec)
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("invalid startUser %q: %w", spec, err)
	}
	cwd, err := startCmdCwd(u, deref(req.StartWorkdir))
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("invalid startWorkdir %q: %w", deref(req.StartWorkdir), err)
	}
	vars := maps.Clone(a.envVars)
	maps.Copy(vars, req.EnvVars)
	sp, err := a.launchStartCmd(u, req.StartCmd, cwd, userEnv(u, vars, nil))
	if err != nil {
		return nil, http.StatusInternalServerError, err
	}
	return sp, 0, nil
}

// deref is a field the sender may leave out, "" when it did.
func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func (a *Agent) handleEnvs(w http.ResponseWriter, r *http.Request) {
	a.mu.RLock()
	env := maps.Clone(a.envVars)
	a.mu.RUnlock()
	writeJSON(w, http.StatusOK, env)
}

// metrics is the envd Metrics schema.
type metrics struct {
	Timestamp   int64   `json:"ts"`
	CPUCount    int     `json:"cpu_count"`
	CPUUsedPct  float64 `json:"cpu_used_pct"`
	MemTotal    uint64  `json:"mem_total"`
	MemUsed     uint64  `json:"mem_used"`
	MemCache    uint64  `json:"mem_cache"`
	MemTotalMiB uint64  `json:"mem_total_mib"`
	MemUsedMiB  uint64  `json:"mem_used_mib"`
	DiskUsed    uint64  `json:"disk_used"`
	DiskTotal   uint64  `json:"disk_total"`
}

type cpuSample struct{ busy, total uint64 }

type metricsState struct {
	mu   sync.Mutex
	last cpuSample
	have bool
}

func readCPU() (cpuSample, int, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuSample{}, 0, err
	}
	defer f.Close()
	var s cpuSample
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || !strings.HasPrefix(fields[0], "cpu") {
			continue
		}
		if fields[0] != "cpu" {
			n++
			continue
		}
		for i, v := range fields[1:] {
			x, _ := strconv.ParseUint(v, 10, 64)
			if i >= 8 { // guest time is already counted in user/nice
				break
			}
			s.total += x
			if i != 3 && i != 4 { // idle, iowait
				s.busy += x
			}
		}
	}
	return s, n, sc.Err()
}

// cpuPercent is the CPU use since the previous /metrics call (first call:
// over a short sampling window).
func (a *Agent) cpuPercent() (float64, int) {
	m := &a.metrics
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, n, err := readCPU()
	if err != nil {
		return 0, n
	}
	if !m.have {
		time.Sleep(100 * time.Millisecond)
		m.last, m.have = cur, true
		if cur, n, err = readCPU(); err != nil {
			return 0, n
		}
	}
	prev := m.last
	m.last = cur
	if cur.total <= prev.total {
		return 0, n
	}
	pct := float64(cur.busy-prev.busy) / float64(cur.total-prev.total) * 100
	return float64(int(pct*100+0.5)) / 100, n
}

func readMeminfo() map[string]uint64 {
	out := map[string]uint64{}
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		x, _ := strconv.ParseUint(fields[0], 10, 64)
		out[k] = x * 1024 // kB
	}
	return out
}

func (a *Agent) handleMetrics(w http.ResponseWriter, r *http.Request) {
	// /proc/stat is read under the metrics lock (one thread at a time);
	// /proc/meminfo (lxcfs: a FUSE read) and statfs in a file slot.
	pct, n := a.cpuPercent()
	var st unix.Statfs_t
	var stErr error
	mem, _ := inFileSlot(func() (map[string]uint64, error) {
		stErr = unix.Statfs("/", &st)
		return readMeminfo(), nil
	})
	m := metrics{Timestamp: time.Now().Unix(), CPUCount: n, CPUUsedPct: pct}
	m.MemTotal = mem["MemTotal"]
	if avail, ok := mem["MemAvailable"]; ok && avail <= m.MemTotal {
		m.MemUsed = m.MemTotal - avail
	}
	m.MemCache = mem["Cached"]
	m.MemTotalMiB = m.MemTotal / 1024 / 1024
	m.MemUsedMiB = m.MemUsed / 1024 / 1024
	if stErr == nil {
		m.DiskTotal = st.Blocks * uint64(st.Bsize)
		m.DiskUsed = (st.Blocks - st.Bfree) * uint64(st.Bsize)
	}
	writeJSON(w, http.StatusOK, m)
}
