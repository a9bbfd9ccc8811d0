package server

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"

	"warren.dev/agent/internal/fsys"
	"warren.dev/agent/internal/metrics"
)

// serveMetrics answers GET /metrics[?start=&end=]: the kept samples whose
// time is within start and end (unix seconds, inclusive), oldest first. A
// start after end is a range nothing is in: [], not an error.
func serveMetrics(sampler *metrics.Sampler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", "GET")
			fsys.WriteHTTPError(w, http.StatusMethodNotAllowed, "%s /metrics: use GET", r.Method)
			return
		}
		if sampler == nil {
			fsys.WriteHTTPError(w, http.StatusNotFound, "GET /metrics: this agent keeps no metrics")
			return
		}
		start, ok := unixParam(w, r, "start", 0)
		if !ok {
			return
		}
		end, ok := unixParam(w, r, "end", math.MaxInt64)
		if !ok {
			return
		}
		samples, err := sampler.Samples(start, end)
		if err != nil {
			fsys.WriteHTTPError(w, http.StatusInternalServerError, "GET /metrics: no sample kept yet and taking one failed: %v", err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(samples)
	}
}

// unixParam reads an optional query parameter in unix seconds, answering 400
// when it is not one.
func unixParam(w http.ResponseWriter, r *http.Request, name string, absent int64) (int64, bool) {
	text := r.URL.Query().Get(name)
	if text == "" {
		return absent, true
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil || n < 0 {
		fsys.WriteHTTPError(w, http.StatusBadRequest, "GET /metrics: %s=%q: give a time in unix seconds (a whole number, 0 or more), or leave %s out", name, text, name)
		return 0, false
	}
	return n, true
}
