package metrics

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

const statText = `cpu  100 5 50 800 40 3 2 0 7 1
cpu0 50 2 25 400 20 1 1 0 7 1
intr 12345
ctxt 678
`

func TestParseStatCountsIowaitAsIdleAndGuestOnce(t *testing.T) {
	got, err := parseStat(statText)
	if err != nil {
		t.Fatal(err)
	}
	// guest (7) and guest_nice (1) are inside user and nice already.
	want := cpuTimes{idle: 800 + 40, total: 100 + 5 + 50 + 800 + 40 + 3 + 2 + 0}
	if got != want {
		t.Fatalf("parseStat = %+v, want %+v", got, want)
	}
	// An old kernel's four counters are enough.
	got, err = parseStat("cpu 10 0 10 80\n")
	if err != nil || got != (cpuTimes{idle: 80, total: 100}) {
		t.Fatalf("four counters: %+v, %v", got, err)
	}
	for _, bad := range []string{"", "intr 1\n", "cpu 1 2\n", "cpu 1 x 3 4\n"} {
		if _, err := parseStat(bad); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
}

func TestCPUUsedPct(t *testing.T) {
	for _, c := range []struct {
		prev, cur cpuTimes
		want      float64
	}{
		{cpuTimes{idle: 100, total: 200}, cpuTimes{idle: 175, total: 300}, 25},
		{cpuTimes{idle: 0, total: 0}, cpuTimes{idle: 2, total: 3}, 33.33}, // rounded to two decimals
		{cpuTimes{idle: 0, total: 0}, cpuTimes{idle: 1, total: 3}, 66.67},
		{cpuTimes{idle: 10, total: 10}, cpuTimes{idle: 10, total: 20}, 100},
		{cpuTimes{idle: 10, total: 10}, cpuTimes{idle: 20, total: 20}, 0},
		{cpuTimes{idle: 10, total: 10}, cpuTimes{idle: 10, total: 10}, 0}, // no time passed
		{cpuTimes{idle: 50, total: 90}, cpuTimes{idle: 10, total: 20}, 0}, // counters went back
	} {
		if got := cpuUsedPct(c.prev, c.cur); got != c.want {
			t.Errorf("cpuUsedPct(%+v, %+v) = %v, want %v", c.prev, c.cur, got, c.want)
		}
	}
}

const meminfoText = `MemTotal:        8000000 kB
MemFree:         1000000 kB
MemAvailable:    6000000 kB
Buffers:          100000 kB
Cached:          3000000 kB
SwapCached:            0 kB
HugePages_Total:       0
`

func TestParseMeminfoInBytes(t *testing.T) {
	got, err := parseMeminfo(meminfoText)
	if err != nil {
		t.Fatal(err)
	}
	want := memory{total: 8000000 * 1024, used: 2000000 * 1024, cache: 3000000 * 1024}
	if got != want {
		t.Fatalf("parseMeminfo = %+v, want %+v", got, want)
	}
	if _, err := parseMeminfo("MemTotal: 100 kB\nCached: 5 kB\n"); err == nil || !strings.Contains(err.Error(), "MemAvailable") {
		t.Fatalf("no MemAvailable: %v", err)
	}
	if _, err := parseMeminfo("MemTotal: lots kB\nMemAvailable: 1 kB\n"); err == nil {
		t.Fatal("a value that is no number: no error")
	}
	// More available than total (never seen, but never a huge unsigned "used").
	got, err = parseMeminfo("MemTotal: 1 kB\nMemAvailable: 2 kB\n")
	if err != nil || got.used != 0 || got.cache != 0 {
		t.Fatalf("available > total: %+v, %v", got, err)
	}
}

func TestRingKeepsTheLatestOldestFirstAndNeverGrows(t *testing.T) {
	r := newRing(3)
	if r.len() != 0 || len(r.all()) != 0 {
		t.Fatal("a new ring is not empty")
	}
	for ts := int64(1); ts <= 7; ts++ {
		r.add(Sample{TS: ts})
		if len(r.buf) != 3 || cap(r.buf) != 3 {
			t.Fatalf("after %d samples the ring holds %d (cap %d)", ts, len(r.buf), cap(r.buf))
		}
		if ts == 2 && !sameTS(r.all(), 1, 2) {
			t.Fatalf("two samples: %v", r.all())
		}
	}
	if r.len() != 3 || !sameTS(r.all(), 5, 6, 7) {
		t.Fatalf("after 7 samples: %v, want 5 6 7", r.all())
	}
}

func TestWithinIsInclusive(t *testing.T) {
	s := []Sample{{TS: 10}, {TS: 15}, {TS: 20}, {TS: 25}}
	for _, c := range []struct {
		start, end int64
		want       []int64
	}{
		{0, 1 << 62, []int64{10, 15, 20, 25}},
		{15, 20, []int64{15, 20}},
		{16, 19, nil},
		{25, 25, []int64{25}},
		{30, 20, nil},
	} {
		got := within(s, c.start, c.end)
		if got == nil || !sameTS(got, c.want...) {
			t.Errorf("within(%d, %d) = %v, want %v", c.start, c.end, got, c.want)
		}
	}
}

// fakeProc writes /proc-like stat and meminfo into a directory.
func fakeProc(t *testing.T, stat, meminfo string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range map[string]string{"stat": stat, "meminfo": meminfo} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestSamplerComparesWithTheReadingTakenAtStart(t *testing.T) {
	dir := fakeProc(t, "cpu 100 0 0 100 0\n", meminfoText)
	s := New(Config{ProcDir: dir, DiskPath: dir, Now: func() time.Time { return time.Unix(1000, 0) }})
	// Since New: 100 more ticks, 25 of them idle.
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte("cpu 175 0 0 125 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := s.Samples(0, 1<<62) // none kept yet: one is taken
	if err != nil || len(got) != 1 {
		t.Fatalf("Samples = %v, %v; want one sample", got, err)
	}
	g := got[0]
	if g.TS != 1000 || g.CPUUsedPct != 75 || g.CPUCount != runtime.NumCPU() ||
		g.MemTotal != 8000000*1024 || g.MemUsed != 2000000*1024 || g.MemCache != 3000000*1024 {
		t.Fatalf("sample = %+v", g)
	}
	if g.DiskTotal == 0 || g.DiskUsed > g.DiskTotal {
		t.Fatalf("disk: used %d of %d", g.DiskUsed, g.DiskTotal)
	}
	// Nothing new in /proc/stat since: 0 %.
	if err := s.Sample(); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Samples(0, 1<<62); len(got) != 2 || got[1].CPUUsedPct != 0 {
		t.Fatalf("second sample: %+v", got)
	}
}

func TestAFailingReadingSkipsTheSampleAndIsLoggedOnce(t *testing.T) {
	dir := fakeProc(t, statText, "nothing useful\n")
	var logs bytes.Buffer
	s := New(Config{ProcDir: dir, DiskPath: dir, Log: slog.New(slog.NewJSONHandler(&logs, nil))})
	for range 3 {
		if err := s.Sample(); err == nil || !strings.Contains(err.Error(), "memory") {
			t.Fatalf("Sample with a bad meminfo: %v", err)
		}
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 {
		t.Fatalf("logged %d lines, want 1:\n%s", n, logs.String())
	}
	if got, err := s.Samples(0, 1<<62); err == nil || len(got) != 0 || got == nil {
		t.Fatalf("Samples = %#v, %v; want [] and the error", got, err)
	}
	// A missing disk is the same: skipped, not a crash.
	s = New(Config{ProcDir: fakeProc(t, statText, meminfoText), DiskPath: filepath.Join(dir, "gone")})
	if err := s.Sample(); err == nil || !strings.Contains(err.Error(), "disk") {
		t.Fatalf("Sample with no disk: %v", err)
	}
}

func TestRunSamplesAtItsIntervalIntoAFixedRingUntilStopped(t *testing.T) {
	dir := fakeProc(t, statText, meminfoText)
	s := New(Config{Interval: time.Millisecond, Keep: 4, ProcDir: dir, DiskPath: dir})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		n, full := s.ring.len(), s.ring.full
		s.mu.Unlock()
		if full {
			if n != 4 {
				t.Fatalf("a full ring holds %d", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Run took %d samples in 5 s", n)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop with its context")
	}
}

func TestTheDefaultKeepsAnHourAtFiveSeconds(t *testing.T) {
	s := New(Config{ProcDir: t.TempDir()})
	if s.cfg.Interval != 5*time.Second || len(s.ring.buf) != 720 {
		t.Fatalf("interval %v, ring of %d", s.cfg.Interval, len(s.ring.buf))
	}
}

func sameTS(samples []Sample, want ...int64) bool {
	if len(samples) != len(want) {
		return false
	}
	for i, s := range samples {
		if s.TS != want[i] {
			return false
		}
	}
	return true
}
