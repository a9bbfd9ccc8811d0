package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"warren.dev/agent/internal/identity"
	"warren.dev/agent/internal/metrics"
)

// metricsAgent serves a sampler over /proc-like files whose clock steps 5 s
// per sample from 1000, so the test knows every sample's time.
func metricsAgent(t *testing.T) (*agent, *metrics.Sampler) {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"stat":    "cpu 100 0 0 100 0 0 0 0 0 0\n",
		"meminfo": "MemTotal: 4096 kB\nMemAvailable: 1024 kB\nCached: 512 kB\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	clock := int64(995)
	sampler := metrics.New(metrics.Config{ProcDir: dir, DiskPath: dir, Now: func() time.Time {
		clock += 5
		return time.Unix(clock, 0)
	}})
	self, err := identity.Self()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Config{AccessToken: token, Self: self, Metrics: sampler}))
	t.Cleanup(srv.Close)
	return &agent{t: t, url: srv.URL}, sampler
}

func (a *agent) samples(query string) []map[string]any {
	a.t.Helper()
	res := a.do(http.MethodGet, "/metrics"+query, "", nil, true)
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/json" {
		a.t.Fatalf("GET /metrics%s: %d %s", query, res.StatusCode, res.Header.Get("Content-Type"))
	}
	var out []map[string]any
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil || out == nil {
		a.t.Fatalf("GET /metrics%s: not a JSON array: %v", query, err)
	}
	return out
}

func TestMetricsNeedTheTokenAndAnswerSamplesOldestFirst(t *testing.T) {
	a, sampler := metricsAgent(t)
	if res := a.do(http.MethodGet, "/metrics", "", nil, false); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /metrics without the token: %d, want 401", res.StatusCode)
	}

	// Nothing sampled yet: the call takes one.
	first := a.samples("")
	if len(first) != 1 {
		t.Fatalf("first call: %d samples, want 1", len(first))
	}
	var keys []string
	for k := range first[0] {
		keys = append(keys, k)
	}
	for _, k := range []string{"ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "mem_cache", "disk_used", "disk_total"} {
		if _, ok := first[0][k]; !ok {
			t.Errorf("a sample has no %q (it has %v)", k, keys)
		}
	}
	if len(first[0]) != 8 {
		t.Errorf("a sample has fields %v, want the 8 of envd", keys)
	}
	if first[0]["ts"] != 1000.0 || first[0]["mem_total"] != 4096.0*1024 || first[0]["mem_used"] != 3072.0*1024 || first[0]["mem_cache"] != 512.0*1024 {
		t.Errorf("sample: %v", first[0])
	}

	for range 3 { // at 1005, 1010, 1015
		if err := sampler.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	ts := func(samples []map[string]any) (out []float64) {
		for _, s := range samples {
			out = append(out, s["ts"].(float64))
		}
		return out
	}
	for query, want := range map[string][]float64{
		"":                     {1000, 1005, 1010, 1015},
		"?start=1005":          {1005, 1010, 1015},
		"?end=1005":            {1000, 1005},
		"?start=1005&end=1010": {1005, 1010},
		"?start=1001&end=1004": nil,
		"?start=2000":          nil,
		"?start=1010&end=1005": nil,
	} {
		if got := ts(a.samples(query)); !slices.Equal(got, want) {
			t.Errorf("GET /metrics%s: times %v, want %v", query, got, want)
		}
	}
}

func TestMetricsRefuseBadRangesAndOtherMethods(t *testing.T) {
	a, _ := metricsAgent(t)
	for query, param := range map[string]string{
		"?start=yesterday": "start",
		"?end=1.5":         "end",
		"?start=-1":        "start",
		"?start=1&end=x":   "end",
	} {
		res := a.do(http.MethodGet, "/metrics"+query, "", nil, true)
		var body struct {
			Code    int
			Message string
		}
		_ = json.NewDecoder(res.Body).Decode(&body)
		if res.StatusCode != http.StatusBadRequest || body.Code != 400 ||
			!strings.Contains(body.Message, param+"=") || !strings.Contains(body.Message, "unix seconds") {
			t.Errorf("GET /metrics%s: %d %+v, want 400 naming %s and the fix", query, res.StatusCode, body, param)
		}
	}
	res := a.do(http.MethodPost, "/metrics", "", nil, true)
	if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "GET" {
		t.Fatalf("POST /metrics: %d, Allow %q; want 405 and GET", res.StatusCode, res.Header.Get("Allow"))
	}
}
