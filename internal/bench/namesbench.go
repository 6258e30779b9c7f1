package bench

import (
	"context"
	"errors"
	"time"
)

// RunNames runs lockctl bench's names workload (1,000 names × 4 workers
// over 4 clients, 1 ms holds) against url: for a backend package's
// benchmark, to profile many names at once. backend names the result, as
// in lockctl bench.
func RunNames(ctx context.Context, backend, url string) (*Scale, error) {
	open, opts, err := URLOpener(ctx, url)
	if err != nil {
		return nil, err
	}
	cfg := Defaults
	cfg.Only, cfg.Names, cfg.NameWorkers, cfg.NameClients = []string{"names"}, 1000, 4, 4
	cfg.Duration = 1500 * time.Millisecond
	s := Run(ctx, backend, open, opts, cfg).Names
	if s == nil {
		return nil, errors.New("bench: the names workload gave no result")
	}
	return s, nil
}

// Report is what a benchmark reports of s, through report (testing.B's
// ReportMetric).
func (s *Scale) Report(report func(float64, string)) {
	report(s.AcquisitionsSec, "acq/s")
	report(float64(s.CPUPerAcq.Microseconds()), "cpu-us/acq")
	report(s.Tries, "tries/acq")
	report(float64(s.WaitP99.Milliseconds()), "p99-ms")
}
