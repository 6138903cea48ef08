package api

import (
	"bufio"
	"bytes"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/store"
)

type logEntry struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// logEntries merges lifecycle events and console lines in time order. Console
// lines carry a leading RFC3339 timestamp when the agent wrote them; others
// inherit the previous line's time.
func logEntries(sb *store.Sandbox, console []byte, evs []*store.Event) []logEntry {
	var out []logEntry
	for _, e := range evs {
		out = append(out, logEntry{Timestamp: e.Time, Level: e.Level, Message: e.Message, Fields: map[string]string{"type": e.Type, "source": "control"}})
	}
	last := sb.StartedAt
	sc := bufio.NewScanner(bytes.NewReader(console))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		ts := last
		if first, rest, ok := strings.Cut(line, " "); ok {
			if t, err := time.Parse(time.RFC3339Nano, first); err == nil {
				ts, line = t, rest
			} else if t, err := time.Parse("2006/01/02", first); err == nil {
				// log package default: "2006/01/02 15:04:05 msg"
				if clock, rest2, ok := strings.Cut(rest, " "); ok {
					if c, err := time.Parse("15:04:05", clock); err == nil {
						ts = t.Add(time.Duration(c.Hour())*time.Hour + time.Duration(c.Minute())*time.Minute + time.Duration(c.Second())*time.Second)
						line = rest2
					}
				}
			}
		}
		last = ts
		level := "info"
		if strings.Contains(strings.ToLower(line), "error") {
			level = "error"
		}
		out = append(out, logEntry{Timestamp: ts, Level: level, Message: line, Fields: map[string]string{"source": "agent"}})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Timestamp.Before(out[j].Timestamp) })
	return out
}

// unixMillisParam reads an optional unix-milliseconds query parameter,
// answering 400 itself when it is malformed.
func unixMillisParam(w http.ResponseWriter, q url.Values, name string) (time.Time, bool) {
	v := q.Get(name)
	if v == "" {
		return time.Time{}, true
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 {
		writeError(w, http.StatusBadRequest, name+" must be a unix time in milliseconds")
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

var levelRank = map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}

func (s *Server) logsV1(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	since, ok := unixMillisParam(w, q, "start")
	if !ok {
		return
	}
	limit := 1000
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "limit must be a non-negative integer")
			return
		}
		limit = n
	}
	sb, console, evs, err := s.mgr.Logs(r.Context(), chi.URLParam(r, "id"), time.Time{}, 10000)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	type line struct {
		Timestamp time.Time `json:"timestamp"`
		Line      string    `json:"line"`
	}
	resp := struct {
		Logs       []line     `json:"logs"`
		LogEntries []logEntry `json:"logEntries"`
	}{Logs: []line{}, LogEntries: []logEntry{}}
	for _, e := range logEntries(sb, console, evs) {
		if e.Timestamp.Before(since) || len(resp.Logs) >= limit {
			continue
		}
		resp.Logs = append(resp.Logs, line{Timestamp: e.Timestamp, Line: e.Message})
		resp.LogEntries = append(resp.LogEntries, e)
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) logsV2(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	cursor, ok := unixMillisParam(w, q, "cursor")
	if !ok {
		return
	}
	limit := 1000
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 1000 {
			writeError(w, http.StatusBadRequest, "limit must be between 0 and 1000")
			return
		}
		limit = n
	}
	dir := q.Get("direction")
	if dir != "" && dir != "forward" && dir != "backward" {
		writeError(w, http.StatusBadRequest, "direction must be forward or backward")
		return
	}
	minLevel := 0
	if v := q.Get("level"); v != "" {
		rank, ok := levelRank[v]
		if !ok {
			writeError(w, http.StatusBadRequest, "level must be debug, info, warn or error")
			return
		}
		minLevel = rank
	}
	search := q.Get("search")
	sb, console, evs, err := s.mgr.Logs(r.Context(), chi.URLParam(r, "id"), time.Time{}, 10000)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	all := logEntries(sb, console, evs)
	if dir == "backward" {
		for i, j := 0, len(all)-1; i < j; i, j = i+1, j-1 {
			all[i], all[j] = all[j], all[i]
		}
	}
	out := []logEntry{}
	for _, e := range all {
		if len(out) >= limit {
			break
		}
		if !cursor.IsZero() && ((dir == "backward" && e.Timestamp.After(cursor)) || (dir != "backward" && e.Timestamp.Before(cursor))) {
			continue
		}
		if levelRank[e.Level] < minLevel || (search != "" && !strings.Contains(e.Message, search)) {
			continue
		}
		out = append(out, e)
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": out})
}

type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       uint64    `json:"memUsed"`
	MemTotal      uint64    `json:"memTotal"`
	MemCache      uint64    `json:"memCache"`
	DiskUsed      uint64    `json:"diskUsed"`
	DiskTotal     uint64    `json:"diskTotal"`
}

func metricOf(st node.Stats) sandboxMetric {
	return sandboxMetric{Timestamp: st.Time.UTC(), TimestampUnix: st.Time.Unix(), CPUCount: st.CPUCount, CPUUsedPct: st.CPUUsedPct,
		MemUsed: st.MemUsed, MemTotal: st.MemTotal, MemCache: st.MemCache, DiskUsed: st.DiskUsed, DiskTotal: st.DiskTotal}
}

func (s *Server) metricsOne(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var start, end int64
	var err error
	if v := q.Get("start"); v != "" {
		if start, err = strconv.ParseInt(v, 10, 64); err != nil {
			writeError(w, http.StatusBadRequest, "start must be unix seconds")
			return
		}
	}
	if v := q.Get("end"); v != "" {
		if end, err = strconv.ParseInt(v, 10, 64); err != nil {
			writeError(w, http.StatusBadRequest, "end must be unix seconds")
			return
		}
	}
	if start > 0 && end > 0 && end < start {
		writeError(w, http.StatusBadRequest, "end must not be before start")
		return
	}
	samples, err := s.mgr.MetricsHistory(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []sandboxMetric{}
	for _, st := range samples {
		ts := st.Time.Unix()
		if (start > 0 && ts < start) || (end > 0 && ts > end) {
			continue
		}
		out = append(out, metricOf(st))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) metricsMany(w http.ResponseWriter, r *http.Request) {
	ids := strings.Split(r.URL.Query().Get("sandbox_ids"), ",")
	if len(ids) == 0 || ids[0] == "" || len(ids) > 100 {
		writeError(w, http.StatusBadRequest, "sandbox_ids must list 1 to 100 IDs")
		return
	}
	out := map[string]sandboxMetric{}
	for _, id := range ids {
		// Another team's IDs are skipped like unknown ones.
		if _, err := s.sandboxOf(r, id); err != nil {
			continue
		}
		samples, err := s.mgr.MetricsHistory(r.Context(), id)
		if err != nil || len(samples) == 0 {
			continue
		}
		out[id] = metricOf(samples[len(samples)-1])
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}
