//go:build unix

package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// dur formats a latency with three significant digits.
func dur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.3gms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.3gs", d.Seconds())
	}
}

func rate(r float64) string {
	switch {
	case r >= 1e5:
		return fmt.Sprintf("%.0fk", r/1e3)
	case r >= 1e4:
		return fmt.Sprintf("%.1fk", r/1e3)
	default:
		return fmt.Sprintf("%.0f", r)
	}
}

// writeTable prints the results as one Markdown table.
func writeTable(w io.Writer, rep benchReport) {
	c := rep.Config
	fmt.Fprintf(w, "lockctl bench, %s, %s/%s, %d CPUs, %s, %v per timed workload, TTL %v; took %v\n",
		rep.Date.Format("2006-01-02 15:04 MST"), rep.Machine.OS, rep.Machine.Arch, rep.Machine.CPUs, rep.Machine.Go,
		c.Duration, c.TTL, rep.Took.Round(time.Second))
	fmt.Fprintf(w, "handoff: from a Release call to the next holder's Acquire returning; round trip: a refused TryAcquire, during the run;\n"+
		"wait: Acquire call to return; retake: handoffs to the worker that released\n\n")
	fmt.Fprintf(w, "| backend | acquire+release p50 | p99 | ops/s | %d parallel: ops/s | p50 | p99 | %d workers on %d clients: acq/s | handoff p50 | p99 | round trip | handoff/rtt | wait p99 | fairness max/min | retake | %d held: heap/lock | refreshes/s | refresh calls/s | goroutines |\n",
		c.Parallel, c.Workers, c.Clients, c.Held)
	fmt.Fprintln(w, "|---"+strings.Repeat("|--:", 18)+"|")
	for _, r := range rep.Results {
		cells := []string{r.Backend}
		if l := r.Uncontended; l != nil {
			cells = append(cells, dur(l.P50), dur(l.P99), rate(l.OpsPerSec))
		} else {
			cells = append(cells, "error", "", "")
		}
		if l := r.Parallel; l != nil {
			cells = append(cells, rate(l.OpsPerSec), dur(l.P50), dur(l.P99))
		} else {
			cells = append(cells, "error", "", "")
		}
		if k := r.Contended; k != nil {
			fair := "∞"
			if k.MinPer > 0 {
				fair = fmt.Sprintf("%.2f", k.Fairness)
			}
			perRTT := "-"
			if k.HandoffPerRoundTrip > 0 {
				perRTT = fmt.Sprintf("%.1f", k.HandoffPerRoundTrip)
			}
			cells = append(cells, rate(k.AcquisitionsSec), dur(k.HandoffP50), dur(k.HandoffP99), dur(k.RoundTrip), perRTT,
				dur(k.WaitP99), fair, fmt.Sprintf("%.0f%%", 100*k.Retake))
		} else {
			cells = append(cells, "error", "", "", "", "", "", "", "")
		}
		if h := r.Held; h != nil {
			held := fmt.Sprintf("%.0f B", h.BytesPerLock)
			if h.Errors > 0 || h.Lost > 0 {
				held += fmt.Sprintf(" (%d not acquired, %d lost)", h.Errors, h.Lost)
			}
			refreshes, calls := rate(h.RefreshesSec), rate(h.CallsSec)
			if h.Session {
				refreshes, calls = "session", "session"
			} else if h.Batch {
				calls += " (batched)"
			}
			cells = append(cells, held, refreshes, calls, fmt.Sprintf("%+d", h.Goroutines))
		} else {
			cells = append(cells, "error", "", "", "")
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

// writeSemaphoreTable prints the semaphore workload as a second table.
func writeSemaphoreTable(w io.Writer, rep benchReport) {
	c := rep.Config
	fmt.Fprintf(w, "\nsemaphore of %d, %d workers on %d clients; permit/lock: uncontended acquire+release p50 of a permit over a lock's, interleaved on one client\n\n",
		c.SemLimit, c.SemWorkers, c.Clients)
	fmt.Fprintln(w, "| backend | permits/s | wait p99 | most inside | permit p50 | lock p50 | permit/lock |")
	fmt.Fprintln(w, "|---"+strings.Repeat("|--:", 6)+"|")
	for _, r := range rep.Results {
		cells := []string{r.Backend}
		switch sm := r.Semaphore; {
		case sm == nil:
			cells = append(cells, "error", "", "", "", "", "")
		case sm.Unsupported:
			cells = append(cells, "unsupported", "", "", "", "", "")
		default:
			inside := fmt.Sprint(sm.MaxInside)
			if sm.Errors > 0 {
				inside += fmt.Sprintf(" (%d errors)", sm.Errors)
			}
			cells = append(cells, rate(sm.PermitsSec), dur(sm.WaitP99), inside, dur(sm.PermitP50), dur(sm.LockP50), fmt.Sprintf("%.2f", sm.Ratio))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}
