package metrics

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// cpuTimes is one reading of the machine-wide line of /proc/stat, in ticks.
type cpuTimes struct {
	idle  uint64 // idle + iowait: time no task was running on a CPU
	total uint64
}

// parseStat reads the "cpu" line of /proc/stat: user nice system idle iowait
// irq softirq steal [guest guest_nice].
func parseStat(text string) (cpuTimes, error) {
	for line := range strings.Lines(text) {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "cpu" {
			continue
		}
		if len(fields) < 5 {
			return cpuTimes{}, fmt.Errorf("/proc/stat: the cpu line has %d fields, want at least 4 counters", len(fields))
		}
		// guest and guest_nice are already counted in user and nice: adding
		// them would count that time twice.
		counters := fields[1:min(len(fields), 9)]
		var t cpuTimes
		for i, f := range counters {
			n, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return cpuTimes{}, fmt.Errorf("/proc/stat: cpu counter %d: %w", i+1, err)
			}
			t.total += n
			if i == 3 || i == 4 { // idle, iowait
				t.idle += n
			}
		}
		return t, nil
	}
	return cpuTimes{}, fmt.Errorf("/proc/stat: no cpu line")
}

// cpuUsedPct is the share of CPU time spent busy between two readings, in
// percent rounded to two decimals. Without time between them (or with
// counters that went backwards) there is nothing to measure: 0.
func cpuUsedPct(prev, cur cpuTimes) float64 {
	if cur.total <= prev.total || cur.idle < prev.idle {
		return 0
	}
	idle := float64(cur.idle - prev.idle)
	total := float64(cur.total - prev.total)
	pct := 100 * (1 - idle/total)
	return math.Round(max(0, min(100, pct))*100) / 100
}

// memory is what a sample takes from /proc/meminfo, in bytes.
type memory struct {
	total, used, cache uint64
}

// parseMeminfo reads MemTotal, MemAvailable and Cached from /proc/meminfo.
// Used memory is what is not available: page cache the kernel can drop does
// not count, as free(1) shows it.
func parseMeminfo(text string) (memory, error) {
	values := map[string]uint64{}
	for line := range strings.Lines(text) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch name {
		case "MemTotal", "MemAvailable", "Cached":
		default:
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return memory{}, fmt.Errorf("/proc/meminfo: %s has no value", name)
		}
		n, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("/proc/meminfo: %s: %w", name, err)
		}
		if len(fields) > 1 && fields[1] == "kB" {
			n *= 1024
		}
		values[name] = n
	}
	for _, name := range []string{"MemTotal", "MemAvailable"} {
		if _, ok := values[name]; !ok {
			return memory{}, fmt.Errorf("/proc/meminfo: no %s line", name)
		}
	}
	total, available := values["MemTotal"], values["MemAvailable"]
	return memory{total: total, used: total - min(available, total), cache: values["Cached"]}, nil
}
