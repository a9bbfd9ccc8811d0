// Package metrics samples the sandbox's CPU, memory and disk use at a fixed
// interval, as seen from inside it, and keeps the last hour of samples in a
// ring of fixed size for the agent's GET /metrics.
package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// Sample is one reading, with envd's field names. Sizes are in bytes.
type Sample struct {
	TS         int64   `json:"ts"` // unix seconds
	CPUCount   int     `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_pct"` // since the previous sample, two decimals
	MemTotal   uint64  `json:"mem_total"`
	MemUsed    uint64  `json:"mem_used"`
	MemCache   uint64  `json:"mem_cache"`
	DiskUsed   uint64  `json:"disk_used"`
	DiskTotal  uint64  `json:"disk_total"`
}

// Config sets a Sampler up; the zero value is what the agent runs with.
type Config struct {
	Interval time.Duration // between samples; 0: 5 s
	Keep     int           // samples kept; 0: an hour's worth at Interval
	ProcDir  string        // where stat and meminfo are read; "": /proc
	DiskPath string        // the filesystem measured; "": /workspace when it is a directory, else /
	Now      func() time.Time
	Log      *slog.Logger
}

// DefaultDiskPath is the filesystem a sandbox's disk figures describe: /workspace
// when it is a directory, else /.
func DefaultDiskPath() string {
	if fi, err := os.Stat("/workspace"); err == nil && fi.IsDir() {
		return "/workspace"
	}
	return "/"
}

// Sampler takes samples and keeps the latest of them.
type Sampler struct {
	cfg Config

	sampling sync.Mutex // one reading at a time, so CPU % compares consecutive ones
	prevCPU  cpuTimes
	havePrev bool
	logged   map[string]bool // readings whose failure was logged already

	mu   sync.Mutex
	ring ring
}

// New returns a Sampler that has taken its first CPU reading, so its first
// sample has something to compare with, and no sample yet.
func New(cfg Config) *Sampler {
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.Keep <= 0 {
		cfg.Keep = max(1, int(time.Hour/cfg.Interval))
	}
	if cfg.ProcDir == "" {
		cfg.ProcDir = "/proc"
	}
	if cfg.DiskPath == "" {
		cfg.DiskPath = DefaultDiskPath()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Sampler{cfg: cfg, logged: map[string]bool{}, ring: newRing(cfg.Keep)}
	if t, err := s.readCPU(); err == nil {
		s.prevCPU, s.havePrev = t, true
	}
	return s
}

// Run samples every Interval until ctx ends.
func (s *Sampler) Run(ctx context.Context) {
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			_ = s.Sample()
		}
	}
}

// MeasureDisk makes the samples from now on describe the filesystem at path (an
// agent in a pool pod learns at its claim where its workspace is).
func (s *Sampler) MeasureDisk(path string) {
	s.sampling.Lock()
	defer s.sampling.Unlock()
	s.cfg.DiskPath = path
}

// Sample takes one sample now and keeps it. A reading that fails skips the
// sample: the error is returned, and logged the first time that reading fails.
func (s *Sampler) Sample() error {
	s.sampling.Lock()
	defer s.sampling.Unlock()
	sample, err := s.take()
	if err != nil {
		if !s.logged[err.what] {
			s.logged[err.what] = true
			s.cfg.Log.Warn("metrics sample skipped (logged once per reading)", "reading", err.what, "error", err.err.Error())
		}
		return err
	}
	s.mu.Lock()
	s.ring.add(sample)
	s.mu.Unlock()
	return nil
}

// Samples returns the kept samples with start <= ts <= end, oldest first.
// With none kept yet it takes one first, so a caller right after the agent
// starts still gets an answer; the error is that sample's, when it fails.
func (s *Sampler) Samples(start, end int64) ([]Sample, error) {
	s.mu.Lock()
	empty := s.ring.len() == 0
	s.mu.Unlock()
	if empty {
		if err := s.Sample(); err != nil {
			return []Sample{}, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return within(s.ring.all(), start, end), nil
}

// readError names which reading failed, so each is logged once.
type readError struct {
	what string
	err  error
}

func (e *readError) Error() string { return fmt.Sprintf("reading %s: %v", e.what, e.err) }
func (e *readError) Unwrap() error { return e.err }

func (s *Sampler) take() (Sample, *readError) {
	cpu, err := s.readCPU()
	if err != nil {
		return Sample{}, &readError{"cpu", err}
	}
	text, err := os.ReadFile(filepath.Join(s.cfg.ProcDir, "meminfo"))
	if err != nil {
		return Sample{}, &readError{"memory", err}
	}
	mem, err := parseMeminfo(string(text))
	if err != nil {
		return Sample{}, &readError{"memory", err}
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(s.cfg.DiskPath, &fs); err != nil {
		return Sample{}, &readError{"disk", fmt.Errorf("statfs %s: %w", s.cfg.DiskPath, err)}
	}
	pct := 0.0
	if s.havePrev {
		pct = cpuUsedPct(s.prevCPU, cpu)
	}
	s.prevCPU, s.havePrev = cpu, true
	bsize := uint64(fs.Bsize)
	return Sample{
		TS:         s.cfg.Now().Unix(),
		CPUCount:   runtime.NumCPU(),
		CPUUsedPct: pct,
		MemTotal:   mem.total,
		MemUsed:    mem.used,
		MemCache:   mem.cache,
		DiskUsed:   (fs.Blocks - fs.Bfree) * bsize,
		DiskTotal:  fs.Blocks * bsize,
	}, nil
}

func (s *Sampler) readCPU() (cpuTimes, error) {
	text, err := os.ReadFile(filepath.Join(s.cfg.ProcDir, "stat"))
	if err != nil {
		return cpuTimes{}, err
	}
	return parseStat(string(text))
}

// ring holds the latest len(buf) samples; it never grows.
type ring struct {
	buf  []Sample
	next int // where the next sample goes
	full bool
}

func newRing(size int) ring { return ring{buf: make([]Sample, size)} }

func (r *ring) add(s Sample) {
	r.buf[r.next] = s
	r.next = (r.next + 1) % len(r.buf)
	if r.next == 0 {
		r.full = true
	}
}

func (r *ring) len() int {
	if r.full {
		return len(r.buf)
	}
	return r.next
}

// all returns a copy of the samples, oldest first.
func (r *ring) all() []Sample {
	if !r.full {
		return append([]Sample(nil), r.buf[:r.next]...)
	}
	return append(append([]Sample(nil), r.buf[r.next:]...), r.buf[:r.next]...)
}

// within keeps the samples with start <= ts <= end, in their order; never nil,
// so an empty answer is [] in JSON.
func within(samples []Sample, start, end int64) []Sample {
	out := []Sample{}
	for _, s := range samples {
		if s.TS >= start && s.TS <= end {
			out = append(out, s)
		}
	}
	return out
}
